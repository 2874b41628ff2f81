"""A scan across machines: this process is one consumer rank started by torchrun."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from feedbench.core.envelope import HostInfo
from feedbench.core.errors import FeedbenchError
from feedbench.core.supervise import sigterm_as_interrupt
from feedbench.scan.config import ScanConfig
from feedbench.scan.rank import RankOutcome, run_rank
from feedbench.scan.results import RankHosts, ScanResult
from feedbench.scan.run import _absorb, _finish, new_result, validate
from feedbench.scan.sweep import curve
from loaders import default_workers


def run_under_torchrun(
    config: ScanConfig, on_update: Callable[[ScanResult], None] | None = None
) -> ScanResult | None:
    """This process is one rank started by torchrun; rank 0 returns the result, others None."""
    from loaders.dist import discover

    d = discover()
    if d.world_size < 1 or "MASTER_ADDR" not in os.environ:
        raise FeedbenchError(
            "feedbench consumer is a torchrun rank: torchrun ... -m feedbench consumer PATH"
        )
    config.consumers = (d.world_size,)
    source, notes, p = validate(config)
    result = new_result(config, source, notes, p) if d.rank == 0 else None
    local = int(os.environ.get("LOCAL_WORLD_SIZE", d.world_size))
    workers = config.workers if config.workers is not None else default_workers(local, minimum=0)

    def keep(o: RankOutcome) -> None:
        assert result is not None
        _absorb(result, [o])
        result.curve = curve(result.measurements)
        if on_update:
            on_update(result)

    def hosts(per_rank: list[HostInfo]) -> None:  # rank 0: each machine once, with its ranks
        assert result is not None
        machines: dict[str, RankHosts] = {}
        for rank, h in enumerate(per_rank):
            machines.setdefault(h.hostname, RankHosts([], h)).ranks.append(rank)
        result.hosts = list(machines.values())  # written with the first measurement

    t0 = time.perf_counter()
    # Ctrl-C reaches every rank (SIGINT) and torchrun's agent then stops them (SIGTERM): both end
    # the measurement here, and rank 0 keeps what was measured (marked partial). A rank blocked
    # in a collective only sees it on its way back to Python; until then the results file holds
    # every measurement finished so far (on_update).
    try:
        with sigterm_as_interrupt():
            run_rank(
                d.rank, d.world_size, d.local_rank, config, "env://", workers,
                keep if d.rank == 0 else None, on_hosts=hosts, gather_hosts=True,
            )  # fmt: skip
    except KeyboardInterrupt:
        if result is None:
            raise
        result.partial = True
        # the agent signals again while it stops the ranks: let rank 0 finish writing
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if result is not None:
        result.config["torchrun"] = {
            "world_size": d.world_size,
            "local_world_size": local,
            "elapsed_s": time.perf_counter() - t0,
        }
        _finish(result, config)
    return result
