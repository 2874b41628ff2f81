import json
import os
import re
import subprocess
import sys
import tarfile

import pytest

from feedbench.core import envelope
from feedbench.core.errors import FeedbenchError
from feedbench.scan import cache
from feedbench.scan import results as scan_results
from feedbench.scan.config import ScanConfig, parse_passes, parse_stages
from feedbench.scan.run import scan
from feedbench.scan.stages import STAGES


def _stage(p, name):
    return next(s for s in p.stages if s.name == name)


@pytest.mark.parametrize("layout", ["images", "shards"])
def test_stage_timing_on_a_small_dataset(dataset, layout):
    r = scan(ScanConfig(str(dataset / layout), stages=STAGES[:4], batch_size=5, workers=1))
    (p,) = r.measurements
    assert p.samples == 24 and p.errors == 0 and not p.partial
    assert p.batches == 5  # 4 full batches of 5 and one of 4
    for name in ("read", "decode", "augment", "collate"):
        s = _stage(p, name)
        assert s.samples == 24 and s.busy_s > 0 and s.samples_per_s > 0
    # one worker runs the stages one after another: their busy time fits inside the wall time
    assert sum(s.busy_s for s in p.stages if s.available) <= p.wall_s
    assert abs(sum(s.share for s in p.stages) - 1) < 1e-9
    # measured bytes: every byte of the dataset's files, once
    assert p.read_bytes == r.dataset.bytes
    assert _stage(p, "collate").in_bytes == 24 * 3 * 224 * 224
    assert 0 < p.first_batch_s < p.wall_s
    assert p.steady_samples_per_s > 0
    assert _stage(p, "read").latency.p50_s <= _stage(p, "read").latency.p99_s
    transfer = _stage(p, "transfer") if "transfer" in [s.name for s in p.stages] else None
    assert transfer is None  # not asked for


def test_transfer_unavailable_without_cuda(dataset):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: transfer is measured, see the gpu tests")
    r = scan(ScanConfig(str(dataset / "images"), stages=STAGES, batch_size=8))
    t = _stage(r.measurements[0], "transfer")
    assert not t.available and t.note == "no CUDA device"


def test_cold_pass_is_cold_and_warm_pass_is_warm(dataset):
    files = [str(p) for p in sorted((dataset / "images").rglob("*.jpg"))]
    for f in files:  # make it warm first
        with open(f, "rb") as fh:
            fh.read()
    if cache.residency(files).fraction < 0.99:
        pytest.skip("this filesystem does not keep read files in the page cache")
    r = scan(ScanConfig(str(dataset / "images"), stages=("read",), passes=("cold", "warm")))
    cold, warm = r.measurements
    assert cold.cache.mode == "cold" and cold.cache.resident_before == 0.0
    assert warm.cache.mode == "warm" and warm.cache.resident_before > 0.99


def test_parse_stages_and_passes():
    assert parse_stages("augment") == ("read", "decode", "augment")
    assert parse_stages("read,decode") == ("read", "decode")
    with pytest.raises(FeedbenchError, match="cumulative"):
        parse_stages("read,augment")
    with pytest.raises(FeedbenchError, match="unknown stage"):
        parse_stages("read,resize")
    assert parse_passes("cold,warm") == ("cold", "warm")
    with pytest.raises(FeedbenchError):
        parse_passes("hot")


