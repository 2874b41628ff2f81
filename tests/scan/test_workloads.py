"""MLPerf-Storage-shaped workloads: the table, ``sample --workload``, and ``scan --workload``
end to end on local files and on a real S3 server (rclone) on loopback."""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest

from feedbench.core.errors import FeedbenchError
from feedbench.core.workloads import SHAPES, get_shape
from feedbench.report.fmt import fed_text, fmt_rate
from feedbench.sample_workload import make_workload, sample_sizes
from feedbench.scan.config import ScanConfig, apply_workload, plan
from feedbench.scan.sources import detect
from loaders.data import records, remote, tfrecord
from tests.scan.conftest import rclone_serve, use_s3


def test_a_workload_row_fills_what_the_user_left_out():
    c = apply_workload(ScanConfig("x", workload="unet3d"), target_au_given=False)
    assert (c.fmt, c.batch_size, c.workers, c.target_au, c.accelerator) == (
        "npz", 7, 4, 0.90, "h100",
    )  # fmt: skip
    p = plan(c)
    assert (p.batch_size, p.step_s) == (7, 0.323)
    assert p.accelerator["kind"] == "workload" and "unet3d_h100.yaml" in p.accelerator["source"]

    given = ScanConfig("x", workload="CosmoFlow", accelerator="A100", batch_size=2, workers=1,
                       target_au=0.5, fmt="files")  # fmt: skip
    c = apply_workload(given, target_au_given=True)
    assert (c.fmt, c.batch_size, c.workers, c.target_au) == ("files", 2, 1, 0.5)
    assert plan(c).step_s == pytest.approx(2 * 0.00551)  # the row's step per sample, batch 2

    c = apply_workload(ScanConfig("x", workload="cosmoflow"), target_au_given=False)
    assert (c.fmt, c.batch_size, c.target_au, plan(c).step_s) == ("tfrecord", 1, 0.70, 0.0035)
    c = apply_workload(ScanConfig("x", workload="resnet50", step_s=0.2), target_au_given=False)
    assert plan(c).accelerator["kind"] == "step" and plan(c).step_s == 0.2

    for cfg, msg in (
        (ScanConfig("x", workload="bert"), "unknown workload 'bert'"),
        (ScanConfig("x", workload="unet3d", accelerator="h200"), "no h200 row for workload"),
        (ScanConfig("x", accelerator="h100"), "give --workload too"),
    ):
        with pytest.raises(FeedbenchError, match=msg):
            apply_workload(cfg, target_au_given=False)


def test_list_workloads_shows_rows_and_sources(cli):
    r = cli("scan", "--list-workloads")
    assert r.code == 0, r.err
    for text in ("unet3d_h100.yaml", "cosmoflow_a100.yaml", "resnet50-h200", "146.6 MB", "0.323"):
        assert text in r.out


def test_sample_sizes_have_the_workload_spread():
    for name in ("resnet50", "unet3d"):
        shape = get_shape(name)
        sizes, scale = sample_sizes(shape, 20_000 * shape.sample_bytes / 1e9, seed=0)
        assert scale == 1.0 and len(sizes) == 20_000
        assert sizes.mean() == pytest.approx(shape.sample_bytes, rel=0.03)
        assert sizes.std() == pytest.approx(shape.sample_bytes_std, rel=0.15)
    sizes, scale = sample_sizes(SHAPES["unet3d"], 0.004, seed=0)  # 4 MB: 32 scaled samples
    assert len(sizes) == 32 and scale == pytest.approx(0.004e9 / (32 * 146600628))


@pytest.mark.parametrize(("workload", "files", "per_file"), [("resnet50", 4, 8), ("unet3d", 32, 1)])
def test_sample_workload_is_deterministic(tmp_path, workload, files, per_file):
    a = make_workload(tmp_path / "a", workload, 0.001, seed=3)
    make_workload(tmp_path / "b", workload, 0.001, seed=3)
    made = sorted((tmp_path / "a" / "data").iterdir())
    assert len(made) == a.files == files and a.samples == 32 and a.samples_per_file == per_file
    for f in made:
        assert f.read_bytes() == (tmp_path / "b" / "data" / f.name).read_bytes()
    if workload == "unet3d":  # numpy reads what was written: the payload and a label
        with np.load(made[1]) as z:
            assert sorted(z.files) == ["x", "y"] and z["x"].nbytes > 0 and int(z["y"]) == 1
        with zipfile.ZipFile(made[1]) as z:  # no clock time inside (numpy.savez puts one)
            assert {i.date_time for i in z.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    manifest = json.loads((tmp_path / "a" / "feedbench-sample.json").read_text())["workload"]
    assert manifest["samples"] == 32 and f"{workload}_h100.yaml" in manifest["source"]
    with pytest.raises(FeedbenchError, match="not a new or empty directory"):
        make_workload(tmp_path / "a", workload, 0.001)


def _data_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "data").iterdir())


