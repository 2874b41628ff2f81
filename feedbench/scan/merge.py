"""Merging per-consumer stats: stage statistics summed over consumers, and one
:class:`Measurement` per measured configuration (built by rank 0 from every consumer's stats).

:class:`Clock` and :func:`stage_stats` turn busy time into a stage's statistics for one consumer
(:mod:`feedbench.scan.consumer`) and for the merged result alike."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from feedbench.core.stats import Percentiles, percentiles
from feedbench.scan.results import (
    KEEP_NAMES,
    ConsumerStats,
    Measurement,
    NodeRates,
    StageStats,
)

MARKS = "window_marks"  # the raw key of a consumer's steady-window items (not a stage)


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


@dataclass
class Window:
    """The window every consumer was measuring in (the latest start of their steady windows to
    the earliest end) and what they delivered inside it, all consumers together."""

    start: float
    length_s: float
    samples: int
    read_bytes: int
    files: int
    overlap: float  # length ÷ the mean of the consumers' own windows


def common_window(stats: Sequence[ConsumerStats], marks: dict[int, np.ndarray]) -> Window | None:
    """The common window of ``stats`` (consumers), counting each one's ``marks`` (rows:
    delivered at, samples, bytes, files; by rank) inside it; fills each consumer's
    ``common_batches`` and ``common_samples``. Where the windows do not overlap, their span
    (first start to last end) with every mark, at overlap 0: one window still, never a sum of
    rates, and not judged. None when a consumer had no window."""
    spans = [(s.window_start, s.window_end) for s in stats]
    if not stats or any(a is None or b is None for a, b in spans):
        return None
    starts = [a for a, _ in spans if a is not None]
    ends = [b for _, b in spans if b is not None]
    start, end = max(starts), min(ends)
    apart = end <= start
    if apart:
        start, end = min(starts), max(ends)
    total = np.zeros(3)
    for s in stats:
        rows = marks.get(s.rank, np.zeros((0, 4)))
        inside = rows[(rows[:, 0] > start) & (rows[:, 0] <= end)]
        total += inside[:, 1:].sum(axis=0)
        s.common_batches = 0 if apart else int(np.count_nonzero(inside[:, 1]))
        s.common_samples = 0 if apart else int(inside[:, 1].sum())
        s.common_read_bytes = 0 if apart else int(inside[:, 2].sum())
    mean_own = float(np.mean([b - a for a, b in zip(starts, ends, strict=True)]))
    n, nbytes, nfiles = (int(x) for x in total)
    overlap = 0.0 if apart else (end - start) / mean_own
    return Window(start, end - start, n, nbytes, nfiles, overlap)


@dataclass
class Gap:
    """The longest time a consumer went without a batch in its steady window."""

    seconds: float
    rank: int
    at: float  # when it began, seconds since the epoch
    median_s: float  # the median time between batches, all consumers


def longest_gap(stats: Sequence[ConsumerStats], marks: dict[int, np.ndarray]) -> Gap | None:
    """The longest wait between batches (window start and end included) of any consumer; a
    stall shorter than the watchdog's timeout shows here. None without a window."""
    best: Gap | None = None
    gaps = []
    for s in stats:
        if s.window_start is None or s.window_end is None:
            continue
        rows = marks.get(s.rank, np.zeros((0, 4)))
        t = np.concatenate([[s.window_start], np.sort(rows[rows[:, 1] > 0, 0]), [s.window_end]])
        d = np.diff(t)
        gaps.append(d)
        i = int(np.argmax(d))
        if best is None or d[i] > best.seconds:
            best = Gap(float(d[i]), s.rank, float(t[i]), 0.0)
    if best is not None:
        best.median_s = float(np.median(np.concatenate(gaps)))
    return best


def pass_span(stats: Sequence[ConsumerStats]) -> float:
    """The whole pass: the first consumer's start to the last one's end (the longest
    consumer's own time where the starts were not recorded)."""
    starts = [s.started_at for s in stats]
    if any(t is None for t in starts):
        return max(s.wall_s for s in stats)
    ends = [s.started_at + s.wall_s for s in stats if s.started_at is not None]
    return max(ends) - min(t for t in starts if t is not None)


