"""compare and report judge every scan results file by today's sizing rules: an older file's
stored sizing is recomputed from its measurements (and the change said in one warning), a rule
its measurements cannot answer is "not checkable", and find-max's undecided answer is "≥ N".

The "older" files are real scan results with their stored sizing, tool_version or the figures
a rule needs edited, as a file written by an older feedbench holds them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from feedbench.report.compare import compare
from feedbench.report.compare_plots import compare_figure
from feedbench.report.current_rules import load_scan
from feedbench.report.fmt import fed_text, supported_text
from feedbench.scan.results import NOT_VALID, load
from tests.report.figures import texts
from tests.report.pages import flat, read_csv, read_page


def _older(src, dst, edit) -> dict:
    """``src``'s JSON with ``edit`` applied, written to ``dst``; the edited JSON."""
    data = json.loads(src.read_text())
    edit(data)
    dst.write_text(json.dumps(data))
    return data


def _overstated(data: dict) -> None:
    """What a file from before today's rules held: a larger figure, called valid."""
    z = data["sizing"]
    z["accelerators_fed"] = z["accelerators_fed"] + 1.5
    z["valid"], z["broken"] = True, []
    data["tool_version"] = "0.0.9"


def test_an_older_files_sizing_is_recomputed_and_the_change_said_once(cli, stepped_scan, tmp_path):
    today = load(stepped_scan).sizing  # this feedbench wrote it: today's rules
    assert not today.valid and today.broken  # 24 images: the data this test is built on
    old = tmp_path / "old.json"
    stored = _older(stepped_scan, old, _overstated)["sizing"]
    target = tmp_path / "cmp.json"
    r = cli("compare", str(old), str(stepped_scan), "-L", "old", "-L", "new", "--json",
            str(target), "--no-plots")  # fmt: skip
    assert r.code == 0, r.out + r.err
    doc = json.loads(target.read_text())
    rejudged = [w for w in doc["warnings"] if "was written by" in w]
    assert rejudged == [
        f"{old} was written by feedbench 0.0.9; its sizing by today's rules (feedbench "
        f"{doc['tool_version']}): fed {fed_text(stored['accelerators_fed'])} → "
        f"{fed_text(today.accelerators_fed)}; now {NOT_VALID}: " + "; ".join(today.broken)
    ]
    assert flat(rejudged[0]) in flat(r.out)  # the terminal says it too
    old_col, new_col = (c["system"] for c in doc["columns"])
    for col in (old_col, new_col):  # both judged by the same rules: the same figures
        assert col["accelerators_fed"] == today.accelerators_fed
        assert col["valid_for_sizing"] is False and col["not_valid_because"] == today.broken
    # report of the older file alone: the same warning, today's figures
    shown = cli("report", str(old))
    assert shown.code == 0, shown.err
    assert "was written by feedbench 0.0.9" in flat(shown.out)
    assert f"accelerators fed: {fed_text(today.accelerators_fed)}" in flat(shown.out)


def test_a_file_by_todays_rules_draws_no_warning(stepped_scan):
    result, warning = load_scan(stepped_scan)
    assert warning is None
    assert result.sizing == load(stepped_scan).sizing


def _older_schema(data: dict) -> None:
    """A file from before per-consumer batch counts and the scan's own CPU were recorded."""
    for m in data["measurements"]:
        m["per_consumer"] = []
        for s in (m["monitor"] or {}).get("samples", []):
            s.pop("own_busy_cores", None)
            s.pop("other_busy_cores", None)
    del data["tool_version"]


