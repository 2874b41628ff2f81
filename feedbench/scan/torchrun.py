"""A scan across machines: this process is one consumer rank started by torchrun."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from feedbench.core.envelope import HostInfo, unfinished
from feedbench.core.errors import FeedbenchError, MeasurementFailed
from feedbench.core.supervise import sigterm_as_interrupt
from feedbench.scan.config import ScanConfig
from feedbench.scan.factory import is_user_spec
from feedbench.scan.merge import node_rates
from feedbench.scan.rank import RankOutcome, run_rank
from feedbench.scan.rankwatch import RankWatch
from feedbench.scan.results import RankHosts, ScanResult
from feedbench.scan.run import _absorb, _finish, new_result, validate
from feedbench.scan.sources import LISTING_ENV, save_listing
from feedbench.scan.sweep import curve
from feedbench.scan.watch import in_flight
from loaders.data.index import listed_as
from loaders.dist import default_workers
from loaders.index_once import forget, job_path, once_per_machine

# (rank 0's result, or None on another rank; the error to tell): the results written, the
# error said; called on the stall watch's thread, before the rank leaves with exit code 3
OnStalled = Callable[[ScanResult | None, FeedbenchError], None]


def run_under_torchrun(
    config: ScanConfig,
    on_update: Callable[[ScanResult], None] | None = None,
    on_stalled: OnStalled | None = None,
) -> ScanResult | None:
    """This process is one rank started by torchrun; rank 0 returns the result, others None.
    A stall of any rank (none of its progress for ``config.stall_timeout_s``) ends every rank:
    see :mod:`feedbench.scan.rankwatch` and ``on_stalled``."""
    from loaders.dist import discover

    d = discover()
    if d.world_size < 1 or "MASTER_ADDR" not in os.environ:
        raise FeedbenchError(
            "feedbench consumer is a torchrun rank: torchrun ... -m feedbench consumer PATH"
        )
    config.consumers = (d.world_size,)
    try:
        return _run(config, d, on_update, on_stalled)
    finally:  # (the ranks leave without running exit handlers): the listing goes with the job
        if d.local_rank == 0 and os.environ.get(LISTING_ENV):
            forget(os.environ[LISTING_ENV])


def _run(config: ScanConfig, d, on_update, on_stalled) -> ScanResult | None:
    source, notes, p = _validate_once(config, d.local_rank)
    result = new_result(config, source, notes, p) if d.rank == 0 else None
    local = int(os.environ.get("LOCAL_WORLD_SIZE", d.world_size))
    workers = config.workers if config.workers is not None else default_workers(local, minimum=0)
    kept = _Kept(result, config, workers, local, on_update)

    def stalled(message: str) -> None:
        error = kept.stalled(message)
        if on_stalled is not None:
            on_stalled(kept.result, error)

    # Ctrl-C reaches every rank (SIGINT) and torchrun's agent then stops them (SIGTERM): both end
    # the measurement here, and rank 0 keeps what was measured (marked partial). A SIGTERM that
    # comes first is the agent ending the job because a rank died. A rank blocked in a collective
    # only sees it on its way back to Python; until then the results file holds every
    # measurement finished so far (on_update), marked unfinished.
    watch = RankWatch(d.rank, d.world_size, config.stall_timeout_s, stalled)
    with sigterm_as_interrupt() as stop:
        try:
            with watch:
                run_rank(
                    d.rank, d.world_size, d.local_rank, config, "env://", workers,
                    kept.keep if d.rank == 0 else None, progress=watch.beat, on_hosts=kept.hosts,
                    gather_hosts=True,
                )  # fmt: skip
        except KeyboardInterrupt:
            if result is None:
                raise
            _stopped(result, stop.signal, len(result.measurements))
            stop.hold()  # the agent signals again while it stops the ranks: let rank 0 write
        except RuntimeError as e:  # a collective whose peer is gone: a rank died
            if not _peer_lost(e):
                raise
            stop.hold()
            if result is None:  # rank 0 says it, once
                raise RankLost(str(e)) from None
            _lost(result, e, len(result.measurements))
    if result is not None:
        kept.close()
    return result


def _validate_once(config: ScanConfig, local_rank: int):
    """:func:`validate` with one listing per machine: local rank 0 lists and saves its listing
    (and the loaders' index), the machine's other ranks load it, and every rank's consumer
    (its source, its loader) takes it from there instead of listing again."""
    if config.path is None:
        return validate(config)
    user = is_user_spec(config.loader)
    fmt = "files" if user else config.fmt
    folder = job_path(listed_as(config.path, fmt) + " (scan)", ".d")
    os.environ[LISTING_ENV] = folder  # this process is one rank of one scan

    def save(made, target: str) -> None:
        save_listing(made[0], str(config.path), fmt, None if user else config.loader, target)

    made = once_per_machine(local_rank, folder, lambda: validate(config), save,
                            error=FeedbenchError)  # fmt: skip
    return made if made is not None else validate(config)  # (loads rank 0's listing)


class RankLost(MeasurementFailed):
    """A rank other than 0 saw a peer leave the job; rank 0 tells it (exit 3)."""


def _peer_lost(e: RuntimeError) -> bool:
    """A collective failed because a peer's connection closed (it was killed or crashed)."""
    import torch.distributed as tdist

    text = str(e)
    return isinstance(e, tdist.DistError) or "closed by peer" in text or "reset by peer" in text


def _lost(result: ScanResult, e: RuntimeError, done: int) -> None:
    """Rank 0's result marked failed: another rank left the job while this one waited for it."""
    why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    why = why.split("] ", 1)[-1].split(". ")[0]  # gloo's source location and advice: not ours
    result.partial, result.stopped_by = True, "failed"
    result.failure = (
        f"a rank left the job (killed or crashed) after {done} measurements: {why}; "
        "see torchrun's output for which"
    )


def _stopped(result: ScanResult, signal_name: str | None, done: int) -> None:
    """Rank 0's result marked as ended early: by the user (SIGINT, SIGHUP) or by torchrun's
    agent (SIGTERM first: a rank died, or the job itself was stopped)."""
    result.partial = True
    if signal_name == "SIGTERM":
        result.stopped_by = "failed"
        result.failure = (
            f"stopped by torchrun (SIGTERM) after {done} measurements: a rank died or the job "
            "was stopped; see torchrun's output for which"
        )
    else:
        result.stopped_by = "interrupted"
        result.failure = f"interrupted ({signal_name or 'SIGINT'}) after {done} measurements"


class _Kept:
    """Rank 0's result as the measurements come (``result`` None on the other ranks); ``lock``:
    the stall watch's thread may end it while the main thread is in :meth:`keep`."""

    def __init__(self, result, config: ScanConfig, workers: int, local: int, on_update) -> None:
        self.result: ScanResult | None = result
        self.config, self.workers, self.local, self.on_update = config, workers, local, on_update
        self.lock = threading.Lock()
        self.t0 = time.perf_counter()
        self.nodes: dict[int, tuple[int, str]] = {}  # rank → (node rank, hostname)

    def keep(self, o: RankOutcome) -> None:
        assert self.result is not None
        with self.lock:
            o.measurement.per_node = node_rates(o.measurement, self.nodes)
            _absorb(self.result, [o])
            self.result.curve = curve(self.result.measurements)
            if self.on_update:  # the last write is the CLI's, with the finished result
                self.on_update(unfinished(self.result))

    def hosts(self, per_rank: list[tuple[HostInfo, int | None]]) -> None:
        """Rank 0: each node once (its node rank and hostname: two agents on one machine are
        two nodes), with its ranks; kept for each measurement's per-node rates."""
        assert self.result is not None
        machines: dict[tuple[str, int | None], RankHosts] = {}
        for rank, (h, node) in enumerate(per_rank):
            key = (h.hostname, node)
            machines.setdefault(key, RankHosts([], h, node)).ranks.append(rank)
            # (no GROUP_RANK: not started by torchrun's agent) each hostname one node
            self.nodes[rank] = (node if node is not None else list(machines).index(key), key[0])
        self.result.hosts = list(machines.values())  # written with the first measurement

    def stalled(self, message: str) -> FeedbenchError:
        """The measurement in flight marked failed by the stall, the result finished (rank 0);
        the error to tell. Holds the lock: the process leaves after this, keep() never again."""
        self.lock.acquire()
        r, world = self.result, self.config.consumers[0]
        if r is None:
            return MeasurementFailed(message)
        failed = in_flight(self.config, world, self.workers, len(r.measurements), message)
        _absorb(r, [failed])
        m = failed.measurement
        r.partial, r.stopped_by = True, "failed"
        r.failure = f"{world} consumer{'s' if world != 1 else ''}, {m.pass_name} pass: {message}"
        self.close()
        return MeasurementFailed(r.failure)

    def close(self) -> None:
        assert self.result is not None
        self.result.curve = curve(self.result.measurements)
        self.result.config["torchrun"] = {
            "world_size": self.config.consumers[0],
            "local_world_size": self.local,
            "elapsed_s": time.perf_counter() - self.t0,
        }
        _finish(self.result, self.config)
