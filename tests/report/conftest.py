"""Real scan results that the report tests read (made once for the package: each scan is a
few seconds of subprocesses)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.fixture(scope="package")
def scans(tmp_path_factory, dataset):
    """Two real scans of the same images: local reads, and reads with 20 ms added per file
    (batches of 2, one worker: 1 consumer measures 11 batches, enough to be judged)."""
    out = tmp_path_factory.mktemp("cmp")
    common = ["--consumers", "1,2", "--repeat", "2", "--stages", "read,decode", "--batch-size",
              "2", "--workers", "1", "--no-plots"]  # fmt: skip
    paths = {}
    # One after the other: run side by side, the local scan's decoding saturates the cores the
    # slow scan's verdict reads, and it is rightly called CPU-bound.
    for name, extra in (
        ("local", []),
        ("slow", ["--read-latency", "0.02", "--describe", "a slow filer, $30k"]),
    ):
        paths[name] = out / f"{name}.json"
        cmd = [sys.executable, "-m", "feedbench.cli", "scan", str(dataset / "images"), *common,
               *extra, "--json", str(paths[name])]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return paths


@pytest.fixture(scope="package")
def stepped_scan(tmp_path_factory, dataset):
    """A real scan with an emulated accelerator step (so each repeat has its AU), the read
    stage alone (fast): 1 and 2 consumers, 2 repeats each; 1 consumer judged (7 measured
    batches of 3, one worker), 2 consumers not (3 each): accelerators fed come from 1."""
    out = tmp_path_factory.mktemp("step") / "step.json"
    cmd = [sys.executable, "-m", "feedbench.cli", "scan", str(dataset / "images"), "--consumers",
           "1,2", "--repeat", "2", "--stages", "read", "--batch-size", "3", "--workers", "1",
           "--step-time", "0.01", "--no-plots", "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.fixture(scope="package")
def scan_json(scans):
    return scans["local"]


@pytest.fixture(scope="package")
def verify_run(tmp_path_factory, dataset):
    """A real verify of the stock recipe (baseline) on the CPU, 1 rank: (results file, stdout)."""
    out = tmp_path_factory.mktemp("verify") / "v.json"
    cmd = [sys.executable, "-m", "feedbench.cli", "verify", str(dataset), "--gpus", "1", "-l",
           "baseline", "--no-synthetic", "--device", "cpu", "--steps", "3", "--warmup", "1",
           "-b", "4", "--workers", "1", "--no-plots", "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc.stdout