def _scan(cli, path: str, out: Path, *args: str) -> dict:
    r = cli("scan", path, "--no-plots", "--json", str(out), *args)
    assert r.code == 0, r.out + r.err
    return json.loads(out.read_text())


def test_unet3d_npz_sample_and_scan_end_to_end(cli, tmp_path):
    r = cli("sample", str(tmp_path / "u"), "--workload", "unet3d", "--size", "0.004")
    assert r.code == 0 and "32 samples in 32 npz files" in r.out, r.out + r.err
    doc = _scan(cli, str(tmp_path / "u"), tmp_path / "u.json", "--workload", "unet3d",
                "--workers", "0")  # fmt: skip
    assert doc["dataset"]["format"] == "npz" and doc["dataset"]["samples"] == 32
    assert doc["accelerator"]["step_s"] == 0.323 and doc["config"]["batch_size"] == 7
    assert doc["config"]["target_au"] == 0.9 and doc["config"]["stages"] == ["read", "decode"]
    assert "format npz: stages read,decode (augment: images only)" in doc["warnings"]
    (m,) = doc["measurements"]
    assert m["samples"] == 32 and m["errors"] == 0 and m["files"] == 32
    assert m["read_bytes"] == _data_bytes(tmp_path / "u")  # every file read once, whole
    assert {s["name"] for s in m["stages"]} == {"read", "decode"}


def test_resnet50_tfrecord_sample_and_scan_end_to_end(cli, tmp_path):
    make_workload(tmp_path / "r", "resnet50", 0.002, seed=1)
    doc = _scan(cli, str(tmp_path / "r" / "data"), tmp_path / "r.json", "--workload",
                "resnet50", "--batch-size", "4", "--consumers", "2", "--workers", "1")  # fmt: skip
    assert doc["dataset"]["format"] == "tfrecord" and doc["dataset"]["files"] == 4
    assert doc["accelerator"]["step_s"] == pytest.approx(0.103 * 4 / 64)
    (m,) = doc["measurements"]
    assert m["samples"] == 32 and m["errors"] == 0  # 16 records each, by record across files
    assert [c["samples"] for c in m["per_consumer"]] == [16, 16]
    assert m["read_bytes"] == _data_bytes(tmp_path / "r")  # records cover their files exactly


@pytest.mark.net
def test_cosmoflow_over_s3_and_ranged_reads(cli, tmp_path, monkeypatch):
    root = tmp_path / "served"
    summary = make_workload(root / "cosmo", "cosmoflow", 0.002, seed=2)
    (root / "big").mkdir()
    blob = np.random.default_rng(4).bytes(3 << 20)
    (root / "big" / "blob.bin").write_bytes(blob)
    with rclone_serve(root, "s3") as endpoint:
        use_s3(monkeypatch, endpoint)
        got, gets = remote.read_range("s3://big/blob.bin", 100, len(blob) - 100, chunk=1 << 18)
        assert bytes(got) == blob[100:] and gets == 12  # bounded: 256 KiB ranged GETs
        data, _ = records.read_record("s3://big/blob.bin", 0, len(blob), url=True)
        assert bytes(data) == blob
        doc = _scan(cli, "s3://cosmo/data", tmp_path / "c.json", "--workload", "cosmoflow",
                    "--workers", "0", "--target-au", "0.5")  # fmt: skip
    assert doc["dataset"]["format"] == "tfrecord" and doc["config"]["target_au"] == 0.5
    (m,) = doc["measurements"]
    assert m["samples"] == summary.samples == 32 and m["errors"] == 0
    assert m["read_bytes"] == _data_bytes(root / "cosmo")


