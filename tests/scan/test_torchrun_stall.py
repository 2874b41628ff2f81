"""The stall watch of a torchrun scan: a rank whose reads hang ends every rank, named.

The unit tests read a real thread's stack (blocked reading a FIFO) and compose the message; the
torchrun test starts two real agents on loopback over a real web server that stops answering
one object that rank 1 reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from urllib.parse import urlsplit

import psutil
import pytest

from feedbench.scan.consumer import Accelerator, consumer_units
from feedbench.scan.rankwatch import Activity, activity, ranks_text, stall_message
from feedbench.scan.sources import detect
from tests.conftest import ROOT
from tests.scan.conftest import HangingHttp, _free_port
from tests.scan.test_failing_storage import MARK, _left_behind

STALL_S = 3


def test_activity_names_the_file_a_blocked_read_waits_for(dataset, tmp_path):
    """A read that blocks (a FIFO with no writer: open() waits) is seen from another thread,
    with the file it reads, and as the rank's own work (not a wait for other ranks)."""
    source, _ = detect(str(dataset / "images"))
    fifo = str(tmp_path / "never.jpg")
    os.mkfifo(fifo)
    reader = threading.Thread(target=source._read_image, args=(fifo, 0), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 10
        seen = activity(sys._current_frames().get(reader.ident))
        while seen.what != f"reading {fifo}" and time.monotonic() < deadline:
            time.sleep(0.05)
            seen = activity(sys._current_frames().get(reader.ident))
        assert seen == Activity(False, f"reading {fifo}")
    finally:
        with open(fifo, "wb"):  # a writer: the reader's open() returns, it reads nothing
            pass
        reader.join(timeout=10)
    assert activity(None) == Activity(False, "starting")


def test_loading_an_index_is_busy_work_not_a_stall(tmp_path):
    """A rank loading (or listing, or indexing) is at work that moves no progress counter: the
    watch says so and does not count it silent. (A FIFO with no writer: open() waits.)"""
    from loaders.data import SampleIndex
    from loaders.errors import LoaderError

    fifo = str(tmp_path / "index.npz")
    os.mkfifo(fifo)

    def load() -> None:
        with contextlib.suppress(LoaderError):
            SampleIndex.load(fifo)

    loading = threading.Thread(target=load, daemon=True)
    loading.start()
    try:
        deadline = time.monotonic() + 10
        seen = activity(sys._current_frames().get(loading.ident))
        while not seen.busy and time.monotonic() < deadline:
            time.sleep(0.05)
            seen = activity(sys._current_frames().get(loading.ident))
        assert seen == Activity(False, f"loading the index {fifo}", busy=True)
    finally:
        with open(fifo, "wb"):  # a writer: the load reads nothing, fails, ends
            pass
        loading.join(timeout=10)


def test_activity_names_the_emulated_step():
    stepping = threading.Thread(target=Accelerator(1.0).step, daemon=True)
    stepping.start()
    time.sleep(0.2)  # (well inside its 1 s sleep)
    seen = activity(sys._current_frames().get(stepping.ident))
    assert seen == Activity(False, "sleeping its emulated accelerator step")
    stepping.join()


@pytest.mark.parametrize(
    ("ranks", "text"),
    [([3], "rank 3"), ([0, 2, 3, 4, 5], "ranks 0, 2–5"), ([5, 1, 0], "ranks 0–1, 5")],
)
def test_ranks_text(ranks, text):
    assert ranks_text(ranks) == text


def test_stall_message_names_the_stalled_ranks_and_groups_the_others():
    reports = [
        {"rank": 5, "host": "b", "what": "reading /d/x.jpg", "silent_s": 61.4},
        {"rank": 1, "host": "a", "what": "reading /d/y.jpg", "silent_s": 60.2},
        {"rank": 5, "host": "b", "what": "without a sign of life", "silent_s": 90},  # again
    ]
    beats = {r: {"what": "waiting in the step barrier"} for r in (0, 2, 3, 4)}
    beats |= {5: {"what": "reading /d/x.jpg"}, 6: {"what": "reading /d/z.jpg"}}
    got = stall_message(reports, beats, 60)
    assert got == (
        "stalled: rank 1 on a made no progress for 60 s, reading /d/y.jpg; rank 5 on b made no "
        "progress for 61 s, reading /d/x.jpg; ranks 0, 2–4 were waiting in the step barrier; "
        "rank 6 was reading /d/z.jpg (--stall-timeout 60)"
    )
    many = [{"rank": r, "host": "h", "what": "w", "silent_s": 9} for r in range(6)]
    assert stall_message(many, {}, 9).count("made no progress") == 4
    assert "2 more ranks stalled" in stall_message(many, {}, 9)


def _agents(url: str, out, tmp_path, mark: str, *extra: str) -> list[subprocess.Popen]:
    """Two torchrun agents (as on two machines), one rank each; 2 repeats of 24 images."""
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **{MARK: mark})
    procs = []
    for node in range(2):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node",
               "1", "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port",
               str(port), "-m", "feedbench", "consumer", url, "--stages", "read", "-b", "2",
               "--workers", "0", "--repeat", "2", "--step-time", "0.01", "--stall-timeout",
               str(STALL_S), "--json", str(out), "--no-plots", *extra]  # fmt: skip
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env, cwd=tmp_path))  # fmt: skip
    return procs


