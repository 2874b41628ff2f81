"""feedbench report: any results file shown again, on the console and as an HTML page, Markdown
and CSV; each read back (HTML parser, csv module) against the results file's own numbers."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys

import pytest

from feedbench.report.doc_scan import SCAN_CSV
from feedbench.report.fmt import fmt_rate
from feedbench.report.sut import fact_groups, slowed_flag
from feedbench.scan.results import load
from tests.report.pages import flat, md_table, read_csv, read_page

SECTIONS = ["answer", "summary", "projection", "charts", "system", "details", "method", "command"]


def _outputs(cli, results, tmp_path, stem: str) -> tuple[str, str, str, str]:
    """``feedbench report RESULTS --html --md --csv``: (terminal, html, md, csv)."""
    paths = {ext: tmp_path / f"{stem}.{ext}" for ext in ("html", "md", "csv")}
    r = cli("report", str(results), *(a for ext, p in paths.items() for a in (f"--{ext}", str(p))))
    assert r.code == 0, r.out + r.err
    for ext, p in paths.items():
        assert f"{ext}: {p}" in flat(r.out)
    return r.out, *(paths[ext].read_text() for ext in ("html", "md", "csv"))


def _no_network(page) -> None:
    """Nothing the page loads comes from elsewhere: no scripts, no stylesheet links, every
    image a data URI (a URL may stand in the text, as the command's or the endpoint's)."""
    assert not page.tags & {"script", "link", "iframe", "object", "embed"}
    assert not [u for u in page.urls if re.match(r"(https?:)?//", u[2])], page.urls
    imgs = [v for tag, _, v in page.urls if tag == "img"]
    assert imgs and all(v.startswith("data:image/png;base64,") for v in imgs)


def test_a_scan_as_a_page_markdown_and_csv_from_its_results(cli, scans, tmp_path):
    """The slowed scan: not valid for sizing, described, 20 ms added per read; every output
    says so, and its numbers are the results file's."""
    doc = json.loads(scans["slow"].read_text())
    out, text, md, csv_text = _outputs(cli, scans["slow"], tmp_path, "slow")
    assert flat(doc["verdict"]["text"]) in flat(out)  # the terminal shows it as the scan did
    page = read_page(text)
    assert page.sections == SECTIONS  # the answer first, the command last
    _no_network(page)
    assert len([u for u in page.urls if u[0] == "img"]) == 2  # scaling, timeline (no step: no AU)
    assert "@media print" in text
    # the answer: what it delivers, the verdict, and "not valid for sizing" with every reason
    # (the best judged point: one whose window held enough batches)
    unjudged = {d["consumers"] for d in doc["sizing"]["not_judged"]}
    assert 1 not in unjudged
    best = max((p for p in doc["curve"] if p["consumers"] not in unjudged),
               key=lambda p: p["samples_per_s_mean"])  # fmt: skip
    assert page.by_class["headline"] == [
        f"Delivers {fmt_rate(best['samples_per_s_mean'])} samples/s "
        f"({best['mb_per_s_mean']:,.1f} MB/s) at {best['consumers']} consumer"
        f"{'s' if best['consumers'] != 1 else ''}, cold pass (first epoch) (no accelerator "
        "emulated: add --profile or --step-time for accelerators fed)."
    ]
    answer = flat(page.text_of["answer"])
    assert flat(doc["verdict"]["text"]) in answer and "Not valid for sizing" in answer
    assert all(flat(reason) in answer for reason in doc["sizing"]["broken"])
    assert "Slowed on purpose: 20 ms added to every file read" in answer
    # the summary: one row per curve point, samples/s as mean ± std, read p99 in ms
    head, *rows = page.tables[0]
    assert head[:3] == ["consumers", "pass", "samples/s (mean ± std)"] and "read p99" in head
    assert [r[0] for r in rows] == [str(p["consumers"]) for p in doc["curve"]]
    for row, p in zip(rows, doc["curve"], strict=True):
        spread = f" ± {fmt_rate(p['samples_per_s_std'])}" if p["repeats"] > 1 else ""
        assert row[2] == fmt_rate(p["samples_per_s_mean"]) + spread
        p99, unit = row[head.index("read p99")].split()
        assert float(p99) * {"ms": 1e-3, "s": 1.0}[unit] > 0.02  # 20 ms added to every read
    # the system under test, the method and the exact command
    system = flat(page.text_of["system"])
    for fact in ("described as a slow filer, $30k", f"filesystem {doc['system']['fstype']}",
                 f"mount options {doc['system']['mount_options']}", "Slowed on purpose",
                 f"{doc['host']['cpu_count']} cores"):  # fmt: skip
        assert fact in system, fact
    # one description of the system under test (report.sut): the page shows every fact, the
    # terminal every fact it does not say elsewhere (the cache caveat is among its warnings)
    groups = fact_groups(load(scans["slow"]))
    assert all(flat(f"{what} {value}") in system for g in groups for what, value in g.facts)
    on_console = [f for g in groups if g.console for f in g.facts]
    assert on_console and all(flat(f"{w}: {v}") in flat(out) for w, v in on_console)
    assert flat(slowed_flag(load(scans["slow"]))) in flat(out)
    assert flat(page.text_of["command"]).startswith(f"Command {flat(shlex.join(doc['command']))}")
    _check_markdown(md, doc)
    _check_csv(csv_text, doc)