def test_bad_data_file_input_is_one_line(cli, tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("not data")
    out = ("--no-plots", "--json", str(tmp_path / "r.json"))
    for args, msg in (
        (["--format", "npz"], "format 'npz': no .npz files in"),
        ([], "data files are read when all are of one format"),
        (["--workload", "unet3d", "--accelerator", "tpu"], "no tpu row for workload unet3d"),
    ):
        r = cli("scan", str(tmp_path / "d"), *args, *out)
        assert r.code == 2 and r.err.startswith("error: ") and msg in r.err, r.err
    make_workload(tmp_path / "c", "cosmoflow", 0.001)
    r = cli("scan", str(tmp_path / "c"), "--direct", *out)
    assert r.code == 2 and "--direct reads whole files; tfrecord samples" in r.err, r.err


@pytest.mark.net
def test_records_are_read_in_ranges_over_http(tmp_path):
    written = [np.random.default_rng(5).bytes(n) for n in (70_000, 3, 150_000)]
    with open(tmp_path / "part.tfrecord", "wb") as f:
        tfrecord.write_records(f, written)
    (tmp_path / "notes.txt").write_text("left out")
    with rclone_serve(tmp_path, "http") as url:
        source, _ = detect(url + "/", "auto")  # index pages, sizes by HEAD
        samples = list(source.iter_samples(range(source.units())))
        assert [bytes(source.decode(s)) for s in samples] == written
    assert source.fmt == "tfrecord" and len(source.layout.skipped) == 1
    assert sum(s.read_bytes for s in samples) == (tmp_path / "part.tfrecord").stat().st_size


@pytest.mark.slow
@pytest.mark.parametrize("workload", sorted(SHAPES))
def test_a_workload_scan_prints_no_library_warning(tmp_path, workload):
    """The workload's read threads (4 or 8 loader workers) on a machine of fewer cores: torch's
    UserWarning from every DataLoader is not shown; feedbench says it once, in its words."""
    import os
    import subprocess
    import sys

    make_workload(tmp_path / "w", workload, 0.002, seed=3)
    cmd = [sys.executable, "-m", "feedbench.cli", "scan", str(tmp_path / "w" / "data"),
           "--workload", workload, "--no-plots", "--json", str(tmp_path / "w.json")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    both = proc.stdout + proc.stderr
    assert "UserWarning" not in both and "Warning:" not in both, both
    workers = json.loads((tmp_path / "w.json").read_text())["config"]["workers"]
    shared = " ".join(both.split()).count("loader workers per consumer on")
    assert shared == (1 if workers > (os.cpu_count() or 1) else 0), both


@pytest.mark.slow  # two emulated-step scans: 8–20 s on the shared 2-core VM
def test_a_workload_headline_is_the_captions_formula_on_the_row_it_names(cli, tmp_path):
    """Issue 25's u3d case: "Feeds 1.3 × unet3d" where the caption's own formula gave 2.13.
    A real unet3d scan at 1 and 2 consumers; the page's headline names a count, and its figure is
    the caption's formula, min(N × AU ÷ target AU (at most N), samples/s ÷ (one accelerator's
    samples/s × target AU)), on that count's row, the best of the rows."""
    r = cli("sample", str(tmp_path / "u"), "--workload", "unet3d", "--size", "0.004")
    assert r.code == 0, r.out + r.err
    # batches of 1 (a 46 ms step each): 32 and 16 per consumer, enough to judge both counts
    doc = _scan(cli, str(tmp_path / "u"), tmp_path / "u.json", "--workload", "unet3d",
                "--consumers", "1,2", "--batch-size", "1", "--workers", "1")  # fmt: skip
    r = cli("report", str(tmp_path / "u.json"), "--md", str(tmp_path / "u.md"))
    assert r.code == 0, r.out + r.err
    page = (tmp_path / "u.md").read_text()
    head = re.search(r"\*\*Feeds ([\d.]+) × unet3d .* at AU ≥ 90% \(best at (\d) consumers?", page)
    assert head is not None, page
    caption = ("Accelerators fed: the smaller of N × AU ÷ target AU (at most N) and samples/s ÷ "
               "(one accelerator's samples/s × target AU)")  # fmt: skip
    assert caption in page
    appetite, target = doc["accelerator"]["samples_per_s"], doc["config"]["target_au"]
    assert (appetite, target) == (pytest.approx(7 / 0.323, rel=1e-3), 0.9)

    def formula(p: dict) -> float:
        n = p["consumers"]
        return min(min(n, n * p["au_mean"] / target), p["samples_per_s_mean"] / appetite / target)

    curve = {p["consumers"]: p for p in doc["curve"]}
    assert set(curve) == {1, 2} and doc["sizing"]["not_judged"] == [], doc["sizing"]
    named = curve[int(head.group(2))]
    assert head.group(1) == fed_text(formula(named))
    assert formula(named) == max(formula(p) for p in curve.values())
    # the row it names shows the figures the formula took, and the same figure
    row = re.search(rf"^\| {named['consumers']} \| cold \| ([\d.,]+) \|.*\| (\d+)% / \d+% \| "
                    r"([\d.]+) \|", page, re.M)  # fmt: skip
    assert row is not None, page
    assert row.group(1) == fmt_rate(named["samples_per_s_mean"])
    assert row.group(2) == f"{named['au_mean']:.0%}".rstrip("%")
    assert float(row.group(3)) == pytest.approx(formula(named), abs=0.005)
