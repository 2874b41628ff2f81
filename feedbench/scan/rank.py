"""One consumer process (one rank): every pass × repeat of a scan at one world size, cold cache
included. :func:`run_rank` opens the consumer (:func:`open_consumer`), then takes one
:func:`measure` per pass × repeat: cache prepared, a common start, :func:`consume`, stats gathered,
rank 0 building the measurement."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist

from feedbench.core.envelope import HostInfo
from feedbench.core.monitor import Monitor
from feedbench.scan import cache, emulate, factory
from feedbench.scan.batches import TrainingLoader
from feedbench.scan.config import ScanConfig, plan
from feedbench.scan.consumer import (
    StepOptions,
    bracket_step_alone,
    consumer_units,
    make_accelerator,
    run_consumer,
)
from feedbench.scan.factory import is_user_spec
from feedbench.scan.merge import build_measurement
from feedbench.scan.opening import SCAN_PID_ENV, open_source
from feedbench.scan.results import (
    CacheState,
    ConsumerStats,
    RankOutcome,
    SampleError,
)
from feedbench.scan.sizing import loader_ahead
from feedbench.scan.sources import Source, shared_index
from feedbench.scan.watch import OPENING, READING


def prepare_cache(
    name: str, files, drop: bool, beat: Callable[[], None] | None = None
) -> tuple[CacheState, list[str]]:
    """Evict before a cold pass (and say how cold it really is); leave the cache for warm.
    ``beat()`` is called for every file handled (a sign of life)."""
    warnings: list[str] = []
    if name == "warm":
        resident = cache.residency(files).fraction
        if resident < 0.95:  # a warm pass must be warm: read everything once first
            cache.warm(files, beat=beat)
            resident = cache.residency(files).fraction
            if resident < 0.95:
                warnings.append(
                    f"only {resident:.0%} of the data fits in the page cache: the warm pass is "
                    "partly cold"
                )
        return CacheState("warm", resident), warnings
    failures = cache.evict(files, beat=beat)
    if drop and not cache.drop_all_caches():
        warnings.append("--drop-caches needs root: only per-file eviction was done")
    resident = cache.residency(files).fraction
    if resident > 0.05:
        warnings.append(
            f"{resident:.0%} of the data stayed in the page cache after eviction "
            "(this filesystem ignores fadvise?): the cold pass is partly warm; try --drop-caches"
        )
    return CacheState("cold", resident, failures), warnings


@dataclass
class Consumer:
    """What one consumer process keeps across its measurements."""

    rank: int
    world: int
    local_rank: int
    workers: int
    config: ScanConfig
    source: Source
    batch_size: int
    steps: StepOptions
    device: Any = None  # this rank's GPU, where transfer or a training loader wants one
    loader: TrainingLoader | None = None  # the training loader under --loader
    # --emulate gpu: the step (a model in DDP, or timed kernels), built at the first pass
    accelerator: Any = None


def open_consumer(
    rank: int, world: int, local_rank: int, config: ScanConfig, workers: int
) -> Consumer:
    """Open the source, pick this rank's GPU and build the training loader (``--loader``)."""
    p = plan(config)
    source, _ = open_source(config)
    device = None
    mode = emulate.resolve(config.emulate, world) if p.step_s > 0 else "sleep"
    wants_gpu = "transfer" in config.stages or config.loader is not None or mode == "gpu"
    if wants_gpu and torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    timing = emulate.Timing(host_s=p.host_s, device_s=p.device_s or p.step_s, model=p.model,
                            batch_size=p.batch_size, image_size=p.image_size,
                            ddp=not config.async_steps)  # fmt: skip
    ahead = loader_ahead(config.loader, config.loader_options, workers)
    steps = StepOptions(p.step_s, not config.async_steps, config.warmup_batches, mode, timing,
                        ahead=ahead)  # fmt: skip
    loader = None
    if config.loader is not None:
        where = dict(rank=rank, world_size=world, local_rank=local_rank, workers=workers)
        # a step queued on the GPU orders the batch's copies itself: no synchronize per batch
        loader = open_loader(config, p.batch_size, device, sync_batches=mode != "gpu", **where)
    return Consumer(rank, world, local_rank, workers, config, source, p.batch_size, steps,
                    device, loader)  # fmt: skip


