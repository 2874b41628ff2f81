"""Slow is not stopped: a web server that keeps sending, too slowly for a batch within
--stall-timeout, is waited for (its bytes are arriving), and the wait shows as the longest gap;
only a server that sends nothing is "stopped answering" (tests/scan/test_failing_storage.py)."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import loopback_http

ROOT = Path(__file__).resolve().parents[2]
SLOW_BYTES, PIECE, PAUSE_S = 100_000, 2_000, 0.1  # 20 KB/s for the first 100 KB: ~5 s


class SlowHandler(http.server.SimpleHTTPRequestHandler):
    """shard-00001.tar's first SLOW_BYTES trickle out (PIECE bytes every PAUSE_S); the rest of
    it, and every other file, at once."""

    def copyfile(self, source, outputfile):
        data = source.read()
        if self.path.endswith("shard-00001.tar"):
            for at in range(0, SLOW_BYTES, PIECE):
                outputfile.write(data[at : at + PIECE])
                outputfile.flush()
                time.sleep(PAUSE_S)
            data = data[SLOW_BYTES:]
        outputfile.write(data)

    def log_message(self, *args):
        pass


@pytest.mark.net
@pytest.mark.slow  # a real scan in a subprocess, ~5 s of it waiting on the slow shard
def test_a_slow_server_is_waited_for_not_called_stopped(dataset, tmp_path):
    out = tmp_path / "r.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with loopback_http(SlowHandler, dataset / "shards") as port:
        target = f"http://127.0.0.1:{port}/shard-0000{{0..3}}.tar"
        proc = subprocess.run(
            [sys.executable, "-m", "feedbench", "scan", target, "--stages", "read",
             "--batch-size", "2", "--workers", "0", "--stall-timeout", "2", "--json", str(out),
             "--no-plots"],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "stopped answering" not in proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    (m,) = result["measurements"]
    assert not m["failed"] and not result["partial"]
    assert m["samples"] == 24 and m["errors"] == 0
    # the wait for the slow shard's first batch: longer than the stall timeout, reported
    assert m["longest_gap_s"] > 3, m["longest_gap_s"]
    (slow,) = [w for w in result["warnings"] if w.startswith("slow storage, not stopped")]
    rate = float(slow.split(" KB/s at the slowest")[0].rsplit(" ", 1)[1].replace(",", ""))
    assert 5 < rate < 60, slow  # the server's 20 KB/s, as the kernel counted it
    assert slow in proc.stdout.replace("\n", " ")