def test_results_round_trip(dataset, tmp_path):
    r = scan(ScanConfig(str(dataset / "shards"), batch_size=8, passes=("cold", "warm")))
    path = tmp_path / "out" / "r.json"
    envelope.save(r, path)
    back = scan_results.load(path)
    assert back == r
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == envelope.SCHEMA_VERSION == 2 and raw["kind"] == "scan"
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_results_file_contract_keys(dataset, tmp_path):
    """The JSON keys other tools read. Changing them needs a schema_version bump."""
    r = scan(ScanConfig(str(dataset / "images"), stages=("read",), consumers=(1, 2)))
    envelope.save(r, tmp_path / "r.json")
    raw = json.loads((tmp_path / "r.json").read_text())
    assert set(raw) >= {
        "schema_version", "tool_version", "kind", "created_utc", "command", "config", "host",
        "dataset", "measurements", "curve", "accelerator", "verdict", "errors", "warnings",
        "partial",
    }  # fmt: skip
    p = raw["measurements"][0]
    assert set(p) >= {
        "consumers", "workers", "pass_name", "repeat", "samples", "files", "read_bytes", "errors",
        "wall_s", "first_batch_s", "samples_per_s", "steady_samples_per_s", "mb_per_s",
        "files_per_s", "stages", "cache", "per_consumer", "au_mean", "au_min", "monitor",
        "window_s", "window_samples", "window_read_bytes", "window_files", "window_overlap",
    }  # fmt: skip
    assert set(raw["curve"][0]) >= {
        "consumers", "pass_name", "repeats", "samples_per_s_mean", "samples_per_s_std", "cv",
        "efficiency", "au_mean", "au_min", "rate_basis",
    }  # fmt: skip
    assert set(p["per_consumer"][0]) >= {
        "rank", "samples", "data_wait_s", "sync_wait_s", "step_s", "au", "data_wait",
        "barrier_idle_s", "window_start", "window_end", "started_at", "common_batches",
        "common_samples",
    }  # fmt: skip
    assert set(p["stages"][0]) >= {"name", "samples", "busy_s", "in_bytes", "samples_per_s"}


def test_load_rejects_other_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(FeedbenchError, match="not a feedbench results file"):
        scan_results.load(bad)
    bad.write_text(json.dumps({"schema_version": 999}))
    with pytest.raises(FeedbenchError, match="schema_version 999"):
        scan_results.load(bad)
    with pytest.raises(FeedbenchError, match="no such results file"):
        scan_results.load(tmp_path / "missing.json")


# --- the CLI: a table, a results file, and bad input as one line with exit 2 -------------------


def test_cli_scan_prints_table_and_writes_results(cli, dataset, tmp_path):
    out = tmp_path / "r.json"
    r = cli("scan", str(dataset / "images"), "--batch-size", "8", "--json", str(out), "--no-plots")
    assert r.code == 0, r.err
    for name in ("read", "decode", "augment", "pipeline"):
        assert name in r.out
    loaded = scan_results.load(out)
    assert all(s.samples_per_s > 0 for s in loaded.measurements[0].stages)
    assert loaded.verdict is not None and loaded.verdict.bound in STAGES


def _one_line_error(r, code=2):
    assert r.code == code
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.err
    assert "Traceback" not in r.err + r.out
    return lines[0]


def test_cli_bad_paths(cli, tmp_path):
    assert "no such file" in _one_line_error(cli("scan", str(tmp_path / "missing")))
    (tmp_path / "empty").mkdir()
    assert "is empty" in _one_line_error(cli("scan", str(tmp_path / "empty")))
    (tmp_path / "txt").mkdir()
    (tmp_path / "txt" / "a.csv").write_text("1,2")
    assert "no images" in _one_line_error(cli("scan", str(tmp_path / "txt")))
    assert "unknown stage" in _one_line_error(cli("scan", str(tmp_path), "--stages", "resize"))


@pytest.mark.parametrize(
    ("where", "args", "message"),
    [
        ("images", ["--read-ahead", "4"], "--read-ahead: .*images: it applies to tar shards"),
        ("shards", ["--read-ahead", "-1"], "--read-ahead takes 0 to 1024 MiB"),
        ("shards", ["--read-ahead", "4", "--direct"], "with --direct there is no page cache"),
        ("shards", ["--read-ahead", "4", "--loader", "torch"], "does not apply to --loader"),
    ],
)
def test_cli_read_ahead_where_it_cannot_apply(cli, dataset, tmp_path, where, args, message):
    out = tmp_path / "r.json"
    line = _one_line_error(cli("scan", str(dataset / where), *args, "--json", str(out)))
    assert re.search(message, line), line
    assert not out.exists()


