"""The consumer loop: one consumer = one emulated GPU / DDP rank, its shard, its step loop.

A consumer iterates only its own share of the dataset (:func:`consumer_units`: DistributedSampler
semantics for image trees and data files' samples; whole shards, rank::world after a per-epoch
seeded shuffle, for tar shards). Its loader workers (torch DataLoader processes over
:class:`~feedbench.scan.stream.StageStream`, the worker side) run the CPU stages and time each
one; the consumer process waits for batches (the *data wait*), copies them to the GPU (transfer,
when CUDA is present), and takes the emulated accelerator step (a sleep, or kernels on the GPU
with ``--emulate gpu``: :mod:`feedbench.scan.emulate`). With an emulated step, steps
are synchronous across consumers by default, as in DDP: a consumer also waits for the slowest
one (the *sync wait*).

:func:`run_consumer` sets up one pass and :func:`consume_batches` runs its loop, in named steps:
:class:`~feedbench.scan.tally.Tally` (what the batches measured), :class:`StepBarrier` and
:func:`emulate_step`, :class:`Copies` (host→GPU copies), and
:func:`~feedbench.scan.tally.consumer_stats` (the tally → :class:`ConsumerStats`).
A training loader's batches come to the loop through :class:`~feedbench.scan.batches.TrainingLoader`
(``feedbench scan --loader``).

Measuring only: this module returns numbers and never renders.
"""

from __future__ import annotations

import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist
from torch.utils.data import DataLoader

from feedbench.core.clocks import HostClock
from feedbench.scan import stages as st
from feedbench.scan.emulate import GpuAccelerator, ModelAccelerator, StepOnGpu, Timing
from feedbench.scan.merge import MARKS, Clock, stage_stats
from feedbench.scan.results import ConsumerStats, SampleError, StageStats
from feedbench.scan.sources import Source
from feedbench.scan.stream import BatchTimes, StageStream
from feedbench.scan.tally import Tally, accelerator_utilisation, consumer_stats
from loaders import start_workers


def consumer_units(source: Source, rank: int, world: int, *, seed: int, epoch: int) -> np.ndarray:
    """The units (files or shards) consumer ``rank`` of ``world`` reads in ``epoch``."""
    from loaders.dist import shard_indices

    n = source.units()
    if source.kind in ("tree", "records"):  # sample by sample: files, or records in files
        return shard_indices(n, rank, world, shuffle=True, seed=seed, epoch=epoch)
    order = np.random.default_rng([seed, epoch]).permutation(n)
    return order[rank::world]


@dataclass
class StepOptions:
    step_s: float = 0.0  # emulated accelerator time per batch (0: none)
    sync: bool = True  # steps synchronous across consumers (DDP) when a step is emulated
    warmup_batches: int = 1  # at least; more while the loader starts up (scan/warmup.py)
    emulate: str = "sleep"  # emulate.MODES, resolved: "sleep" or "gpu"
    timing: Timing | None = None  # the step's host and device time (gpu: what it launches)
    ahead: int = 1  # batches the loader can have ready (one per worker; DALI's prefetch)