def open_loader(
    config: ScanConfig,
    batch_size: int,
    device: Any,
    *,
    rank: int,
    world_size: int,
    local_rank: int,
    workers: int,
    sync_batches: bool = True,
) -> TrainingLoader:
    """The training loader of ``--loader``: one of ours (``build_loader``), or the user's
    factory called with the keywords it takes (and remade per pass when it is one-shot)."""
    name = str(config.loader)
    if not is_user_spec(name):
        from loaders import SampleIndex, build_loader

        given = shared_index()  # the parent's index: not listed again here
        built = build_loader(
            SampleIndex.load(given, config.path) if given else config.path, name, batch_size,
            image_size=config.image_size, rank=rank,
            world_size=world_size, local_rank=local_rank, seed=config.seed, workers=workers,
            device=device, **config.loader_options,
        )  # fmt: skip
        if built.chosen_by:  # "auto (torch)": the backend it picked
            name = f"{name} ({built.chosen_by.split(':')[0]})"
        return TrainingLoader(built, name, close_each_pass=True, sync_batches=sync_batches,
                              settings=built.settings())  # fmt: skip
    f = factory.resolve(name)
    standard = dict(rank=rank, world_size=world_size, local_rank=local_rank,
                    batch_size=batch_size, workers=workers, seed=config.seed, epoch=0,
                    path=config.path)  # fmt: skip

    def remake(epoch: int):
        return factory.make(f, factory.call_kwargs(f, standard | {"epoch": epoch},
                                                   config.loader_options))  # fmt: skip

    def guard(e: BaseException, what: str) -> Exception:
        return factory.user_error(e, f.root, f"the loader {name} ({what})")

    return TrainingLoader(remake(0), name, guard=guard, remake=remake, sync_batches=sync_batches)


def node_rank() -> int | None:
    """This rank's node as torchrun numbers them (GROUP_RANK: its agent's rank among the
    agents), None outside torchrun. The hostname alone cannot tell nodes apart: two agents on
    one machine (a loopback test, or a host split in two) are two clients."""
    value = os.environ.get("GROUP_RANK")
    return int(value) if value is not None and value.isdigit() else None


def run_rank(
    rank: int,
    world: int,
    local_rank: int,
    config: ScanConfig,
    init_method: str,
    workers: int,
    on_measurement: Callable[[RankOutcome], None] | None = None,
    progress: Callable[[int], None] | None = None,
    on_hosts: Callable[[list[tuple[HostInfo, int | None]]], None] | None = None,
    gather_hosts: bool = False,
    on_phase: Callable[[int], None] | None = None,
) -> None:
    """One consumer process: every pass × repeat of ``config`` at this world size. With
    ``gather_hosts`` (every rank alike: torchrun, where ranks may be on several machines), rank 0
    is told each rank's host and node first (``on_hosts``, in rank order: (host, node rank),
    see :func:`node_rank`). ``on_phase(k)`` is told when
    the consumer starts :data:`feedbench.scan.watch.PHASES`\\ [k] (for the parent's stall watch)."""
    tdist.init_process_group(
        "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world,
        timeout=timedelta(minutes=30),
    )
    try:
        if gather_hosts:
            hosts: list[Any] | None = [None] * world if rank == 0 else None
            tdist.gather_object((HostInfo.current(), node_rank()), hosts, dst=0)
            if hosts is not None and on_hosts is not None:
                on_hosts(hosts)
        if on_phase is not None:
            on_phase(OPENING)
        c = open_consumer(rank, world, local_rank, config, workers)
        if on_phase is not None:
            on_phase(READING)
        epoch = 0  # one per pass × repeat
        for pass_name in config.passes:
            for repeat in range(1, config.repeat + 1):
                outcome = measure(c, pass_name, repeat, epoch, progress, on_measurement is not None)
                if outcome is not None and on_measurement is not None:
                    on_measurement(outcome)
                epoch += 1
    finally:
        with contextlib.suppress(Exception):
            tdist.destroy_process_group()