def test_cli_shards_read_the_same_with_and_without_the_reading_thread(cli, dataset, tmp_path):
    """--no-read-thread reads in series with the tar walk; the default reads from a thread. Both
    count every byte of every shard (the end padding too) and the same samples, and the results
    say which was used."""
    got = {}
    for flag in ("--read-thread", "--no-read-thread"):
        out = tmp_path / f"{flag}.json"
        r = cli("scan", str(dataset / "shards"), "--stages", "read", "-b", "4", "--workers", "0",
                flag, "--json", str(out), "--no-plots")  # fmt: skip
        assert r.code == 0, r.err
        loaded = scan_results.load(out)
        m = loaded.measurements[0]
        got[flag] = (loaded.config["read_thread"], m.samples, m.errors, m.read_bytes)
    shard_bytes = sum(p.stat().st_size for p in (dataset / "shards").glob("*.tar"))
    assert got["--read-thread"] == (True, 24, 0, shard_bytes)
    assert got["--no-read-thread"] == (False, 24, 0, shard_bytes)
    # a pipeline reads in series (each stage's time its own), and the results say so
    out = tmp_path / "pipeline.json"
    r = cli("scan", str(dataset / "shards"), "--stages", "read,decode", "-b", "4",
            "--workers", "0", "--json", str(out), "--no-plots")  # fmt: skip
    assert r.code == 0, r.err
    assert scan_results.load(out).config["read_thread"] is False


def test_cli_skips_corrupt_and_zero_byte_files_and_leaves_data_alone(cli, dataset_copy, tmp_path):
    tree = dataset_copy / "images"
    victim = next(iter(sorted(tree.glob("class_001/*.jpg"))))
    victim.write_bytes(victim.read_bytes()[:300] + os.urandom(2000))  # corrupt JPEG
    (tree / "class_002" / "empty.jpg").write_bytes(b"")  # zero-byte file
    (tree / "class_000" / "not-really.jpg").write_bytes(b"hello, I am text")
    before = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in tree.rglob("*")}
    out = tmp_path / "r.json"
    r = cli("scan", str(tree), "-b", "8", "--json", str(out))
    assert r.code == 0, r.err
    p = scan_results.load(out).measurements[0]
    assert p.samples == 24 - 1 and p.errors == 3
    skipped = {(e.key.rsplit("/", 1)[1], e.stage) for e in scan_results.load(out).errors}
    assert ("empty.jpg", "read") in skipped
    assert ("not-really.jpg", "decode") in skipped
    assert (victim.name, "decode") in skipped
    assert "skipped" in r.out
    assert before == {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in tree.rglob("*")}


def test_cli_truncated_shard_is_reported_and_scan_completes(cli, dataset_copy, tmp_path):
    shard = dataset_copy / "shards" / "shard-00002.tar"
    with tarfile.open(shard) as tar:
        members = tar.getmembers()
    cut = members[5].offset_data + 10  # inside the third sample's label
    shard.write_bytes(shard.read_bytes()[:cut])
    out = tmp_path / "r.json"
    r = cli("scan", str(dataset_copy / "shards"), "--json", str(out))
    assert r.code == 0, r.err
    loaded = scan_results.load(out)
    # three whole shards, and the two samples before the cut
    assert loaded.measurements[0].samples == 18 + 2
    assert any("truncated" in e.message for e in loaded.errors)
    assert "truncated" in r.out


def test_cli_all_bad_writes_results_then_fails(cli, tmp_path):
    bad = tmp_path / "bad" / "cls"
    bad.mkdir(parents=True)
    for i in range(3):
        (bad / f"{i}.jpg").write_bytes(os.urandom(1000))
    out = tmp_path / "r.json"
    line = _one_line_error(cli("scan", str(tmp_path / "bad"), "--json", str(out)))
    assert "no sample" in line and "3 errors" in line
    assert scan_results.load(out).measurements[0].errors == 3