class StepBarrier:
    """The synchronous step's barrier over ``group``: every consumer steps only when all have a
    batch; when one runs out, all stop, as DDP ranks must (equal steps on every rank)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.flag = torch.zeros(1, dtype=torch.int32)

    def __call__(self, have: bool) -> bool:
        """True when every consumer has a batch for this step."""
        self.flag.fill_(1 if have else 0)
        tdist.all_reduce(self.flag, op=tdist.ReduceOp.MIN, group=self.group)
        return int(self.flag.item()) != 0

    def idle_cost(self, repeats: int = 20) -> float:
        """Median time of the barrier when every consumer arrives together: part of every
        measured sync wait is this cost of the emulation itself, not waiting for a slower one."""
        times = []
        for _ in range(repeats):
            tdist.barrier(group=self.group)
            t0 = time.perf_counter()
            self.flag.fill_(1)
            tdist.all_reduce(self.flag, op=tdist.ReduceOp.MIN, group=self.group)
            times.append(time.perf_counter() - t0)
        return float(np.median(times))


def emulate_step(step_s: float) -> float:
    """Sleep the emulated accelerator step once; returns the time it took (0.0 without a step)."""
    return Accelerator(step_s).step()


class Accelerator:
    """The emulated accelerator: ``step_s`` of sleep per batch, paced to the nominal rate.

    A sleep that overshoots (the process woke late: a busy host, many consumers per core) is
    taken off the next steps; otherwise the loader would get every late wake-up as extra time and
    the AU would read high exactly when the CPU is saturated. ``late_s``: all overshoot so far;
    ``owed_s``: what the next steps still have to take off.
    """

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.owed_s = self.late_s = 0.0

    def step(self) -> float:
        if self.step_s <= 0:
            return 0.0
        want = max(0.0, self.step_s - self.owed_s)
        ts = time.perf_counter()
        if want > 0:
            time.sleep(want)
        took = time.perf_counter() - ts
        self.late_s += max(0.0, took - want)
        self.owed_s = max(0.0, self.owed_s + took - self.step_s)
        return took


def timed_copy(batch: torch.Tensor, device: torch.device, clock: Clock, *, pinned: bool) -> None:
    """One host→GPU copy of ``batch``; its time, samples and bytes added to ``clock``. The
    copy is synchronised (timed alone), so the GPU's queued steps are waited for first, untimed:
    a GPU step running ahead of the host would otherwise be counted as copy time."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    tc = time.perf_counter()
    st.transfer(batch, device, pinned=pinned)
    clock.busy_s += time.perf_counter() - tc
    clock.samples += batch.shape[0]
    clock.in_bytes += batch.numel()


