"""``feedbench report SCAN --csv``: every repeat's own numbers, then the point's mean row; each
read back (csv module) against the results file's per-repeat measurements."""

from __future__ import annotations

import json
import statistics

import pytest

from feedbench.report.csv_export import to_csv
from feedbench.report.doc_scan import scan_document
from feedbench.scan.results import load
from feedbench.scan.sweep import curve
from tests.report.pages import read_csv

MEASURED = ["samples/s", "MB/s (1 MB = 10^6 B)", "files/s", "read p99 latency (ms)",
            "AU mean (0-1)", "accelerators fed at target AU"]  # fmt: skip
SPREAD = ["repeats", "failed repeats", "samples/s std", "samples/s min", "samples/s max",
          "CV (std/mean)", "speedup vs 1 consumer (x)", "efficiency (0-1)"]  # fmt: skip


def _points(rows: list[dict], doc: dict):
    """Per curve point: the file's measurements in repeat order, the CSV rows of its repeats
    and its mean row (which comes last)."""
    for p in doc["curve"]:
        key = (p["consumers"], p["pass_name"])
        ms = sorted((m for m in doc["measurements"] if (m["consumers"], m["pass_name"]) == key),
                    key=lambda m: m["repeat"])  # fmt: skip
        *repeats, mean = [r for r in rows if (int(r["consumers"]), r["pass"]) == key]
        yield p, ms, repeats, mean


def _want(m: dict, steady: bool, target: float, appetite: float) -> dict[str, float]:
    """A repeat's numbers as the file holds them: the rates over the window its curve used;
    accelerators fed: by its AU, never more than its steady samples/s feed at the target."""
    rate = m["steady_samples_per_s"] if steady else m["samples_per_s"]
    mb = m["steady_mb_per_s"] if steady and m["steady_mb_per_s"] is not None else m["mb_per_s"]
    files = (m["steady_files_per_s"] if steady and m["steady_files_per_s"] is not None
             else m["files_per_s"])  # fmt: skip
    (read,) = [s for s in m["stages"] if s["name"] == "read"]
    n = m["consumers"]
    sizing_rate = m["steady_samples_per_s"] if m["steady_samples_per_s"] is not None else rate
    return {"samples/s": rate, "MB/s (1 MB = 10^6 B)": mb, "files/s": files,
            "read p99 latency (ms)": read["latency"]["p99_s"] * 1e3, "AU mean (0-1)": m["au_mean"],
            "AU worst consumer (0-1)": m["au_min"],
            "accelerators fed at target AU": min(n, n * m["au_mean"] / target,
                                                 sizing_rate / (target * appetite))}  # fmt: skip


def test_a_scan_csv_has_each_repeat_and_their_mean(cli, stepped_scan, tmp_path):
    path = tmp_path / "s.csv"
    r = cli("report", str(stepped_scan), "--csv", str(path))
    assert r.code == 0, r.out + r.err
    doc = json.loads(stepped_scan.read_text())
    _, rows = read_csv(path.read_text())
    assert len(rows) == len(doc["measurements"]) + len(doc["curve"])
    target = doc["sizing"]["target_au"]
    appetite = doc["accelerator"]["samples_per_s"]
    for p, ms, repeats, mean in _points(rows, doc):
        steady = p["rate_basis"] == "steady"
        assert [r["repeat"] for r in repeats] == [str(m["repeat"]) for m in ms] == ["1", "2"]
        assert mean["repeat"] == "mean" and int(mean["repeats"]) == len(ms)
        for row, m in zip(repeats, ms, strict=True):
            assert int(row["loader workers per consumer"]) == m["workers"]
            want = _want(m, steady, target, appetite)
            assert {k: float(row[k]) for k in want} == pytest.approx(want, rel=1e-12)
            assert [row[k] for k in SPREAD] == [""] * len(SPREAD)  # a spread of one: none
            assert row["left out of the mean (why)"] == ""
        # the mean row: the file's curve point, and the mean of the repeat rows above it
        assert float(mean["samples/s"]) == p["samples_per_s_mean"]
        assert float(mean["AU mean (0-1)"]) == p["au_mean"]
        judged = p["consumers"] not in {d["consumers"] for d in doc["sizing"]["not_judged"]}
        # a point not judged gives no accelerators fed, and says why (2 consumers: 3 batches)
        assert judged == (p["consumers"] == 1) and bool(mean["not judged (why)"]) != judged
        for k in MEASURED:
            if k == "accelerators fed at target AU" and not judged:
                assert mean[k] == ""
                continue
            assert float(mean[k]) == pytest.approx(
                statistics.fmean(float(r[k]) for r in repeats), rel=1e-12
            ), k
        worst = min(float(r["AU worst consumer (0-1)"]) for r in repeats)
        assert float(mean["AU worst consumer (0-1)"]) == worst


def test_a_failed_repeat_keeps_its_row_with_why_and_no_numbers(stepped_scan):
    """A repeat that failed is no rate: its row says why, and the mean is the other repeats'
    (the results changed in memory, the curve made again from them as a scan makes it)."""
    result = load(stepped_scan)
    m = next(m for m in result.measurements if m.consumers == 2 and m.repeat == 1)
    m.failed = "storage stalled"
    result.curve = curve(result.measurements)
    _, rows = read_csv(to_csv(scan_document(result, "x.json")))
    at2 = [r for r in rows if r["consumers"] == "2"]
    assert [r["repeat"] for r in at2] == ["1", "2", "mean"]
    failed, kept, mean = at2
    assert failed["left out of the mean (why)"] == "storage stalled"
    assert [failed[k] for k in MEASURED] == [""] * len(MEASURED)
    assert (mean["repeats"], mean["failed repeats"]) == ("1", "1")
    assert mean["not judged (why)"] and mean["accelerators fed at target AU"] == ""
    for k in MEASURED[:-1]:  # all but accelerators fed: 2 consumers are not judged
        assert float(mean[k]) == pytest.approx(float(kept[k]), rel=1e-12), k
