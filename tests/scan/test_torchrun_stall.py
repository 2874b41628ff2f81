"""The stall watch of a torchrun scan: what a rank is doing, read from a real thread's stack
(blocked reading a FIFO), and the message naming the stalled ranks."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from feedbench.scan.rankwatch import Activity, activity, ranks_text, stall_message
from feedbench.scan.sources import detect


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
