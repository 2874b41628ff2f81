"""One consumer = one emulated GPU / DDP rank: its shard, its loader workers, its step loop.

A consumer iterates only its own share of the dataset (DistributedSampler semantics for image
trees; whole shards, rank::world after a per-epoch seeded shuffle, for tar shards). Its loader
workers (torch DataLoader processes) run the CPU stages — read, decode, augment, collate — and
time each one; the consumer process waits for batches (the *data wait*), copies them to the GPU
(transfer, when CUDA is present), and sleeps the emulated accelerator step. With an emulated step,
steps are synchronous across consumers by default, as in DDP: a consumer also waits for the
slowest one (the *sync wait*).

Measuring only: this module returns numbers and never renders.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from feedbench.core.stats import percentiles
from feedbench.scan import stages as st
from feedbench.scan.merge import _Clock, _shares, _stats
from feedbench.scan.results import ConsumerStats, SampleError, StageStats
from feedbench.scan.sources import Source
from feedbench.scan.stream import KEEP_ERRORS, BatchTimes, StageStream
from loaders import start_workers

CPU_STAGES = ("read", "decode", "augment", "collate")


def accelerator_utilisation(step_s: float, data_wait_s: float, sync_wait_s: float) -> float | None:
    """AU = step / (step + data wait + sync wait); None when no step was emulated."""
    total = step_s + data_wait_s + sync_wait_s
    if step_s <= 0 or total <= 0:
        return None
    return step_s / total


def consumer_units(source: Source, rank: int, world: int, *, seed: int, epoch: int) -> np.ndarray:
    """The units (files or shards) consumer ``rank`` of ``world`` reads in ``epoch``."""
    from loaders.dist import shard_indices

    n = source.units()
    if source.kind == "tree":
        return shard_indices(n, rank, world, shuffle=True, seed=seed, epoch=epoch)
    order = np.random.default_rng([seed, epoch]).permutation(n)
    return order[rank::world]


@dataclass
class StepOptions:
    step_s: float = 0.0  # emulated accelerator time per batch (0: none)
    sync: bool = True  # steps synchronous across consumers (DDP) when a step is emulated
    warmup_batches: int = 1


def run_consumer(
    source: Source,
    units: np.ndarray,
    stages: Sequence[str],
    *,
    rank: int,
    batch_size: int,
    workers: int,
    image_size: int = 224,
    seed: int = 0,
    steps: StepOptions | None = None,
    device: torch.device | None = None,
    group: Any = None,
    progress: Callable[[int], None] | None = None,
    batches: Iterable[tuple[Any, BatchTimes]] | None = None,
    loader_name: str | None = None,
) -> tuple[ConsumerStats, list[SampleError], dict[str, np.ndarray]]:
    """Run one consumer over ``units`` once. ``group``: a torch.distributed group for synced steps.

    Data wait = time blocked in ``next()`` plus the pinned host→GPU copy; measured steps are those
    after ``warmup_batches``. A KeyboardInterrupt propagates to the caller.
    """
    steps = steps or StepOptions()
    if batches is not None:  # a training loader (feedbench scan --loader): timed end to end
        loader: Iterable[tuple[Any, BatchTimes]] = batches
        stages = ()
    else:
        if "augment" in stages:
            st.Augment(image_size)  # import torchvision here once, not in every forked worker
        dataset = StageStream(source, units, stages, batch_size, image_size, seed)
        # without workers the stream itself: a DataLoader in the main process only adds its
        # per-batch bookkeeping (0.2-0.7 µs a sample in a one-consumer read pass)
        loader = dataset
        if workers > 0:
            loader = DataLoader(
                dataset,
                batch_size=None,
                num_workers=workers,
                prefetch_factor=2,
                persistent_workers=False,
                multiprocessing_context="fork",
            )
    do_transfer = "transfer" in stages and device is not None
    sync = steps.sync and steps.step_s > 0 and group is not None
    clocks = {s: _Clock() for s in stages if s in CPU_STAGES}
    pinned, pageable = _Clock(), _Clock()
    read_latencies: list[float] = []
    errors: list[SampleError] = []
    samples = files = read_bytes = n_errors = batches = 0
    first_batch_s: float | None = None
    waits: list[float] = []
    step_total = wait_total = sync_total = 0.0
    steady_samples = 0
    t_first_end: float | None = None if steps.warmup_batches > 0 else time.perf_counter()
    last_batch: torch.Tensor | None = None
    flag = torch.zeros(1, dtype=torch.int32)
    barrier_idle_s = _barrier_cost(flag, group) if sync else None

    t_start = time.perf_counter()
    it = start_workers(loader)
    while True:
        t0 = time.perf_counter()
        try:
            payload, times = next(it)
            have = True
        except StopIteration:
            payload, times, have = None, None, False
        if have and do_transfer and isinstance(payload, torch.Tensor):
            tc = time.perf_counter()
            st.transfer(payload, device, pinned=True)
            pinned.busy_s += time.perf_counter() - tc
            pinned.samples += payload.shape[0]
            pinned.in_bytes += payload.numel()
            last_batch = payload
        t1 = time.perf_counter()
        if sync:
            import torch.distributed as tdist

            flag.fill_(1 if have else 0)
            tdist.all_reduce(flag, op=tdist.ReduceOp.MIN, group=group)
            if int(flag.item()) == 0:
                break  # someone ran out: everyone stops, as DDP ranks must (equal steps)
        elif not have:
            break
        t2 = time.perf_counter()
        assert times is not None
        # account the worker's measurements
        samples += times.samples
        files += times.files
        read_bytes += times.read_bytes
        n_errors += times.errors
        read_latencies.extend(times.read_latencies)
        for stage, busy in times.busy_s.items():
            c = clocks[stage]
            c.busy_s += busy
            c.in_bytes += times.in_bytes.get(stage, 0)
        for stage in clocks:
            if stage == "read":
                clocks[stage].samples += times.samples + times.errors
            elif stage in times.busy_s:
                clocks[stage].samples += times.samples
        for key, stage, msg in times.error_list:
            if len(errors) < KEEP_ERRORS:
                errors.append(SampleError(key, stage, msg))
        if progress is not None:
            progress(times.read_bytes)
        if times.samples == 0:
            continue  # a worker's tail with only errors: not a batch
        batches += 1
        if first_batch_s is None:
            first_batch_s = t2 - t_start
        measured = batches > steps.warmup_batches
        if steps.step_s > 0:
            ts = time.perf_counter()
            time.sleep(steps.step_s)
            step = time.perf_counter() - ts
        else:
            step = 0.0
        if measured:
            waits.append(t1 - t0)
            wait_total += t1 - t0
            sync_total += t2 - t1
            step_total += step
            steady_samples += times.samples
        elif batches == steps.warmup_batches:
            t_first_end = time.perf_counter()
    t_end = time.perf_counter()
    del it

    if do_transfer and last_batch is not None:  # pageable copies measured apart, not in the loop
        for _ in range(3):
            tc = time.perf_counter()
            st.transfer(last_batch, device, pinned=False)
            pageable.busy_s += time.perf_counter() - tc
            pageable.samples += last_batch.shape[0]
            pageable.in_bytes += last_batch.numel()

    wall_s = t_end - t_start
    stage_stats = [
        _stats(name, c, latencies=read_latencies if name == "read" else None)
        for name, c in clocks.items()
    ]
    if loader_name is not None:
        stage_stats.append(
            StageStats(
                name=f"loader:{loader_name}",
                samples=samples,
                busy_s=wall_s,
                in_bytes=0,
                samples_per_s=samples / wall_s if wall_s > 0 else 0.0,
                mb_per_s=0.0,
                share=1.0,
                latency=percentiles(waits),
                note="end to end: read, decode, augment, collate and copy inside the loader; "
                "latency = data wait per batch; bytes are not counted inside the loader",
            )
        )
    if "transfer" in stages:
        if do_transfer:
            stage_stats.append(_stats("transfer-pinned", pinned))
            stage_stats.append(_stats("transfer-pageable", pageable))
        else:
            stage_stats.append(
                StageStats("transfer", 0, 0.0, 0, 0.0, 0.0, 0.0, None, False, "no CUDA device")
            )
    _shares(stage_stats)
    steady = None
    if t_first_end is not None and steady_samples and t_end > t_first_end:
        steady = steady_samples / (t_end - t_first_end)
    stats = ConsumerStats(
        rank=rank,
        samples=samples,
        files=files,
        read_bytes=read_bytes,
        errors=n_errors,
        batches=batches,
        wall_s=wall_s,
        first_batch_s=first_batch_s,
        samples_per_s=samples / wall_s if wall_s > 0 else 0.0,
        steady_samples_per_s=steady,
        stages=stage_stats,
        step_s=step_total,
        data_wait_s=wait_total,
        sync_wait_s=sync_total,
        barrier_idle_s=barrier_idle_s,
        data_wait=percentiles(waits),
        au=accelerator_utilisation(step_total, wait_total, sync_total),
    )
    # every read's latency, for percentiles over all consumers' reads (not kept in the results)
    raw = {"read": np.asarray(read_latencies, dtype=np.float32)}
    return stats, errors, raw


def _barrier_cost(flag: torch.Tensor, group: Any, repeats: int = 20) -> float:
    """Median time of the step barrier when every consumer arrives together: part of every
    measured sync wait is this cost of the emulation itself, not waiting for a slower consumer."""
    import torch.distributed as tdist

    times = []
    for _ in range(repeats):
        tdist.barrier(group=group)
        t0 = time.perf_counter()
        flag.fill_(1)
        tdist.all_reduce(flag, op=tdist.ReduceOp.MIN, group=group)
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def loader_batches(loader: Iterable[Any]) -> Iterator[tuple[Any, BatchTimes]]:
    """Adapt a training loader's ``(images, labels)`` batches to the consumer loop.

    A batch on the GPU counts as delivered when its copies have finished (the stream is
    synchronised), so the data wait includes what training would wait for.
    """
    for batch in loader:
        images = batch[0]
        if isinstance(images, torch.Tensor) and images.is_cuda:
            torch.cuda.current_stream(images.device).synchronize()
        n = int(images.shape[0])
        yield None, BatchTimes(samples=n)
