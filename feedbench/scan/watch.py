"""The stall watch of a local scan: is the storage slow, or has it stopped?

The parent of a count's consumers waits on them and judges, from their progress (bytes read,
batches taken: :class:`~feedbench.core.supervise.Watchdog`) and the bytes their connections
receive, which of three things it sees: consumers making progress; storage that is slow but still
sending (no batch within the stall timeout while bytes arrive: waited for, and reported as a
warning); or storage that stopped (nothing arrives: the count is ended, its measurement recorded
as failed). Under torchrun each rank watches itself instead: :mod:`feedbench.scan.rankwatch`.
"""

from __future__ import annotations

import contextlib
import os
import re
import time

import psutil

from feedbench.core import sockets
from feedbench.core.supervise import Watchdog
from feedbench.scan.config import ScanConfig
from feedbench.scan.factory import is_user_spec
from feedbench.scan.results import RankOutcome
from feedbench.scan.spawn import ConsumerExited, ConsumerRaised
from loaders.errors import last_line

# What a consumer is doing, for the parent's stall watch: opening moves no counter (loading the
# parent's listing, or listing where it has none; building a loader, its index, its workers) and
# is not a stall of the storage, however long it takes
READING, OPENING = 0, 1
PHASES = ("reading", "opening the data (listing it, building the index and the loader)")


def watch(
    ctx, config: ScanConfig, done_bytes, beats, phases, on_progress, slow: list[float]
) -> tuple[str, str | None]:
    """Wait for the consumers: ("done", None), ("interrupted", None), ("failed", why) or
    ("stalled", why). A consumer opening its data (:data:`PHASES`) is busy, not stalled; one
    whose connections receive bytes is slow, not stalled (the rates go to ``slow``)."""
    dog = Watchdog(len(done_bytes), config.stall_timeout_s)
    try:
        while not ctx.join(timeout=0.5):
            if on_progress is not None:
                on_progress(sum(done_bytes))
            busy = [p != READING for p in phases]
            if dog.check(list(zip(done_bytes, beats, strict=True)), busy):
                rate = bytes_arriving(ctx)
                if rate > 0:  # slow, not stopped: a batch is on its way
                    slow.append(rate)
                    dog.poke()
                    continue
                return "stalled", _stall_message(dog, config)
    except KeyboardInterrupt:
        return "interrupted", None
    except ConsumerRaised as e:
        return "failed", f"consumer {e.index} failed: {_last_line(str(e))}"
    except ConsumerExited as e:
        return "failed", f"consumer {e.index} died (exit code {e.exit_code})"
    return "done", None


def bytes_arriving(ctx, wait_s: float = 2.0) -> float:
    """Bytes/s the consumers' (and their loader workers') connections receive: two readings of
    the kernel's counters ``wait_s`` apart (2 s: slow storage may send in bursts, and a loaded
    host may not run the sender for a second). 0 where none can be read."""
    pids = []
    for proc in ctx.processes:
        with contextlib.suppress(psutil.Error, ValueError):
            top = psutil.Process(proc.pid)
            pids += [top.pid, *(c.pid for c in top.children(recursive=True))]
    before = sockets.received(pids, [os.getpid()])
    if before is None:
        return 0.0
    time.sleep(wait_s)
    after = sockets.received(pids, [os.getpid()])
    return 0.0 if after is None else sockets.arrived(before, after) / wait_s


def slow_warning(n: int, rates: list[float], config: ScanConfig) -> str:
    """The storage was slow, not stopped: how often the watch waited on it, at what rate."""
    return (
        f"slow storage, not stopped ({n} consumer{'s' if n != 1 else ''}): {len(rates)} time"
        f"{'s' if len(rates) != 1 else ''} no batch came within --stall-timeout "
        f"{config.stall_timeout_s:g} s while bytes arrived, at {min(rates) / 1e3:,.1f} KB/s at "
        "the slowest; waited for, and its rates count the wait"
    )


def _stall_message(dog: Watchdog, config: ScanConfig) -> str:
    (first, silent_s), *_ = dog.silent()
    if is_user_spec(config.loader):  # the user's loader may hang on its own, storage or not
        return (
            f"stalled: no consumer took a batch from the loader {config.loader} for "
            f"{silent_s:.0f} s (consumer {first} the longest): the loader, or the storage it "
            f"reads, hangs (--stall-timeout {config.stall_timeout_s:g})"
        )
    return (
        f"stalled: no consumer read a byte or took a batch for {silent_s:.0f} s (consumer "
        f"{first} the longest) reading {config.path}; the storage stopped answering "
        f"(--stall-timeout {config.stall_timeout_s:g})"
    )


def in_flight(config: ScanConfig, n: int, workers: int, done: int, why: str) -> RankOutcome:
    """The measurement a stall stopped, recorded as failed (no rate)."""
    from feedbench.scan.results import CacheState, Measurement

    pass_name = config.passes[min(done // config.repeat, len(config.passes) - 1)]
    m = Measurement(
        consumers=n, workers=workers, pass_name=pass_name, repeat=done % config.repeat + 1,
        samples=0, files=0, read_bytes=0, errors=0, batches=0, wall_s=0.0, first_batch_s=None,
        samples_per_s=0.0, steady_samples_per_s=None, mb_per_s=0.0, files_per_s=0.0, stages=[],
        cache=CacheState(pass_name, None), partial=True, failed=why,
    )  # fmt: skip
    return RankOutcome(m, [], [])


# "loaders.errors.LoaderError: …", "feedbench.core.errors.FeedbenchError: …": our own errors are
# one line already; a foreign one (OSError, RuntimeError) keeps its name, which says something
_OWN_ERROR = re.compile(
    r"^(?:(?:loaders|feedbench)(?:\.\w+)+\.\w+|FeedbenchError|LoaderError|MissingDependencyError): "
)


def _last_line(text: str) -> str:
    """The last line of a consumer's traceback, without our own error classes' names."""
    return _OWN_ERROR.sub("", last_line(text), count=1)
