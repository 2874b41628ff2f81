"""A scan killed outright (SIGKILL) cannot remove its shared listing folder; the next scan does,
and never a folder a running scan still holds."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from feedbench.scan.sources import (
    LISTING_LOCK,
    LISTING_PREFIX,
    LOCKLESS_STALE_S,
    detect,
    shared_listing,
    sweep_listings,
)

REPO = Path(__file__).resolve().parents[2]

# a scan's listing step in a process of its own: lists the sample tree, shares the listing,
# prints the folder and sleeps inside it until killed
HOLDER = textwrap.dedent(
    """
    import sys, time
    from feedbench.scan.sources import detect, shared_listing
    source, _ = detect(sys.argv[1])
    with shared_listing(source, sys.argv[1], "auto") as folder:
        print(folder, flush=True)
        time.sleep(120)
    """
)


def _holder(tmp: Path) -> tuple[subprocess.Popen, Path]:
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(REPO / "sample_data" / "images")],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    folder = Path(proc.stdout.readline().strip())
    assert folder.is_dir(), proc.poll()
    return proc, folder.parent


def test_a_killed_scans_listing_is_swept_and_a_running_ones_is_not(tmp_path):
    running, kept = _holder(tmp_path)
    killed, left = _holder(tmp_path)
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        assert left.is_dir() and (left / "listing").is_dir()  # SIGKILL: no cleanup ran
        assert sweep_listings(str(tmp_path)) == 1
        assert not left.exists()
        assert (kept / "listing").is_dir()  # its scan still holds the lock
    finally:
        for p in (running, killed):
            p.kill()
            p.wait(timeout=30)
    assert sweep_listings(str(tmp_path)) == 1 and not kept.exists()


def test_sweep_leaves_what_it_cannot_judge(tmp_path):
    new = tmp_path / f"{LISTING_PREFIX}new"  # being made: no lock file yet
    (new / "listing").mkdir(parents=True)
    other = tmp_path / "other-listing"
    (other / LISTING_LOCK).parent.mkdir()
    (other / LISTING_LOCK).touch()
    held = tmp_path / f"{LISTING_PREFIX}held"
    held.mkdir()
    fd = os.open(held / LISTING_LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another open file: conflicts even in this process
    try:
        assert sweep_listings(str(tmp_path)) == 0
    finally:
        os.close(fd)
    assert new.is_dir() and other.is_dir() and held.is_dir()
    assert sweep_listings(str(tmp_path)) == 1 and not held.exists()


def test_a_folder_without_a_lock_for_a_day_is_a_leftover(tmp_path):
    old = tmp_path / f"{LISTING_PREFIX}old"  # a feedbench's from before the lock
    (old / "listing").mkdir(parents=True)
    then = time.time() - LOCKLESS_STALE_S - 60
    os.utime(old, (then, then))
    new = tmp_path / f"{LISTING_PREFIX}new"  # being made: its lock comes next
    (new / "listing").mkdir(parents=True)
    assert sweep_listings(str(tmp_path)) == 1
    assert not old.exists() and new.is_dir()


@pytest.mark.skipif(os.getuid() != 0, reason="making a folder another user's needs root")
def test_another_users_listing_is_left_alone(tmp_path):
    theirs = tmp_path / f"{LISTING_PREFIX}theirs"
    theirs.mkdir()
    (theirs / LISTING_LOCK).touch()  # free: its scan has ended, but not ours to remove
    os.chown(theirs, 65534, 65534)
    assert sweep_listings(str(tmp_path)) == 0 and theirs.is_dir()
    os.chown(theirs, 0, 0)
    assert sweep_listings(str(tmp_path)) == 1 and not theirs.exists()


def test_a_listing_left_normally_is_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    tree = str(REPO / "sample_data" / "images")
    source, _ = detect(tree)
    with shared_listing(source, tree, "auto") as folder:
        assert os.path.isfile(os.path.join(os.path.dirname(folder), LISTING_LOCK))
    assert list(tmp_path.iterdir()) == []