class Copies:
    """Host→GPU copies: from pinned memory in the loop (part of the data wait), as a training
    loader with ``pin_memory`` does; from pageable memory measured apart, after the loop."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pinned, self.pageable = Clock(), Clock()
        self.last: torch.Tensor | None = None

    def copy_pinned(self, batch: torch.Tensor) -> None:
        timed_copy(batch, self.device, self.pinned, pinned=True)
        self.last = batch

    def measure_pageable(self, repeats: int = 3) -> None:
        """Copy the last batch ``repeats`` times from pageable memory (none without a batch)."""
        if self.last is not None:
            for _ in range(repeats):
                timed_copy(self.last, self.device, self.pageable, pinned=False)

    def stats(self) -> list[StageStats]:
        return [
            stage_stats("transfer-pinned", self.pinned),
            stage_stats("transfer-pageable", self.pageable),
        ]


def stage_loader(
    source: Source,
    units: np.ndarray,
    stages: Sequence[str],
    *,
    batch_size: int,
    workers: int,
    image_size: int,
    seed: int,
) -> Iterable[tuple[Any, BatchTimes]]:
    """The consumer's units through the CPU stages: in ``workers`` forked DataLoader workers, or
    in the consumer itself with none."""
    if "augment" in stages:
        st.Augment(image_size)  # import torchvision here once, not in every forked worker
    dataset = StageStream(source, units, stages, batch_size, image_size, seed)
    if workers > 0:
        # torch warns of more workers than cores at every DataLoader and iterator, in every
        # consumer; the scan says it once in its own warnings (run.py)
        warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)
        return DataLoader(
            dataset,
            batch_size=None,
            num_workers=workers,
            prefetch_factor=2,
            persistent_workers=False,
            multiprocessing_context="fork",
        )
    # without workers the stream itself: a DataLoader in the main process only adds its
    # per-batch bookkeeping (0.2-0.7 µs a sample in a one-consumer read pass)
    return dataset


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
    loader_settings: str | None = None,
    accelerator: Any = None,
) -> tuple[ConsumerStats, list[SampleError], dict[str, np.ndarray]]:
    """Run one consumer over ``units`` once. ``group``: a torch.distributed group for synced steps.
    ``accelerator``: a GPU step kept across passes, its length alone just measured (else one
    made here from ``steps``).

    Data wait = time blocked in ``next()`` plus the pinned host→GPU copy; measured steps are those
    after ``warmup_batches``. A KeyboardInterrupt propagates to the caller. Returns the stats, the
    first errors and every read's latency (for percentiles over all consumers' reads).
    """
    steps = steps or StepOptions()
    if batches is not None:  # a training loader (feedbench scan --loader): timed end to end
        loader, stages = batches, ()
    else:
        loader = stage_loader(source, units, stages, batch_size=batch_size, workers=workers,
                              image_size=image_size, seed=seed)  # fmt: skip
    copies = Copies(device) if "transfer" in stages and device is not None else None
    sync = steps.sync and steps.step_s > 0 and group is not None
    barrier = StepBarrier(group) if sync else None
    tally = Tally(stages, steps.warmup_batches, steps.ahead)
    barrier_idle_s = barrier.idle_cost() if barrier is not None else None
    if accelerator is None:
        accelerator = make_accelerator(steps, device)
    consume_batches(loader, tally, accelerator, copies=copies, barrier=barrier, progress=progress)
    if copies is not None:
        copies.measure_pageable()  # pageable copies measured apart, not in the loop
    stats = consumer_stats(tally, rank=rank, stages=stages, copies=copies,
                           loader_name=loader_name, barrier_idle_s=barrier_idle_s)  # fmt: skip
    stats.loader_settings = loader_settings
    if steps.step_s > 0:
        on_gpu = isinstance(accelerator, StepOnGpu)
        stats.emulate = "gpu" if on_gpu else "sleep"
        if on_gpu:
            stats.step_alone_s = accelerator.idle_s
        if isinstance(accelerator, ModelAccelerator):
            stats.step_model = accelerator.timing.model
    if batches is None and source.expected is not None:  # counted by our reader's index
        stats.lost_samples = tally.lost_samples
    raw = {"read": np.asarray(tally.read_latencies, dtype=np.float32)}
    raw[MARKS] = tally.window_marks()
    return stats, tally.kept_errors, raw


def bracket_step_alone(stats: ConsumerStats, accelerator: Any) -> None:
    """After a pass, its loader stopped: the GPU step measured alone again, and its length
    alone taken as the mean of before and after. A launch-bound step's own length follows the
    host (ResNet-50 at 64 per GPU on an H200: 29.9-39.8 ms between repeats, BENCHMARKS run 11),
    so a measurement before the pass alone charges the loader with the host's drift. The
    loader's cost (the window's steps over that length, floored once) and the AU follow."""
    if stats.step_alone_s is None or not hasattr(accelerator, "measure_alone"):
        return
    before, after = stats.step_alone_s, accelerator.measure_alone()
    alone = (before + after) / 2
    stats.step_alone_s, stats.step_alone_before_s, stats.step_alone_after_s = alone, before, after
    steps = stats.batches - stats.warmup_batches  # the window's steps (Tally.stop)
    if steps <= 0:
        return
    stats.step_extra_s = max(0.0, stats.step_s - steps * alone)
    stats.au = accelerator_utilisation(
        stats.step_s - stats.step_extra_s,
        stats.data_wait_s + stats.step_extra_s,
        stats.sync_wait_s,
    )


def make_accelerator(steps: StepOptions, device: torch.device | None):
    """The emulated accelerator of ``steps``: a sleep, or kernels on ``device`` (gpu)."""
    if steps.emulate == "gpu" and steps.step_s > 0:
        if device is None or device.type != "cuda":
            raise RuntimeError("--emulate gpu needs a CUDA device in every consumer")
        timing = steps.timing or Timing(host_s=0.0, device_s=steps.step_s)
        if timing.model:
            return ModelAccelerator(timing, device)
        return GpuAccelerator(timing, device)
    return Accelerator(steps.step_s)


@dataclass
class QueuedStep:
    """One step's marks on the step's clock (host times, or CUDA events on the GPU step's
    stream), read ``clock.lag`` steps after it was queued: before ``next()``, after it (and the
    batch's copy), after the barrier, before and after the step (between those two: the
    batch's bookkeeping, in neither the waits nor the step)."""

    samples: int
    t_ready: float  # perf_counter after the barrier: when the batch was taken into a step
    pre: Any
    data: Any
    synced: Any
    start: Any
    end: Any
    took: float | None  # a sleep's own timing of itself (0 without a step); None: read the clock


class StepTimer:
    """Reads queued steps into the tally: the data wait (``pre`` → ``data``), the sync wait
    (→ ``synced``) and the step (``start`` → ``end``) on ``clock``; with CUDA events these are
    the GPU's times, so a wait the GPU did not see (a ``next()`` while it still ran the last
    step) is no wait. A step's end in host time comes from a reference event taken with the
    GPU idle."""

    def __init__(self, clock: Any, tally: Tally, idle_s: float | None) -> None:
        self.clock, self.tally, self.idle_s = clock, tally, idle_s
        self.queued: deque[QueuedStep] = deque()
        clock.sync()
        self.ref = clock.mark()
        clock.wait(self.ref)
        self.t_ref = time.perf_counter()

    def add(self, step: QueuedStep) -> None:
        self.queued.append(step)
        while len(self.queued) > self.clock.lag:
            self.read(self.queued.popleft())

    def flush(self) -> None:
        self.clock.sync()
        while self.queued:
            self.read(self.queued.popleft())

    def read(self, q: QueuedStep) -> None:
        clock = self.clock
        clock.wait(q.end)
        step = q.took if q.took is not None else clock.seconds(q.start, q.end)
        # signed: a step's own jitter (±4 ms a step at 64 per GPU on an H200) clipped at 0 step
        # by step would count half of it as the loader's (Tally.stop floors the sum instead)
        extra = step - self.idle_s if self.idle_s is not None else 0.0
        self.tally.count_step(
            q.samples, t_ready=q.t_ready, wait_s=clock.seconds(q.pre, q.data),
            sync_wait_s=clock.seconds(q.data, q.synced), step_s=step, extra_s=extra,
            t_end=self.t_ref + clock.seconds(self.ref, q.end),
        )  # fmt: skip


def consume_batches(
    loader: Iterable[tuple[Any, BatchTimes]],
    tally: Tally,
    accelerator: Accelerator | StepOnGpu | float,
    *,
    copies: Copies | None = None,
    barrier: StepBarrier | None = None,
    progress: Callable[[int], None] | None = None,
) -> None:
    """The loop: wait for the next batch (the data wait, its pinned copy included), agree on
    the step (``barrier``: the sync wait), account the batch, take the step; until one runs
    out. A sleep is timed on the host; a GPU step is queued and timed on the GPU
    (:class:`StepTimer`), the host running ahead as in training. The loader's workers start
    with the clock and stop when this returns."""
    if not isinstance(accelerator, (Accelerator, StepOnGpu)):
        accelerator = Accelerator(accelerator)  # a step length: sleep it
    # gpu: a step longer than the same step alone is the loader's cost to it
    ahead = getattr(accelerator, "ahead", False)
    clock = accelerator.clock if ahead else HostClock()
    timer = StepTimer(clock, tally, getattr(accelerator, "idle_s", None))
    tally.start()
    it = start_workers(loader)
    while True:
        pre = clock.mark()
        item = next(it, None)
        if copies is not None and item is not None and isinstance(item[0], torch.Tensor):
            copies.copy_pinned(item[0])
        data = clock.mark()
        go_on = barrier(item is not None) if barrier is not None else item is not None
        if not go_on:
            break  # synced: as soon as any consumer has run out
        t_ready, synced = time.perf_counter(), clock.mark()
        times = item[1]
        # stamped when taken into a step: with synced steps every consumer takes a batch at
        # once, so the common window (from the latest warm-up's end) cuts all consumers alike
        tally.account(times, at=t_ready)
        if progress is not None:
            progress(times.read_bytes)
        if times.samples == 0:
            continue  # a worker's tail with only errors: not a batch
        start = clock.mark()
        took = accelerator.step()
        took = None if ahead else took
        timer.add(QueuedStep(times.samples, t_ready, pre, data, synced, start, clock.mark(), took))
        if tally.batches == tally.minimum:
            accelerator.owed_s = 0.0  # the warm-up's late wake-ups are not the window's to pay
    timer.flush()
    tally.stop()
    tally.step_late_s = accelerator.late_s