def _check_markdown(md: str, doc: dict) -> None:
    assert md.startswith(f"# Can {doc['dataset']['path']} keep the accelerators fed?")
    assert "**Not valid for sizing**" in md and "> **Slowed on purpose: 20 ms" in md
    rows = md_table(md, "consumers")
    assert [(r[0], r[1]) for r in rows] == [(str(p["consumers"]), p["pass_name"])
                                            for p in doc["curve"]]  # fmt: skip
    assert "- **described as**: a slow filer, $30k" in md
    assert f"```\n{shlex.join(doc['command'])}\n```" in md


def _check_csv(text: str, doc: dict) -> None:
    header, rows = read_csv(text)
    means = [r for r in rows if r["repeat"] == "mean"]  # every repeat's row: tests/report/test_csv
    assert header == [h for h, _ in SCAN_CSV] and len(means) == len(doc["curve"])
    assert len(rows) == len(means) + len(doc["measurements"])
    for row, p in zip(means, doc["curve"], strict=True):
        assert int(row["consumers"]) == p["consumers"] and row["pass"] == p["pass_name"]
        assert float(row["samples/s"]) == p["samples_per_s_mean"]  # as the file holds it
        assert float(row["samples/s std"]) == p["samples_per_s_std"]
        assert float(row["MB/s (1 MB = 10^6 B)"]) == p["mb_per_s_mean"]
        assert float(row["files/s"]) == p["files_per_s_mean"]
        assert int(row["repeats"]) == p["repeats"]
        p99 = [s["latency"]["p99_s"] * 1e3 for m in doc["measurements"]
               if m["consumers"] == p["consumers"] for s in m["stages"]
               if s["name"] == "read" and s["latency"]]  # fmt: skip
        assert float(row["read p99 latency (ms)"]) == pytest.approx(statistics.fmean(p99))
        assert row["AU mean (0-1)"] == row["accelerators fed at target AU"] == ""  # no step


def test_the_answer_is_the_accelerators_fed_and_whether_it_may_size(scan_json):
    """With an emulated accelerator the headline is how many it feeds (a fraction, ± spread);
    a run that follows the rules says "valid for sizing" (results changed in memory: the
    page renders whatever the file holds)."""
    from feedbench.report.doc_scan import scan_document
    from feedbench.report.html import page

    result = load(scan_json)
    result.accelerator = {"kind": "profile", "name": "resnet50-h200", "samples_per_s": 4700.0,
                          "step_s": 0.0545, "batch_size": 256}  # fmt: skip
    z = result.sizing
    z.accelerators_fed, z.accelerators_fed_std, z.at_consumers, z.target_au = 3.4, 0.2, 2, 0.9
    z.valid, z.broken = True, []
    doc = scan_document(result, "x.json")
    want = (
        "Feeds 3.4 ± 0.2 × resnet50-h200 (4,700 samples/s each) at AU ≥ 90% (best at 2 consumers)."
    )
    assert doc.answer[0] == want and doc.valid is True and doc.broken == []
    shown = read_page(page(doc, [], "x.json"))
    assert shown.by_class["headline"] == [want]
    assert shown.by_class["validity"][0].startswith("Valid for sizing")
    assert "answer valid" in page(doc, [], "x.json")  # the green edge, not the red one