def build_measurement(gathered, world, workers, pass_name, repeat, state, timeline) -> Measurement:
    """One measurement from every consumer's ``(stats, errors, raw latencies)``, as gathered.
    Its steady rates are over the consumers' common window (:func:`common_window`)."""
    stats = sorted((s for s, _, _ in gathered), key=lambda s: s.rank)
    pooled = {
        name: np.concatenate([raw[name] for _, _, raw in gathered if name in raw])
        for name in {n for _, _, raw in gathered for n in raw if n != MARKS}
    }
    marks = {s.rank: raw.get(MARKS, np.zeros((0, 4))) for s, _, raw in gathered}
    w = common_window(stats, marks)
    gap = longest_gap(stats, marks)
    first_start = min((s.started_at for s in stats if s.started_at is not None), default=None)
    wall = pass_span(stats)
    samples = sum(s.samples for s in stats)
    read_bytes = sum(s.read_bytes for s in stats)
    files = sum(s.files for s in stats)
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
        failed_files=sum(s.failed_files for s in stats),
        failed_names=[name for s in stats for name in s.failed_names][:KEEP_NAMES],
        lost_samples=_total([s.lost_samples for s in stats]),
        batches=sum(s.batches for s in stats),
        wall_s=wall,
        first_batch_s=max(firsts) if firsts else None,
        samples_per_s=samples / wall if wall > 0 else 0.0,
        steady_samples_per_s=w.samples / w.length_s if w else None,
        mb_per_s=read_bytes / wall / 1e6 if wall > 0 else 0.0,
        files_per_s=files / wall if wall > 0 else 0.0,
        steady_mb_per_s=w.read_bytes / w.length_s / 1e6 if w else None,
        steady_files_per_s=w.files / w.length_s if w else None,
        window_s=w.length_s if w else None,
        window_samples=w.samples if w else None,
        window_read_bytes=w.read_bytes if w else None,
        window_files=w.files if w else None,
        window_overlap=w.overlap if w else None,
        longest_gap_s=gap.seconds if gap else None,
        longest_gap_rank=gap.rank if gap else None,
        longest_gap_at_s=gap.at - first_start if gap and first_start is not None else None,
        median_gap_s=gap.median_s if gap else None,
        stages=merge_stages([s.stages for s in stats], pooled),
        cache=state,
        per_consumer=stats,
        au_mean=float(np.mean(aus)) if aus else None,
        au_min=float(min(aus)) if aus else None,
        monitor=timeline,
    )


def _total(counts: Sequence[int | None]) -> int | None:
    """The sum of counts every consumer knew; None where one did not."""
    return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)


def node_rates(m: Measurement, nodes: dict[int, tuple[int, str]]) -> list[NodeRates]:
    """Each node's share of ``m``'s common window (``nodes``: rank → (node rank, hostname)):
    its ranks' samples and bytes inside the window over the window's length, so the nodes sum
    to the aggregate. Empty where the windows did not overlap (no common window to share) or a
    rank's share was not recorded."""
    shares = [(c.rank, c.common_samples, c.common_read_bytes) for c in m.per_consumer]
    if (
        not m.window_s
        or not m.window_overlap
        or any(n is None or b is None or r not in nodes for r, n, b in shares)
    ):
        return []
    out: dict[int, NodeRates] = {}
    for rank, n, b in sorted(shares):
        node, host = nodes[rank]
        r = out.setdefault(node, NodeRates(node, host, [], 0, 0, 0.0, 0.0))
        r.ranks.append(rank)
        r.window_samples += n or 0
        r.window_read_bytes += b or 0
    for r in out.values():
        r.samples_per_s = r.window_samples / m.window_s
        r.mb_per_s = r.window_read_bytes / m.window_s / 1e6
    return [out[k] for k in sorted(out)]
