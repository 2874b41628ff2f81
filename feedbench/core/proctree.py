"""The processes below a process, found cheaply: a sampler calls this several times a second
while a benchmark runs beside it."""

from __future__ import annotations

import contextlib
import os

import psutil


def descendants(pid: int) -> list[int]:
    """The processes below ``pid``: from each thread's /proc children list (a few small reads;
    psutil scans every process on the host, costly on a busy one), else through psutil."""
    if not os.path.exists(f"/proc/{pid}/task/{pid}/children"):  # a kernel without the list
        return _psutil_descendants(pid)
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children", "rb") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:  # the thread ended meanwhile
                continue
            found += kids
            todo += kids
    return found


def _psutil_descendants(pid: int) -> list[int]:
    with contextlib.suppress(psutil.Error):
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    return []