def test_a_verify_result_is_shown_again_and_as_csv(cli, verify_run, tmp_path):
    out, first = verify_run  # a real CPU verify of baseline, shared with the prediction test
    again, text, md, csv_text = _outputs(cli, out, tmp_path, "v")
    line = next(ln for ln in first.splitlines() if ln.startswith("baseline:"))
    assert flat(line) in flat(again)  # the same verdict, from the file
    doc = json.loads(out.read_text())
    page = read_page(text)
    _no_network(page)
    assert page.sections[:2] == ["answer", "summary"] and page.sections[-1] == "command"
    _, rows = read_csv(csv_text)
    assert [(r["loader"], int(r["ranks"])) for r in rows] == [("baseline", 1)]
    assert float(rows[0]["images/s"]) == doc["runs"][0]["images_per_s"]
    steal = doc["runs"][0]["steal_cores_mean"]  # this VM's, read over the run's window (Linux)
    assert rows[0]["hypervisor steal (cores)"] == ("" if steal is None else str(steal))
    assert md_table(md, "loader")[0][0] == "baseline"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, r"no such results file"),
        ("{not json", r"is not a feedbench results file"),
        ('{"schema_version": 2, "kind": "recipe"}', r"holds 'recipe' results: report reads scan"),
        ('{"kind": "scan"}', r"no schema_version"),
    ],
)
def test_bad_files_are_one_line_and_exit_2(cli, tmp_path, content, message):
    path = tmp_path / "x.json"
    if content is not None:
        path.write_text(content)
    r = cli("report", str(path))
    assert r.code == 2, r.out + r.err
    assert re.search(r"^error: ", r.err) and re.search(message, flat(r.err)), r.err
    assert "Traceback" not in r.err


def test_an_output_that_cannot_be_written_is_one_line(cli, scan_json, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = cli("report", str(scan_json), "--csv", str(blocker / "x.csv"))
    # exit 4, "not all written" (docs/failures.md): the results file was read, a page was not
    assert r.code == 4 and re.search(r"^error: cannot write .*x\.csv", r.err), r.err
    assert "Traceback" not in r.err


BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
POPPLER = shutil.which("pdftotext") and shutil.which("pdfimages")


@pytest.mark.slow
@pytest.mark.skipif(
    not (BROWSER and POPPLER),
    reason="needs a browser and PDF tools: apt-get install chromium poppler-utils",
)
def test_a_browser_prints_the_page_with_its_answer_table_and_charts(cli, scans, tmp_path):
    """Headless Chromium prints the page (print styles applied): the answer, the summary table
    and the system are in the PDF's text, and the charts are images in it."""
    html, pdf = tmp_path / "slow.html", tmp_path / "slow.pdf"
    assert cli("report", str(scans["slow"]), "--html", str(html)).code == 0
    run = subprocess.run(
        [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-pdf-header-footer",
         f"--user-data-dir={tmp_path / 'profile'}", f"--print-to-pdf={pdf}", html.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0 and pdf.exists(), run.stderr
    text = flat(subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True,
                               check=True).stdout)  # fmt: skip
    headline = read_page(html.read_text()).by_class["headline"][0]
    assert text.startswith("feedbench scan") and flat(headline)[:60] in text
    for words in ("Not valid for sizing", "Summary", "samples/s", "System under test",
                  "Slowed on purpose", "Method", "Command", "--read-latency 0.02"):  # fmt: skip
        assert words in text, words
    listed = subprocess.run(["pdfimages", "-list", str(pdf)], capture_output=True, text=True,
                            check=True).stdout.splitlines()[2:]  # fmt: skip
    assert len(listed) >= 2  # the scaling chart and the timeline


def test_output_to_a_pipe_keeps_whole_lines_and_whole_cells(scans):
    """A batch job's log or ``| tee``: not a terminal. rich would fold it at 80 columns and cut
    table cells short ("48…" for a rate); COLUMNS, where set, still decides."""

    def report(**env: str) -> str:
        env = os.environ | env  # without COLUMNS (conftest) unless given
        cmd = [sys.executable, "-m", "feedbench.cli", "report", str(scans["local"])]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    piped, narrow = report(), report(COLUMNS="80")
    assert "…" not in piped
    header = next(line for line in piped.splitlines() if " speedup " in line)
    assert all(col in header.split() for col in ("N", "samples/s", "std", "CV", "MB/s"))
    assert max(map(len, piped.splitlines())) > 80
    # an 80-column terminal: lines folded at 80, and still no cell cut
    assert "…" not in narrow and max(map(len, narrow.splitlines())) <= 80