def test_an_older_schema_file_loads_and_its_unanswerable_rules_are_not_checkable(
    cli, stepped_scan, tmp_path
):
    # today's file breaks the measured-window rule (2 consumers of 24 images in batches of 3)
    assert any("measured batch" in b for b in load(stepped_scan).sizing.broken)
    old = tmp_path / "old.json"
    _older(stepped_scan, old, _older_schema)
    result, warning = load_scan(old)
    unchecked = [b for b in result.sizing.broken if "not checkable" in b]
    assert len(unchecked) == 2 and not result.sizing.valid, result.sizing.broken
    assert unchecked[0].startswith("the measured-window rule")
    assert f"{len(result.measurements)} of {len(result.measurements)} measurements" in unchecked[0]
    assert unchecked[1].startswith("the idle-host rule")
    # without the batch counts that rule is not broken but not checkable: never passed silently
    assert not any("measured batch" in b for b in result.sizing.broken)
    assert warning.startswith(f"{old} was written by a feedbench of unknown version")
    assert "not checkable" in warning
    r = cli("compare", str(old), str(stepped_scan), "--no-plots", "--json",
            str(tmp_path / "c.json"))  # fmt: skip
    assert r.code == 0 and "Traceback" not in r.err, r.out + r.err
    assert "is not checkable" in flat(r.out)


@pytest.fixture(scope="module")
def found_max(tmp_path_factory, dataset):
    """A real --find-max scan that stops undecided: 1 consumer has enough measured batches,
    2 consumers of 24 images in batches of 4 have too few to judge their AU."""
    out = tmp_path_factory.mktemp("fm") / "fm.json"
    cmd = [sys.executable, "-m", "feedbench.cli", "scan", str(dataset / "images"), "--stages",
           "read", "--batch-size", "4", "--workers", "1", "--step-time", "0.05", "--find-max",
           "--max-consumers", "4", "--no-plots", "--json", str(out),
           "--target-au", "0.6"]  # fmt: skip
    # (0.6: reads of a few ms leave AU near 1, but one descheduling on 2 busy cores could take
    # a 5-batch window below the default 0.9, as it did a test of the same shape in CI)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fm = json.loads(out.read_text())["config"]["find_max_result"]
    # the data this test is built on: it stopped at 2, after 1 passed
    assert fm["undecided_at"] == 2 and fm["supported_consumers"] == 1, fm
    return out


def test_find_max_stopped_undecided_is_shown_as_at_least(cli, found_max, stepped_scan, tmp_path):
    target = tmp_path / "c.json"
    r = cli("compare", str(found_max), str(stepped_scan), "-L", "fm", "-L", "step", "--json",
            str(target), "--no-plots")  # fmt: skip
    assert r.code == 0, r.out + r.err
    doc = json.loads(target.read_text())
    fm, step = doc["columns"]
    assert (fm["supported_consumers"], fm["supported_at_least"]) == (1, True)
    assert step["supported_at_least"] is False  # no find-max: whatever it shows is exact
    rows = [ln for ln in r.out.splitlines() if ln.lstrip("│ ").startswith("fm ")]
    assert any("≥ 1" in ln for ln in rows), r.out  # the systems table
    exact = step["supported_consumers"]
    paths = {ext: tmp_path / f"c.{ext}" for ext in ("html", "csv")}
    assert cli("report", str(target), "--html", str(paths["html"]), "--csv",
               str(paths["csv"])).code == 0  # fmt: skip
    head, *rows = read_page(paths["html"].read_text()).tables[0]
    at = head.index("supported consumers")
    assert [(row[0], row[at]) for row in rows] == [("fm", "≥ 1"), ("step", supported_text(exact))]
    _, csv_rows = read_csv(paths["csv"].read_text())
    flags = [("1", "yes"), ("", "") if exact is None else (str(exact), "no")]
    assert [(x["supported consumers (AU ≥ target)"], x["supported consumers is a lower bound"])
            for x in csv_rows] == flags  # fmt: skip
    fig = compare_figure(compare([str(found_max), str(stepped_scan)], ["fm", "step"]))
    note = texts(fig.axes[0])
    shown = "fm ≥ 1" + ("" if exact is None else f", step {exact}")
    assert len(note) == 1 and note[0].splitlines()[-1] == f"supported consumers: {shown}"
