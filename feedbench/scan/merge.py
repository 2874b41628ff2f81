"""Merging per-consumer stats: stage statistics summed over consumers, and one
:class:`Measurement` per measured configuration (built by rank 0 from every consumer's stats).

:class:`Clock` and :func:`stage_stats` turn busy time into a stage's statistics for one consumer
(:mod:`feedbench.scan.consumer`) and for the merged result alike."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from feedbench.core.stats import Percentiles, percentiles
from feedbench.scan.results import Measurement, StageStats


class Clock:
    """A stage's busy time, samples and input bytes, added up."""

    def __init__(self) -> None:
        self.busy_s = 0.0
        self.samples = 0
        self.in_bytes = 0


def stage_stats(name: str, c: Clock, latencies: Sequence[float] | None = None) -> StageStats:
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


def set_shares(stats: list[StageStats]) -> None:
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
    acc: dict[str, Clock] = {}
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
                acc[s.name] = Clock()
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
        merged = stage_stats(name, acc[name])
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
    set_shares(out)
    return out


def build_measurement(gathered, world, workers, pass_name, repeat, state, timeline) -> Measurement:
    """One measurement from every consumer's ``(stats, errors, raw latencies)``, as gathered."""
    stats = sorted((s for s, _, _ in gathered), key=lambda s: s.rank)
    pooled = {
        name: np.concatenate([raw[name] for _, _, raw in gathered if name in raw])
        for name in {n for _, _, raw in gathered for n in raw}
    }
    wall = max(s.wall_s for s in stats)
    samples = sum(s.samples for s in stats)
    read_bytes = sum(s.read_bytes for s in stats)
    files = sum(s.files for s in stats)
    steady = [s.steady_samples_per_s for s in stats]
    windows = [s.steady_s for s in stats]
    windowed = all(w for w in windows)
    aus = [s.au for s in stats if s.au is not None]
    firsts = [s.first_batch_s for s in stats if s.first_batch_s is not None]
    return Measurement(
        consumers=world,
        workers=workers,
        pass_name=pass_name,
        repeat=repeat,
        samples=samples,
        files=files,
        read_bytes=read_bytes,
        errors=sum(s.errors for s in stats),
        batches=sum(s.batches for s in stats),
        wall_s=wall,
        first_batch_s=max(firsts) if firsts else None,
        samples_per_s=samples / wall if wall > 0 else 0.0,
        steady_samples_per_s=float(sum(steady)) if all(x is not None for x in steady) else None,
        mb_per_s=read_bytes / wall / 1e6 if wall > 0 else 0.0,
        files_per_s=files / wall if wall > 0 else 0.0,
        steady_mb_per_s=sum(s.steady_read_bytes / s.steady_s for s in stats) / 1e6
        if windowed
        else None,
        steady_files_per_s=sum(s.steady_files / s.steady_s for s in stats) if windowed else None,
        stages=merge_stages([s.stages for s in stats], pooled),
        cache=state,
        per_consumer=stats,
        au_mean=float(np.mean(aus)) if aus else None,
        au_min=float(min(aus)) if aus else None,
        monitor=timeline,
    )