@pytest.mark.net
@pytest.mark.slow
@pytest.mark.usefixtures("torchrun_logs")
def test_a_rank_whose_reads_hang_ends_every_rank(dataset, tmp_path):
    """Rank 1's fifth read of the second measurement never gets an answer; rank 0 waits for it
    in the step barrier. Both ranks end within the stall timeout (+ a margin), rank 0 writes the
    first measurement and the failed second, and one line names rank 1, its host and its file."""
    shutil.copytree(dataset / "images", tmp_path / "served" / "images")
    server = HangingHttp(tmp_path / "served", answered=1)  # a file read once per measurement
    out, mark = tmp_path / "r.json", uuid.uuid4().hex
    try:
        url = server.url + "/images/"
        source, _ = detect(url)
        # epoch 1: the second measurement, as the scan orders it (seed 0)
        hung = str(source.files()[consumer_units(source, 1, 2, seed=0, epoch=1)[4]])
        server.hang = urlsplit(hung).path
        procs = _agents(url, out, tmp_path, mark)
        try:
            outs = [p.communicate(timeout=90) for p in procs]
        except subprocess.TimeoutExpired:
            _kill(procs)  # (the orphans of a scan that ended are no agent's children)
            raise
        assert server.hung_at is not None, outs
        took_s = time.monotonic() - server.hung_at
    finally:
        server.close()
    assert all(p.returncode != 0 for p in procs), outs
    assert took_s < STALL_S + 15, f"the ranks took {took_s:.0f} s to end"
    stderr = outs[0][1] + outs[1][1]
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    host = socket.gethostname()
    expected = (
        re.escape(f"error: 2 consumers, cold pass: stalled: rank 1 on {host} made no progress for ")
        + r"(\d+) s, "
        + re.escape(f"reading {hung}; rank 0 was waiting in the step barrier "
                    f"(--stall-timeout {STALL_S})")
    )  # fmt: skip
    assert len(errors) == 1 and (said := re.fullmatch(expected, errors[0])), stderr
    assert STALL_S <= int(said.group(1)) <= STALL_S + 2
    assert "results:" in outs[0][0]  # rank 0 wrote and said where
    assert str(ROOT / "feedbench") not in stderr, "a traceback of ours"
    doc = json.loads(out.read_text())
    assert doc["partial"] and doc["failure"] == errors[0].removeprefix("error: ")
    first, second = doc["measurements"]
    assert first["samples"] == 24 and not first["failed"]
    assert second["failed"].startswith("stalled: rank 1 ") and second["partial"]
    assert [p["consumers"] for p in doc["curve"]] == [2]  # the failed one is no point
    assert not _left_behind(mark), "processes of the scan left behind"


def _kill(procs: list[subprocess.Popen]) -> None:
    """Whatever is left of the agents and their ranks (nothing, when the scan ended)."""
    for p in procs:
        with contextlib.suppress(psutil.Error):
            for kid in psutil.Process(p.pid).children(recursive=True):
                kid.kill()
        if p.poll() is None:
            p.kill()


def _after_first_measurement(out, procs, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        with contextlib.suppress(OSError, ValueError):
            if json.loads(out.read_text())["measurements"]:
                return
        time.sleep(0.1)
    raise AssertionError("the first measurement never finished")


@pytest.mark.slow
@pytest.mark.usefixtures("torchrun_logs")
def test_a_rank_that_stops_is_named_by_rank_0(dataset, tmp_path):
    """A rank whose process stops (SIGSTOP; as one blocked in C code that holds Python's lock,
    where its own watch cannot run either) mid-scan: rank 0, waiting for it, sees its beats
    stop, writes the results and names it, within twice the stall timeout (+ a margin)."""
    out, mark = tmp_path / "r.json", uuid.uuid4().hex
    procs = _agents(str(dataset / "images"), out, tmp_path, mark, "--repeat", "3",
                    "--read-latency", "0.1")  # fmt: skip
    try:
        _after_first_measurement(out, procs)
        (rank1,) = psutil.Process(procs[1].pid).children()
        rank1.suspend()
        t0 = time.monotonic()
        stdout, stderr = procs[0].communicate(timeout=60)
        took_s = time.monotonic() - t0
    finally:
        _kill(procs)  # a stopped rank cannot end itself: its agent, or the user, must
        outs = [p.communicate(timeout=60) for p in procs[1:]]
    assert procs[0].returncode != 0, stderr
    assert took_s < 2 * STALL_S + 15, f"rank 0 took {took_s:.0f} s to end"
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    host = socket.gethostname()
    expected = (
        re.escape(f"error: 2 consumers, cold pass: stalled: rank 1 on {host} made no progress for ")
        + r"\d+ s, without a sign of life \(its last: .+\); "
        + r"rank 0 was waiting in [a-z ]+ "
        + re.escape(f"(--stall-timeout {STALL_S})")
    )
    assert len(errors) == 1 and re.fullmatch(expected, errors[0]), (stderr, outs)
    doc = json.loads(out.read_text())
    assert doc["partial"] and doc["failure"] == errors[0].removeprefix("error: ")
    assert doc["measurements"][0]["samples"] == 24 and not doc["measurements"][0]["failed"]
    assert doc["measurements"][-1]["failed"].startswith("stalled: rank 1 ")
    assert not _left_behind(mark), "processes of the scan left behind"
