"""The terminal's tables of scan, verify, compare and plan, from real results files, in a plain
80-column terminal and a wide one: no number or header is cut ("…"), and the default tables fit
the line."""

from __future__ import annotations

import gzip
import re
import subprocess
import sys
from pathlib import Path

import pytest

# each table's headers, whole (a header cut or wrapped would miss here)
HEADERS = {
    "scan": ["samples/s", "± std", "MB/s", "speedup", "share", "MB/s in", "busy", "p99"],
    "stepped": ["AU mean", "AU min", "data wait p50", "sync wait", "idle/step"],
    "verify": ["loader", "img/s", "speedup", "GPU mem", "fwd+bwd", "reduce", "slower"],
    "compare": ["system", "fed", "MB/s", "files/s", "read p99", "sizing"],
    "plan": ["model", "parameters [95% interval]", "AICc", "LOO error"],
}
# a recorded scan of 1..16 consumers on the dev VM (BENCHMARKS.md, "feedbench plan on real curves")
RECORDED_SCAN = Path(__file__).parents[2] / "benchmarks/2026-12-03-devvm-plan/scan-lat10.json.gz"
# a number as the tables show it: 1,234 · 12.3k · 12.5% · 1.04× · 8.2 ms · 828 µs
NUMBER = re.compile(r"\d[\d,.]*(k|%|×| ms| µs| s| GB| MB)?")


@pytest.fixture(scope="module")
def compared(tmp_path_factory, scans):
    """A real comparison of the two real scans (its results file)."""
    out = tmp_path_factory.mktemp("cmpw") / "c.json"
    cmd = [sys.executable, "-m", "feedbench.cli", "compare", str(scans["local"]),
           str(scans["slow"]), "-L", "nvme", "-L", "filer", "--no-plots", "--json",
           str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """A real plan (its results file) of a recorded scan: fitting a curve takes a second or two,
    where scanning one of several counts would take minutes."""
    out = tmp_path_factory.mktemp("planw")
    scan = out / "scan.json"
    scan.write_bytes(gzip.decompress(RECORDED_SCAN.read_bytes()))
    cmd = [sys.executable, "-m", "feedbench.cli", "plan", str(scan), "--at", "32", "--rate",
           "100", "--cost", "64000", "--no-plots", "--json", str(out / "plan.json")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out / "plan.json"


@pytest.fixture
def files(scans, stepped_scan, verify_run, compared, planned):
    return {"scan": scans["local"], "stepped": stepped_scan, "verify": verify_run[0],
            "compare": compared, "plan": planned}  # fmt: skip


def _table_lines(text: str) -> list[str]:
    """The lines of the tables: from a header rule's line above it to the next line of prose."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        if set(line.strip()) == {"─"} and i:
            out.append(lines[i - 1])
            out += [ln for ln in lines[i + 1 : i + 12] if ln.startswith(" ") or ln[:1].isdigit()]
    return out


@pytest.mark.parametrize("columns", [80, 200])
@pytest.mark.parametrize("kind", ["scan", "stepped", "verify", "compare", "plan"])
def test_no_number_or_header_is_cut(cli, monkeypatch, files, kind, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    r = cli("report", str(files[kind]))
    assert r.code == 0, r.out + r.err
    assert "…" not in r.out, r.out
    tables = _table_lines(r.out)
    assert tables, r.out
    for line in tables:  # the default tables fit the line
        assert len(line.rstrip()) <= columns, line
    for header in HEADERS[kind]:
        assert re.search(rf"(^|\s){re.escape(header)}(\s|$)", r.out, re.M), (header, r.out)


def test_wide_tables_on_a_narrow_terminal_are_wider_not_cut(cli, monkeypatch, files):
    monkeypatch.setenv("COLUMNS", "80")
    r = cli("report", "--wide", str(files["stepped"]))
    assert r.code == 0, r.err
    assert "…" not in r.out
    head = next(ln for ln in r.out.splitlines() if " files/s " in ln and " effic." in ln)
    assert " workers " in head and " AU mean " in head


def test_the_numbers_in_a_row_are_the_results_files(cli, monkeypatch, files):
    """At 80 columns the scaling row of 1 consumer holds the curve's numbers, whole."""
    import json

    monkeypatch.setenv("COLUMNS", "80")
    r = cli("report", str(files["stepped"]))
    point = json.loads(files["stepped"].read_text())["curve"][0]
    from feedbench.report.fmt import fmt_rate

    lines = r.out.splitlines()
    head = next(i for i, ln in enumerate(lines) if " speedup " in ln)
    row = lines[head + 2]  # under the header's rule: 1 consumer
    cells = row.split()
    # "± std", "AU mean" and "AU min" are two words each
    assert cells[0] == "1" and len(cells) == len(lines[head].split()) - 3, row
    assert fmt_rate(point["samples_per_s_mean"]) in cells and f"{point['cv']:.1%}" in cells
    assert all(NUMBER.fullmatch(c) or c == "—" for c in cells), row
