"""Results files are checked on load against the dataclasses that write them: a wrong type is
one ``error:`` line naming the field, exit 2, never a traceback; every file feedbench writes,
and every results file kept under benchmarks/, loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from feedbench.core.errors import FeedbenchError
from feedbench.report.kinds import load_any

ROOT = Path(__file__).resolve().parents[2]
KEPT = sorted(p for p in (ROOT / "benchmarks").rglob("*.json*") if p.is_file())


@pytest.fixture(scope="module")
def written(tmp_path_factory, dataset) -> dict[str, Path]:
    """A scan and a comparison, written by the real commands (a read scan: seconds)."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("schema")
    fb = [sys.executable, "-m", "feedbench.cli"]
    scan = [*fb, "scan", str(dataset / "images"), "--stages", "read", "-b", "4",
            "--consumers", "1,2", "--no-plots", "--json", str(out / "s.json")]  # fmt: skip
    cmp = [*fb, "compare", str(out / "s.json"), str(out / "s.json"), "-L", "a", "-L", "b",
           "--no-plots", "--json", str(out / "c.json")]  # fmt: skip
    for cmd in (scan, cmp):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"scan": out / "s.json", "compare": out / "c.json"}


def test_every_file_the_commands_write_loads(written):
    for kind, path in written.items():
        assert load_any(path)[0] == kind


def test_every_results_file_kept_under_benchmarks_loads_or_says_why_in_one_line():
    loaded = 0
    for path in KEPT:
        try:
            load_any(path)  # gzipped ones too
            loaded += 1
        except FeedbenchError as e:
            assert "\n" not in str(e) and "not a feedbench results file" in str(e), str(e)
    assert loaded >= 100  # scans, verifies, comparisons and prediction checks


def _mutated(src: Path, dst: Path, change) -> Path:
    doc = json.loads(src.read_text())
    change(doc)
    dst.write_text(json.dumps(doc))
    return dst


def _set(key_path: tuple, value):
    def change(doc):
        for k in key_path[:-1]:
            doc = doc[k]
        doc[key_path[-1]] = value

    return change


@pytest.mark.parametrize(("kind", "key_path", "value", "said"), [
    ("scan", ("curve", 0, "samples_per_s_mean"), "abc",
     "curve[0].samples_per_s_mean: expected a number, got 'abc'"),
    ("scan", ("measurements", 0, "samples"), 1.5,
     "measurements[0].samples: expected an integer, got 1.5"),
    ("scan", ("measurements",), None, "measurements: expected a list, got null"),
    ("scan", ("dataset", "path"), 7, "dataset.path: expected a string, got 7"),
    ("scan", ("config", "stages"), "read", "config.stages: expected a list, got 'read'"),
    ("scan", ("kind",), ["scan"], "kind: expected a string, got a list"),
    ("scan", ("host",), None, "host: expected an object, got null"),
    ("compare", ("columns", 0, "points"), [], "columns[0].points: expected an object, got a list"),
    ("compare", ("columns", 0, "system_facts", 0), [], "columns[0].system_facts[0]: expected a "
     "list of 2, got a list"),
])  # fmt: skip
def test_a_wrong_type_is_one_error_line_naming_the_field(
    cli, written, tmp_path, kind, key_path, value, said
):
    bad = _mutated(written[kind], tmp_path / "bad.json", _set(key_path, value))
    r = cli("report", str(bad))
    assert r.code == 2, r.out + r.err
    assert r.err.strip() == f"error: {bad}: {said}"
    assert "Traceback" not in r.out + r.err


def test_a_missing_field_is_named(cli, written, tmp_path):
    def drop(doc):
        del doc["measurements"][0]["samples"]

    bad = _mutated(written["scan"], tmp_path / "bad.json", drop)
    r = cli("report", str(bad))
    assert (r.code, r.err.strip()) == (2, f"error: {bad}: measurements[0].samples: missing")