def test_cli_a_loader_that_stops_fails_the_scan_in_its_words(cli, tmp_path):
    """--loader torch over a tree none of whose files decodes: the loader stops at its first
    batch (an empty batch cannot be trained on); the consumer's error reaches the parent as one
    line (the last of its traceback), exit 3, the partial results written."""
    bad = tmp_path / "bad" / "cls"
    bad.mkdir(parents=True)
    for i in range(8):
        (bad / f"{i}.jpg").write_bytes(b"not an image\n")
    out = tmp_path / "r.json"
    r = cli("scan", str(tmp_path / "bad"), "--loader", "torch", "-b", "4", "--workers", "1",
            "--json", str(out), "--no-plots")  # fmt: skip
    assert r.code == 3, r.out + r.err
    why = ("consumer 0 failed: rank 0: every sample of a batch failed (4 of 4), e.g. "
           f"{bad}/")  # fmt: skip
    errors = [line for line in r.err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {why}"), r.err
    assert "Traceback" not in r.err + r.out
    loaded = scan_results.load(out)
    assert loaded.partial and loaded.failure.startswith(why), loaded.failure


def test_entry_point_error_has_no_traceback(tmp_path):
    """The installed console script, in a real process."""
    proc = subprocess.run(
        [sys.executable, "-m", "feedbench.cli", "scan", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: no such file or directory")
    assert "Traceback" not in proc.stderr


def test_the_command_line_starts_without_torch():
    """The commands' modules, the parent's side of scan, verify and compare, and
    ``loaders.data`` load without torch (2-3 s to import) or matplotlib: `feedbench --help`, a
    bad path or option and `compare` answer at once; torch comes in where something is measured
    (scan's consumers are forked from a server that imported it) or drawn."""
    loaded = "[m for m in ('torch', 'matplotlib') if m in sys.modules]"
    modules = ("feedbench.cli, feedbench.scan.run, feedbench.report.compare, feedbench.verify.run, "
               "loaders.data")  # fmt: skip
    code = f"import sys, {modules}; print({loaded})"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


SCAN_THEN_MODULES = """
import sys
if __name__ == "__main__":  # not in the consumers, which import this file as their main
    sys.argv[0] = "feedbench"
    from feedbench.cli import main
    try:
        main()
    finally:
        print("loaded:", [m for m in ("torch", "scipy", "matplotlib") if m in sys.modules])
"""


def test_a_whole_scan_leaves_torch_scipy_and_matplotlib_out_of_the_parent(dataset, tmp_path):
    """A scan's parent starts, watches and joins its consumers and writes their results
    without torch (its consumers have it), scipy (needed for a projection's fit) or matplotlib
    (with --no-plots): each cost every scan seconds at its end on a 2-core host."""
    driver = tmp_path / "driver.py"
    driver.write_text(SCAN_THEN_MODULES)
    out = tmp_path / "r.json"
    cmd = [sys.executable, str(driver), "scan", str(dataset / "images"), "--stages", "read",
           "-b", "4", "--workers", "1", "--no-plots", "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith("loaded: []"), proc.stdout[-500:]
    assert scan_results.load(out).measurements[0].samples > 0


def test_warm_pass_warms_the_cache_first(dataset):
    files = [str(p) for p in sorted((dataset / "shards").glob("*.tar"))]
    cache.evict(files)
    assert cache.residency(files).fraction == 0.0
    r = scan(ScanConfig(str(dataset / "shards"), stages=("read",), passes=("warm",)))
    assert r.measurements[0].cache.mode == "warm"
    assert r.measurements[0].cache.resident_before > 0.99


def test_no_path_scans_the_bundled_sample_in_batches_of_four(cli, tmp_path, monkeypatch):
    """README set-up command 1 (``feedbench scan``): the bundled sample's 36 images in 9 batches,
    so the first run shows a steady rate; -b still sets the batch."""
    monkeypatch.chdir(tmp_path)  # no sample_data/ here: the one beside the package
    out = tmp_path / "s.json"
    r = cli("scan", "--stages", "read", "--no-plots", "--json", str(out))
    assert r.code == 0, r.out + r.err
    res = json.loads(out.read_text())
    assert res["config"]["batch_size"] == 4
    (m,) = res["measurements"]
    assert m["samples"] == 36 and m["batches"] == 9 and m["steady_samples_per_s"] > 0
    r = cli("scan", "--stages", "read", "-b", "12", "--no-plots", "--json", str(out))
    assert r.code == 0 and json.loads(out.read_text())["config"]["batch_size"] == 12
