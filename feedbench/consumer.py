"""One consumer: iterate its share of a source through the chosen stages, timing every stage.

Measuring only: this module returns numbers and never renders.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from feedbench import stages as st
from feedbench.results import CacheState, PassResult, Percentiles, SampleError, StageStats
from feedbench.sources import Source

ProgressFn = Callable[[int, int], None]  # (samples done, bytes read) increments


def percentiles(values: Sequence[float]) -> Percentiles | None:
    if len(values) == 0:
        return None
    a = np.asarray(values, dtype=np.float64)
    p50, p95, p99 = np.percentile(a, [50, 95, 99])
    return Percentiles(float(p50), float(p95), float(p99), float(a.max()))


@dataclass
class _StageClock:
    busy_s: float = 0.0
    samples: int = 0
    in_bytes: int = 0
    latencies: list[float] = field(default_factory=list)

    def add(self, seconds: float, samples: int = 1, nbytes: int = 0, keep: bool = False) -> None:
        self.busy_s += seconds
        self.samples += samples
        self.in_bytes += nbytes
        if keep:
            self.latencies.append(seconds)


@dataclass
class PassOutcome:
    result: PassResult
    errors: list[SampleError]


def run_pass(
    source: Source,
    units: Sequence[int],
    stages: Sequence[str],
    *,
    name: str,
    batch_size: int,
    cache: CacheState,
    image_size: int = 224,
    progress: ProgressFn | None = None,
    keep_errors: int = 20,
) -> PassOutcome:
    """Iterate ``units`` of ``source`` once through ``stages``; return the timed pass.

    A KeyboardInterrupt ends the pass early: what was measured is returned, marked partial.
    """
    clocks = {s: _StageClock() for s in stages}
    transfer_ok = "transfer" in stages and st.cuda_available()
    pageable = _StageClock()
    augment = st.Augment(image_size) if "augment" in stages else None
    device = None
    if transfer_ok:
        import torch

        device = torch.device("cuda", torch.cuda.current_device())

    errors: list[SampleError] = []
    n_errors = 0
    samples = 0
    read_bytes = 0
    files = 0 if source.kind == "tree" else len(units)
    batch: list = []
    batches = 0
    first_batch_s: float | None = None
    partial = False

    def finish_batch() -> None:
        nonlocal batches, first_batch_s
        if "collate" in clocks:
            t0 = time.perf_counter()
            tensor = st.collate(batch)
            clocks["collate"].add(time.perf_counter() - t0, len(batch), tensor.numel())
            if transfer_ok and device is not None:
                t0 = time.perf_counter()
                st.transfer(tensor, device, pinned=True)
                clocks["transfer"].add(time.perf_counter() - t0, len(batch), tensor.numel())
                t0 = time.perf_counter()
                st.transfer(tensor, device, pinned=False)
                pageable.add(time.perf_counter() - t0, len(batch), tensor.numel())
        batches += 1
        if first_batch_s is None:
            first_batch_s = time.perf_counter() - t_start
        batch.clear()

    t_start = time.perf_counter()
    t_first_end = t_start
    samples_after_first = 0
    try:
        for raw in source.iter_samples(units):
            read_bytes += raw.read_bytes
            if source.kind == "tree":
                files += 1
            clocks["read"].add(raw.read_s, 1, raw.read_bytes, keep=True)
            if raw.error is not None or raw.data is None:
                n_errors += 1
                if len(errors) < keep_errors:
                    errors.append(SampleError(raw.key, "read", raw.error or "no data"))
                if progress:
                    progress(0, raw.read_bytes)
                continue
            item: object = raw.data
            if "decode" in clocks:
                t0 = time.perf_counter()
                try:
                    item = st.decode(raw.data)
                except st.DecodeError as e:
                    n_errors += 1
                    if len(errors) < keep_errors:
                        errors.append(SampleError(raw.key, "decode", str(e)))
                    if progress:
                        progress(0, raw.read_bytes)
                    continue
                clocks["decode"].add(time.perf_counter() - t0, 1, len(raw.data))
            if augment is not None:
                t0 = time.perf_counter()
                item = augment(item)  # type: ignore[arg-type]
                clocks["augment"].add(time.perf_counter() - t0, 1)
            batch.append(item)
            samples += 1
            if first_batch_s is not None:
                samples_after_first += 1
            if len(batch) == batch_size:
                finish_batch()
                if batches == 1:
                    t_first_end = time.perf_counter()
            if progress:
                progress(1, raw.read_bytes)
        if batch:
            finish_batch()
            if batches == 1:
                t_first_end = time.perf_counter()
    except KeyboardInterrupt:
        partial = True
    wall_s = time.perf_counter() - t_start

    total_busy = sum(c.busy_s for c in clocks.values()) or 1.0
    stage_stats = []
    for s, c in clocks.items():
        if s == "transfer" and not transfer_ok:
            stage_stats.append(
                StageStats(s, 0, 0.0, 0, 0.0, 0.0, 0.0, None, False, "no CUDA device")
            )
            continue
        label = "transfer-pinned" if s == "transfer" else s
        stage_stats.append(_stats(label, c, total_busy, latency=(s == "read")))
    if transfer_ok:
        stage_stats.append(_stats("transfer-pageable", pageable, total_busy, latency=False))

    steady_window = wall_s - (t_first_end - t_start)
    steady = None
    if samples_after_first > 0 and steady_window > 0:
        steady = samples_after_first / steady_window
    result = PassResult(
        name=name,
        consumers=1,
        samples=samples,
        files=files,
        read_bytes=read_bytes,
        errors=n_errors,
        wall_s=wall_s,
        first_batch_s=first_batch_s,
        samples_per_s=samples / wall_s if wall_s > 0 else 0.0,
        steady_samples_per_s=steady,
        mb_per_s=read_bytes / wall_s / 1e6 if wall_s > 0 else 0.0,
        files_per_s=files / wall_s if wall_s > 0 else 0.0,
        batches=batches,
        stages=stage_stats,
        cache=cache,
        partial=partial,
    )
    return PassOutcome(result, errors)


def _stats(name: str, c: _StageClock, total_busy: float, *, latency: bool) -> StageStats:
    rate = c.samples / c.busy_s if c.busy_s > 0 else 0.0
    return StageStats(
        name=name,
        samples=c.samples,
        busy_s=c.busy_s,
        in_bytes=c.in_bytes,
        samples_per_s=rate,
        mb_per_s=c.in_bytes / c.busy_s / 1e6 if c.busy_s > 0 else 0.0,
        share=c.busy_s / total_busy,
        latency=percentiles(c.latencies) if latency else None,
    )
