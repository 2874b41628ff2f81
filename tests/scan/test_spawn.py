"""The consumers' processes (feedbench.scan.spawn): started without torch in the parent, a
consumer's exception or exit code named, in real processes from the fork server."""

from __future__ import annotations

import os
import sys

import pytest

from feedbench.scan import spawn

METHOD = "forkserver"


def _ok(index: int, folder: str) -> None:
    with open(os.path.join(folder, f"{index}.done"), "w") as f:
        f.write(str(os.getpid()))


def _raises_on_1(index: int, folder: str) -> None:
    if index == 1:
        raise ValueError(f"shard {index} is cut short")


def _exits(index: int, folder: str) -> None:
    sys.exit(3)


def _join(consumers: spawn.Consumers) -> bool:
    return any(consumers.join(timeout=0.5) for _ in range(120))  # short waits, as the watch


def test_every_consumer_runs_with_its_index(tmp_path):
    consumers = spawn.start(_ok, (str(tmp_path),), 3, METHOD)
    assert _join(consumers)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.done", "1.done", "2.done"]
    pids = {(tmp_path / f"{i}.done").read_text() for i in range(3)}
    assert len(pids) == 3 and str(os.getpid()) not in pids  # three processes, none this one
    assert consumers.join(timeout=0) is True  # and again, once all have ended


def test_an_exception_is_its_traceback_and_index(tmp_path):
    consumers = spawn.start(_raises_on_1, (str(tmp_path),), 2, METHOD)
    with pytest.raises(spawn.ConsumerRaised) as caught:
        _join(consumers)
    assert caught.value.index == 1
    text = str(caught.value)
    assert "Traceback" in text and text.rstrip().endswith("ValueError: shard 1 is cut short")
    assert not any(os.path.exists(p) for p in consumers.error_files)  # read, then removed


def test_an_exit_without_an_exception_is_its_code(tmp_path):
    consumers = spawn.start(_exits, (str(tmp_path),), 1, METHOD)
    with pytest.raises(spawn.ConsumerExited) as caught:
        _join(consumers)
    assert (caught.value.index, caught.value.exit_code) == (0, 3)
