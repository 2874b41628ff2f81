"""One consumer process: every pass × repeat of a scan at one world size, cold cache included."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from feedbench.core.errors import FeedbenchError
from feedbench.core.monitor import Monitor
from feedbench.scan import cache
from feedbench.scan.config import ScanConfig, plan
from feedbench.scan.consumer import StepOptions, consumer_units, loader_batches, run_consumer
from feedbench.scan.merge import build_measurement
from feedbench.scan.results import CacheState, Measurement, SampleError
from feedbench.scan.sources import Source, detect


def open_source(config: ScanConfig) -> tuple[Source, list[str]]:
    source, notes = detect(config.path, config.fmt)
    # THE READING THREAD (local shards) only where reading is the whole job, the storage test
    # (`--stages read`): there the tar walk must not stand in for the storage. In a pipeline a
    # worker reads in series with its other stages, as a WebDataset worker does, and each stage's
    # time stays its own (a thread would turn the read stage's time into time spent waiting and
    # "read alone would run N× faster" into a guess). The results record what was used.
    config.read_thread = bool(
        config.read_thread
        and source.kind == "shards"
        and not source.remote
        and not config.read_ahead_mb
        and tuple(config.stages) == ("read",)
        and config.loader is None
    )
    source.set_options(
        direct=config.direct,
        latency_s=config.read_latency_s,
        read_ahead=int(config.read_ahead_mb * (1 << 20)),
        read_thread=config.read_thread,
    )
    return source, notes


def _check_direct(source: Source) -> None:
    from loaders.data import read_file

    try:
        read_file(str(source.files()[0]), direct=True)
    except OSError as e:
        raise FeedbenchError(
            f"--direct: O_DIRECT reads fail on this filesystem ({e.strerror or e})"
        ) from e


def prepare_cache(name: str, files, drop: bool) -> tuple[CacheState, list[str]]:
    """Evict before a cold pass (and say how cold it really is); leave the cache for warm."""
    warnings: list[str] = []
    if name == "warm":
        resident = cache.residency(files).fraction
        if resident < 0.95:  # a warm pass must be warm: read everything once first
            cache.warm(files)
            resident = cache.residency(files).fraction
            if resident < 0.95:
                warnings.append(
                    f"only {resident:.0%} of the data fits in the page cache: the warm pass is "
                    "partly cold"
                )
        return CacheState("warm", resident), warnings
    failures = cache.evict(files)
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
class RankOutcome:
    measurement: Measurement
    errors: list[SampleError]
    warnings: list[str]


def run_rank(
    rank: int,
    world: int,
    local_rank: int,
    config: ScanConfig,
    init_method: str,
    workers: int,
    on_measurement: Callable[[RankOutcome], None] | None = None,
    progress: Callable[[int], None] | None = None,
) -> None:
    """One consumer process: every pass × repeat of ``config`` at this world size."""
    import torch
    import torch.distributed as tdist

    tdist.init_process_group(
        "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world,
        timeout=timedelta(minutes=30),
    )
    try:
        p = plan(config)
        source, _ = open_source(config)
        device = None
        wants_gpu = "transfer" in config.stages or config.loader is not None
        if wants_gpu and torch.cuda.is_available():
            device = torch.device("cuda", local_rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        steps = StepOptions(p.step_s, not config.async_steps, config.warmup_batches)
        loader = None
        if config.loader is not None:
            from loaders import build_loader

            loader = build_loader(
                config.path, config.loader, p.batch_size, image_size=config.image_size,
                rank=rank, world_size=world, local_rank=local_rank, seed=config.seed,
                workers=workers, device=device,
            )  # fmt: skip
        epoch = 0
        for pass_name in config.passes:
            for repeat in range(1, config.repeat + 1):
                state, warnings = CacheState(pass_name, None), []
                if local_rank == 0 and not source.remote:
                    state, warnings = prepare_cache(pass_name, source.files(), config.drop_caches)
                tdist.barrier()
                monitor = (
                    _start_monitor(f"{world} consumers, {pass_name}, repeat {repeat}", config)
                    if rank == 0
                    else None
                )
                units = consumer_units(source, rank, world, seed=config.seed, epoch=epoch)
                batches = None
                if loader is not None:
                    loader.set_epoch(epoch)
                    batches = loader_batches(loader)
                stats, errors, raw = run_consumer(
                    source,
                    units,
                    config.stages,
                    rank=rank,
                    batch_size=p.batch_size,
                    workers=workers,
                    image_size=config.image_size,
                    seed=config.seed + epoch,
                    steps=steps,
                    device=device,
                    group=tdist.group.WORLD,
                    progress=progress,
                    batches=batches,
                    loader_name=config.loader,
                )
                if loader is not None:
                    # the loaders run ahead into the next epoch (workers, DALI's prefetch): stop
                    # them here, so that nothing of the next pass is read before its cache
                    # eviction or done before its clock starts; each pass starts the loader anew
                    loader.close()
                timeline = monitor.stop() if monitor is not None else None
                gathered: list[Any] | None = [None] * world if rank == 0 else None
                tdist.gather_object((stats, errors, raw), gathered, dst=0)
                if rank == 0 and on_measurement is not None:
                    assert gathered is not None
                    m = build_measurement(
                        gathered, world, workers, pass_name, repeat, state, timeline
                    )
                    errs = [e for _, es, _ in gathered for e in es]
                    on_measurement(RankOutcome(m, errs, warnings))
                epoch += 1
    finally:
        with contextlib.suppress(Exception):
            tdist.destroy_process_group()


def _start_monitor(label: str, config: ScanConfig) -> Monitor:
    m = Monitor(interval_s=config.monitor_interval_s, label=label)
    m.start()
    return m
