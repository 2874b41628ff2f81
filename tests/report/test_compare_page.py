"""A comparison as a page, Markdown and CSV: one row per system (with the cost per accelerator
fed when priced), the winner sentence first, each system under test side by side."""

from __future__ import annotations

import json
import re

from feedbench.report.compare import Comparison, SystemRow, winner
from feedbench.report.csv_export import to_csv
from feedbench.report.doc_compare import COMPARE_CSV, compare_document
from feedbench.report.html import page
from feedbench.report.markdown import to_markdown
from tests.report.pages import flat, md_table, read_csv, read_page
from tests.report.test_compare import _col


def test_a_comparison_as_a_page_markdown_and_csv(cli, scans, tmp_path):
    cmp = tmp_path / "c.json"
    r = cli("compare", str(scans["local"]), str(scans["slow"]), "-L", "nvme", "-L", "filer",
            "--cost", "filer=30000", "--json", str(cmp))  # fmt: skip
    assert r.code == 0, r.out + r.err
    paths = {ext: tmp_path / f"c.{ext}" for ext in ("html", "md", "csv")}
    again = cli("report", str(cmp), *(a for e, p in paths.items() for a in (f"--{e}", str(p))))
    assert again.code == 0, again.err
    ranking = next(ln for ln in r.out.splitlines() if ln.startswith("at 1 consumer"))
    assert flat(ranking) in flat(again.out)  # the terminal shows it again
    doc = json.loads(cmp.read_text())
    html = paths["html"].read_text()
    shown = read_page(html)
    # one disk, read slowed on purpose in one scan, no step: the question is of a setting and
    # of samples/s, and the answer ranks by samples/s, a ratio in words
    assert "<h1>Which setting delivers more samples/s? nvme vs filer</h1>" in html
    assert re.fullmatch(
        r"at \d consumers?, samples/s: nvme [\d,]+ > filer [\d,]+; nvme "
        r"delivers [\d.]+× more than filer \(.*\)",
        shown.by_class["headline"][0],
    )
    assert shown.sections == ["answer", "summary", "projection", "charts", "system", "details",
                              "method", "command"]  # fmt: skip
    assert [v for tag, _, v in shown.urls if tag == "img"][0].startswith("data:image/png;base64,")
    # a line per scan: 1 and 2 consumers are too few for plan to project
    assert [ln.split(": no projection: cold: ")[0] for ln in shown.by_class["projected"]] == [
        "nvme", "filer"]  # fmt: skip
    head, *rows = shown.tables[0]
    assert head[0] == "system" and "cost per accelerator fed" in head and head[-1] == "sizing"
    assert [(row[0], row[head.index("cost")]) for row in rows] == [
        ("nvme", "—"),
        ("filer", "$30,000"),
    ]
    assert all(row[-1] == "not valid for sizing" for row in rows)  # 24 images, 2 repeats
    # each system under test in a column of one table; the slowed one flagged above it
    facts = next(t for t in shown.tables if t[0][1:] == ["nvme", "filer"])
    assert ["described as", "—", "a slow filer, $30k"] in facts
    assert "filer: Slowed on purpose: 20 ms" in flat(shown.text_of["system"])
    header, csv_rows = read_csv(paths["csv"].read_text())
    assert header == [h for h, _ in COMPARE_CSV]
    for row, col in zip(csv_rows, doc["columns"], strict=True):
        assert row["system"] == col["label"]
        assert float(row["samples/s mean"]) == col["system"]["samples_per_s"]
        assert float(row["read p99 latency (ms)"]) == col["system"]["read_p99_ms"]
        assert row["valid for sizing"] == "no" and row["not valid because"]
    assert csv_rows[1]["cost (USD)"] == "30000.0" and csv_rows[0]["cost (USD)"] == ""
    assert [r[0] for r in md_table(paths["md"].read_text(), "system")] == ["nvme", "filer"]


def _priced() -> Comparison:
    def col(label: str, fed: float, usd: float):
        row = SystemRow(
            consumers=4,
            accelerators_fed=fed,
            accelerators_fed_std=0.1,
            target_au=0.9,
            samples_per_s=fed * 4700,
            mb_per_s=fed * 500,
            files_per_s=fed * 4700,
            read_p99_ms=3.0,
            clients=1,
            valid_for_sizing=True,
            cost_usd=usd,
            usd_per_accelerator_fed=usd / fed,
        )
        return _col(label, {4: (fed * 4700, 10.0, 3)}, accelerator="h200", system=row,
                    accelerator_samples_per_s=4700.0)  # fmt: skip

    cols = [col("dear", 3.4, 68_000), col("cheap", 1.7, 17_000)]
    return Comparison(kind="compare", created_utc="2026-12-01T00:00:00+00:00",
                      command=["feedbench", "compare", "dear.json", "cheap.json"], config={},
                      pass_name="cold", columns=cols, counts=[4], common_counts=[4],
                      winner=winner(cols))  # fmt: skip


def test_the_winner_and_the_cost_per_accelerator_fed_lead_the_page():
    doc = compare_document(_priced(), "c.json")
    shown = read_page(page(doc, [], "c.json"))
    assert shown.by_class["headline"] == [
        "cheap costs least per h200 fed: $10,000 against $20,000 for dear, which costs 2.0× more "
        "(beyond the spread)"
    ]
    assert "Valid for sizing" in flat(shown.text_of["answer"])
    head, *rows = shown.tables[0]
    fed = head.index("accelerators fed")
    assert [(r[0], r[fed], r[head.index("cost per accelerator fed")]) for r in rows] == [
        ("dear", "3.4 ± 0.1", "$20,000"), ("cheap", "1.7 ± 0.1", "$10,000")]  # fmt: skip
    _, csv_rows = read_csv(to_csv(doc))
    assert [float(r["cost per accelerator fed (USD)"]) for r in csv_rows] == [20_000.0, 10_000.0]
    assert [float(r["accelerators fed at target AU"]) for r in csv_rows] == [3.4, 1.7]
    md = to_markdown(doc)
    assert md.splitlines()[4].startswith("**cheap costs least per h200 fed")
    assert "**Valid for sizing**" in md and "### dear" in md