def measure(
    c: Consumer,
    pass_name: str,
    repeat: int,
    epoch: int,
    progress: Callable[[int], None] | None,
    build: bool,
) -> RankOutcome | None:
    """One measurement on every rank: cache prepared (by each host's local rank 0), a common
    start, this consumer's pass, every consumer's stats gathered. Rank 0 alone builds the
    measurement (when ``build``); the other ranks return None."""
    state, warnings = CacheState(pass_name, None), []
    # heartbeats for the parent's stall watchdog: preparing the cache, and ready to read
    beat = (lambda: progress(0)) if progress is not None else None
    if c.local_rank == 0 and not c.source.remote and len(c.source.files()):
        state, warnings = prepare_cache(pass_name, c.source.files(), c.config.drop_caches, beat)
    tdist.barrier()
    if beat is not None:
        beat()
    monitor = (
        _start_monitor(f"{c.world} consumers, {pass_name}, repeat {repeat}", c.config)
        if c.rank == 0
        else None
    )
    consumed = consume(c, epoch, progress)
    timeline = monitor.stop() if monitor is not None else None
    gathered: list[Any] | None = [None] * c.world if c.rank == 0 else None
    tdist.gather_object(consumed, gathered, dst=0)
    if gathered is None or not build:
        return None
    m = build_measurement(gathered, c.world, c.workers, pass_name, repeat, state, timeline)
    errors = [e for _, es, _ in gathered for e in es]
    return RankOutcome(m, errors, warnings)


def consume(
    c: Consumer, epoch: int, progress: Callable[[int], None] | None
) -> tuple[ConsumerStats, list[SampleError], dict[str, np.ndarray]]:
    """This consumer's pass over its units of ``epoch``, its steps synced over the world group."""
    units = consumer_units(c.source, c.rank, c.world, seed=c.config.seed, epoch=epoch)
    batches = None
    if c.loader is not None:
        c.loader.set_epoch(epoch)
        batches = c.loader.batches()
    accelerator = gpu_step(c)
    consumed = run_consumer(
        c.source,
        units,
        c.config.stages,
        rank=c.rank,
        batch_size=c.batch_size,
        workers=c.workers,
        image_size=c.config.image_size,
        seed=c.config.seed + epoch,
        steps=c.steps,
        device=c.device,
        group=tdist.group.WORLD,
        progress=progress,
        batches=batches,
        loader_name=c.loader.name if c.loader is not None else c.config.loader,
        loader_settings=c.loader.settings if c.loader is not None else None,
        accelerator=accelerator,
    )
    if c.loader is not None:
        beat = (lambda: progress(0)) if progress is not None else None
        consumed[0].loader_batches = c.loader.finish(batches, beat)
        # the loaders run ahead into the next epoch (workers, DALI's prefetch): stop them here,
        # so that nothing of the next pass is read before its cache eviction or done before its
        # clock starts; each pass starts the loader anew
        c.loader.close()
    if accelerator is not None:  # every rank alike: a model's step in DDP is a collective
        bracket_step_alone(consumed[0], accelerator)
    return consumed


def gpu_step(c: Consumer) -> Any:
    """The consumer's GPU step for this pass, its length alone measured now (no loader
    running): built at the first pass (a model: seconds), kept for the next ones. None where the
    step is a sleep (made per pass by run_consumer: it carries the pass's late wake-ups)."""
    if c.steps.emulate != "gpu" or c.steps.step_s <= 0:
        return None
    if c.accelerator is None:
        c.accelerator = make_accelerator(c.steps, c.device)  # measured alone as it is built
    else:
        c.accelerator.measure_alone()
    return c.accelerator


def _start_monitor(label: str, config: ScanConfig) -> Monitor:
    # the scan's own processes: the local scan and below (its fork server, the consumers and
    # their workers), or under torchrun this rank's parent, the agent, and below
    scan_pid = int(os.environ.get(SCAN_PID_ENV, os.getppid()))
    m = Monitor(interval_s=config.monitor_interval_s, label=label, watch_pid=scan_pid)
    m.start()
    return m
