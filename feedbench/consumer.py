"""One consumer = one emulated GPU / DDP rank: its shard, its loader workers, its step loop.

A consumer iterates only its own share of the dataset (DistributedSampler semantics for image
trees; whole shards, rank::world after a per-epoch seeded shuffle, for tar shards). Its loader
workers (torch DataLoader processes) run the CPU stages — read, decode, augment, collate — and
time each one; the consumer process waits for batches (the *data wait*), copies them to the GPU
(transfer, when CUDA is present), and sleeps the emulated accelerator step. With an emulated step,
steps are synchronous across consumers by default, as in DDP: a consumer also waits for the
slowest one (the *sync wait*).

Measuring only: this module returns numbers and never renders. ``python -m feedbench.consumer``
runs one rank under torchrun (see :func:`feedbench.run.run_under_torchrun`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from feedbench import stages as st
from feedbench.results import ConsumerStats, Percentiles, SampleError, StageStats, percentiles
from feedbench.scan.sources import Source
from loaders.base import start_workers

KEEP_ERRORS = 20
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
class BatchTimes:
    """What a loader worker measured while making one batch (crosses the process boundary)."""

    samples: int = 0
    files: int = 0
    read_bytes: int = 0
    errors: int = 0
    busy_s: dict[str, float] = field(default_factory=dict)
    in_bytes: dict[str, int] = field(default_factory=dict)
    read_latencies: list[float] = field(default_factory=list)
    error_list: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, stage: str, seconds: float, nbytes: int = 0) -> None:
        self.busy_s[stage] = self.busy_s.get(stage, 0.0) + seconds
        self.in_bytes[stage] = self.in_bytes.get(stage, 0) + nbytes


class StageStream(IterableDataset):
    """Iterates a consumer's units through the CPU stages, yielding (payload, BatchTimes).

    With DataLoader workers each worker takes every W-th unit. The payload crosses the process
    boundary only when ``collate`` is a stage (a uint8 batch tensor, as a real loader passes);
    otherwise only the measurements do — no work is added that training would not do.
    """

    def __init__(
        self,
        source: Source,
        units: np.ndarray,
        stages: Sequence[str],
        batch_size: int,
        image_size: int,
        seed: int,
    ) -> None:
        self.source = source
        self.units = np.asarray(units, dtype=np.int64)
        self.stages = tuple(stages)
        self.batch_size = batch_size
        self.image_size = image_size
        self.seed = seed

    def __iter__(self) -> Iterator[tuple[Any, BatchTimes]]:
        info = get_worker_info()
        units = self.units if info is None else self.units[info.id :: info.num_workers]
        wid = 0 if info is None else info.id
        torch.manual_seed(self.seed * 1000 + wid)
        augment = st.Augment(self.image_size) if "augment" in self.stages else None
        do_decode = "decode" in self.stages
        do_collate = "collate" in self.stages
        times = BatchTimes()
        batch: list[Any] = []
        shards = self.source.kind == "shards"
        if shards:
            times.files = len(units)

        def flush() -> tuple[Any, BatchTimes]:
            nonlocal times
            payload: Any = None
            if do_collate and batch:
                t0 = time.perf_counter()
                payload = st.collate(batch)
                times.add("collate", time.perf_counter() - t0, payload.numel())
            out = (payload, times)
            times = BatchTimes()
            batch.clear()
            return out

        # views: each sample is done with (decoded, or counted and dropped) before the next
        for raw in self.source.iter_samples(units, views=True):
            times.read_bytes += raw.read_bytes
            if not shards:
                times.files += 1
            times.add("read", raw.read_s, raw.read_bytes)
            times.read_latencies.append(raw.read_s)
            if raw.error is not None or raw.data is None:
                times.errors += 1
                if len(times.error_list) < KEEP_ERRORS:
                    times.error_list.append((raw.key, "read", raw.error or "no data"))
                continue
            item: Any = raw.data
            if do_decode:
                t0 = time.perf_counter()
                try:
                    item = st.decode(raw.data)
                except st.DecodeError as e:
                    times.errors += 1
                    if len(times.error_list) < KEEP_ERRORS:
                        times.error_list.append((raw.key, "decode", str(e)))
                    continue
                times.add("decode", time.perf_counter() - t0, len(raw.data))
            if augment is not None:
                t0 = time.perf_counter()
                item = augment(item)
                times.add("augment", time.perf_counter() - t0)
            batch.append(item if do_collate else None)
            times.samples += 1
            if times.samples == self.batch_size:
                yield flush()
        if times.samples or times.files or times.errors:
            yield flush()


@dataclass
class StepOptions:
    step_s: float = 0.0  # emulated accelerator time per batch (0: none)
    sync: bool = True  # steps synchronous across consumers (DDP) when a step is emulated
    warmup_batches: int = 1


class _Clock:
    def __init__(self) -> None:
        self.busy_s = 0.0
        self.samples = 0
        self.in_bytes = 0


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


def _stats(name: str, c: _Clock, latencies: Sequence[float] | None = None) -> StageStats:
    return StageStats(
        name=name,
        samples=c.samples,
        busy_s=c.busy_s,
        in_bytes=c.in_bytes,
        samples_per_s=c.samples / c.busy_s if c.busy_s > 0 else 0.0,
        mb_per_s=c.in_bytes / c.busy_s / 1e6 if c.busy_s > 0 else 0.0,
        share=0.0,
        latency=percentiles(latencies) if latencies is not None else None,
    )


def _shares(stats: list[StageStats]) -> None:
    """Each stage's share of the pipeline's busy time (pageable copies are measured apart)."""
    counted = [s for s in stats if s.available and s.name != "transfer-pageable"]
    total = sum(s.busy_s for s in counted)
    for s in counted:
        s.share = s.busy_s / total if total > 0 else 0.0


def merge_stages(
    per_consumer: Sequence[Sequence[StageStats]],
    latencies: dict[str, np.ndarray] | None = None,
) -> list[StageStats]:
    """Sum stage busy time, samples and bytes over consumers; rates are per worker (per core).

    Latency percentiles come from ``latencies`` (every consumer's raw values for a stage, pooled)
    when given; otherwise each percentile is the worst consumer's (an upper bound)."""
    order: list[str] = []
    acc: dict[str, _Clock] = {}
    lat: dict[str, list[Percentiles]] = {}
    unavailable: dict[str, StageStats] = {}
    for stats in per_consumer:
        for s in stats:
            if not s.available:
                unavailable.setdefault(s.name, s)
                if s.name not in order:
                    order.append(s.name)
                continue
            if s.name not in acc:
                acc[s.name] = _Clock()
                if s.name not in order:
                    order.append(s.name)
            c = acc[s.name]
            c.busy_s += s.busy_s
            c.samples += s.samples
            c.in_bytes += s.in_bytes
            if s.latency is not None:
                lat.setdefault(s.name, []).append(s.latency)
    out: list[StageStats] = []
    for name in order:
        if name in unavailable and name not in acc:
            out.append(unavailable[name])
            continue
        merged = _stats(name, acc[name])
        pooled = (latencies or {}).get(name)
        if pooled is not None and len(pooled):
            merged.latency = percentiles(pooled)
        elif lat.get(name):  # percentiles of percentiles are not percentiles: report the worst
            ps = lat[name]
            merged.latency = Percentiles(
                max(p.p50_s for p in ps),
                max(p.p95_s for p in ps),
                max(p.p99_s for p in ps),
                max(p.max_s for p in ps),
            )
        out.append(merged)
    _shares(out)
    return out


if __name__ == "__main__":  # torchrun entry: python -m feedbench.consumer PATH [scan options]
    from feedbench.cli import torchrun_main

    torchrun_main()
