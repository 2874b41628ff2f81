"""Loader threads and worker processes off the cores the training process keeps for itself.

With small batches a training step is bound by the host thread that launches its kernels (the
forward on the main thread, the backward on autograd's device thread): ResNet-50 at 64 images on
an H200 is ~20 ms of GPU work and about as much launching. Decoders on every core, even at a
lower priority (``worker_nice``), share those threads' cores, caches and, on SMT machines, their
physical cores. ``reserve_cores=k`` keeps ``k`` cores per rank free of the loader: its worker
processes and threads (DataLoader workers and its pin-memory thread, DALI's threads) are started
with an affinity that excludes them; the training process itself keeps every core.
BENCHMARKS.md, "Small batches on one H200 (issue 29)".
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator

# Cores per rank kept free of loader workers and threads by default (``reserve_cores``).
RESERVE_CORES = 2


def cpu_list(cpus) -> str:
    """``{0, 1, 2, 5}`` → ``"0-2,5"`` (the kernel's own list format)."""
    out: list[str] = []
    ordered = sorted(cpus)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def _siblings(cpu: int) -> set[int]:
    """``cpu`` and its SMT siblings (the other hardware threads of its physical core)."""
    path = f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return {cpu}
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def loader_cores(
    reserve: int, local_rank: int, local_world: int, cpus: set[int] | None = None
) -> set[int] | None:
    """The cores a rank's loader may use: its allowed cores less ``reserve`` physical cores per
    rank on this machine (every rank's, so that no rank's loader lands on another's training
    threads), taken from the start of the sorted list with their SMT siblings. None: no change
    (nothing reserved, or too few cores to leave the loader at least half of them)."""
    if reserve <= 0:
        return None
    allowed = set(os.sched_getaffinity(0) if cpus is None else cpus)
    kept: set[int] = set()
    physical = 0
    for cpu in sorted(allowed):
        if physical >= reserve * max(1, local_world):
            break
        if cpu in kept:
            continue
        kept |= _siblings(cpu) & allowed
        physical += 1
    rest = allowed - kept
    if len(rest) < len(allowed) / 2:
        return None
    return rest


@contextlib.contextmanager
def started_on(cpus: set[int] | None) -> Iterator[None]:
    """Threads and processes started inside run on ``cpus``: the calling thread's affinity is
    set for the block (new threads and forked or spawned processes inherit it) and restored."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        with warnings.catch_warnings():
            # DataLoader weighs its worker count against the cores this thread now sees and
            # warns; the count is the rank's share of all its cores, on purpose (16 workers on
            # 14 cores fed one H200 at 0.99 of its ceiling, BENCHMARKS run 10)
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            yield
    finally:
        os.sched_setaffinity(0, before)
