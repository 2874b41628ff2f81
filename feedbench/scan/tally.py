"""What one consumer's batches measured (:class:`Tally`) and its stats from them
(:func:`consumer_stats`: stage statistics, rates, the AU), apart from the loop that feeds them
(:mod:`feedbench.scan.consumer`). Measuring only: numbers, never rendering."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from feedbench.core.stats import percentiles
from feedbench.scan.merge import Clock, set_shares, stage_stats
from feedbench.scan.results import KEEP_NAMES, ConsumerStats, SampleError, StageStats
from feedbench.scan.stream import KEEP_ERRORS, BatchTimes
from feedbench.scan.warmup import least_warmup, warmup_end

if TYPE_CHECKING:
    from feedbench.scan.consumer import Copies

CPU_STAGES = ("read", "decode", "augment", "collate")


def accelerator_utilisation(step_s: float, data_wait_s: float, sync_wait_s: float) -> float | None:
    """AU = step / (step + data wait + sync wait); None when no step was emulated."""
    total = step_s + data_wait_s + sync_wait_s
    if step_s <= 0 or total <= 0:
        return None
    return step_s / total


class Tally:
    """What one consumer's batches measured: counts, per-stage busy time, read latencies, the
    first errors, and the step accounting (data wait, sync wait, step) after the warm-up.

    The warm-up is decided when the pass ends (:func:`~feedbench.scan.warmup.warmup_end`): at
    least ``warmup_batches`` and ``ahead``, more while the loader is still starting up; until
    then every batch's step and every delivered item is kept."""

    def __init__(self, stages: Sequence[str], warmup_batches: int, ahead: int = 1) -> None:
        self.warmup_batches = warmup_batches  # at least; ``warmup`` after stop(): what it took
        self.minimum = least_warmup(warmup_batches, ahead)
        self.ahead = ahead
        self.clocks = {s: Clock() for s in stages if s in CPU_STAGES}
        self.samples = self.files = self.read_bytes = self.errors = self.batches = 0
        self.failed_files = 0
        self.failed_names: list[str] = []  # the first few failed shards
        self.lost_samples = 0  # their samples after the error, by the index
        self.read_latencies: list[float] = []
        self.kept_errors: list[SampleError] = []
        self.first_batch_s: float | None = None
        self.waits: list[float] = []  # data wait per measured batch
        self.step_s = self.data_wait_s = self.sync_wait_s = 0.0
        self.step_late_s = 0.0  # the emulated steps' sleep overshoot (taken off later steps)
        # gpu steps' time beyond the step's idle length, summed signed over the window (a
        # step's own jitter either way cancels) and then floored at 0: the loader's cost to it
        self.step_extra_s = 0.0
        self.steady_samples = 0
        self.steady_bytes = self.steady_files = 0  # read in the steady window (errors too)
        self.t_start = self.t_end = time.perf_counter()
        self.t_first_end: float | None = None  # the steady window's start (stop() sets it)
        self.warmup, self.settled = 0, True  # the warm-up taken (stop() decides it)
        # every batch's step: (ready at, step ended at, data wait, sync wait, step, the gpu
        # step's extra time, samples)
        self.steps: list[tuple[float, float, float, float, float, float, int]] = []
        # every item delivered: (delivered at, samples, bytes, files), so that the measurement
        # can count what fell inside the window all consumers share (the steady window's only,
        # after stop())
        self.marks: list[tuple[float, int, int, int]] = []
        # perf_counter → seconds since the epoch: one clock for every consumer of the host
        self.epoch_offset = time.time() - time.perf_counter()

    def start(self) -> None:
        self.t_start = time.perf_counter()

    def stop(self) -> None:
        """End the pass: decide the warm-up and count what came after it."""
        self.t_end = time.perf_counter()
        ready = [s[0] for s in self.steps]
        self.warmup, self.settled = warmup_end(ready, self.t_start, self.warmup_batches, self.ahead)
        if self.warmup > len(self.steps):  # only warm-up batches: no steady window
            self.t_first_end, self.marks = None, []
            return
        self.t_first_end = self.steps[self.warmup - 1][1] if self.warmup else self.t_start
        for _, _, wait_s, sync_wait_s, step_s, extra_s, samples in self.steps[self.warmup :]:
            self.waits.append(wait_s)
            self.data_wait_s += wait_s
            self.sync_wait_s += sync_wait_s
            self.step_s += step_s
            self.step_extra_s += extra_s
            self.steady_samples += samples
        self.step_extra_s = max(0.0, self.step_extra_s)
        self.marks = [m for m in self.marks if m[0] > self.t_first_end]
        self.steady_bytes = sum(m[2] for m in self.marks)
        self.steady_files = sum(m[3] for m in self.marks)

    @property
    def wall_s(self) -> float:
        return self.t_end - self.t_start

    def account(self, times: BatchTimes, at: float | None = None) -> None:
        """Add a loader worker's measurements of one batch (an errors-only tail included),
        delivered ``at`` (perf_counter; now when not given)."""
        self.samples += times.samples
        self.files += times.files
        self.read_bytes += times.read_bytes
        when = time.perf_counter() if at is None else at
        self.marks.append((when, times.samples, times.read_bytes, times.files))
        self.errors += times.errors
        self.failed_files += times.failed_files
        self.lost_samples += times.lost_samples
        room = KEEP_NAMES - len(self.failed_names)
        if room > 0:
            self.failed_names.extend(times.failed_names[:room])
        self.read_latencies.extend(times.read_latencies)
        clocks = self.clocks
        for stage, busy in times.busy_s.items():
            c = clocks[stage]
            c.busy_s += busy
            c.in_bytes += times.in_bytes.get(stage, 0)
        for stage, c in clocks.items():
            if stage == "read":
                c.samples += times.samples + times.errors
            elif stage in times.busy_s:
                c.samples += times.samples
        for key, stage, msg in times.error_list:
            if len(self.kept_errors) < KEEP_ERRORS:
                self.kept_errors.append(SampleError(key, stage, msg))

    def count_step(
        self,
        samples: int,
        *,
        t_ready: float,
        wait_s: float,
        sync_wait_s: float,
        step_s: float,
        extra_s: float = 0.0,
        t_end: float | None = None,
    ) -> None:
        """Count one delivered batch of ``samples`` and its step (called after the step);
        ``t_ready``: when it was ready, after the barrier; ``t_end``: when its step ended
        (perf_counter; now when not given). Whether it is a warm-up batch is decided at
        stop()."""
        self.batches += 1
        if self.first_batch_s is None:
            self.first_batch_s = t_ready - self.t_start
        ended = time.perf_counter() if t_end is None else t_end
        self.steps.append((t_ready, ended, wait_s, sync_wait_s, step_s, extra_s, samples))

    @property
    def steady_s(self) -> float | None:
        """The steady window: from the end of the warm-up batches to the end; None when it
        holds no measured batch."""
        if self.t_first_end is None or not self.steady_samples or self.t_end <= self.t_first_end:
            return None
        return self.t_end - self.t_first_end

    @property
    def steady_samples_per_s(self) -> float | None:
        """Samples per second after the warm-up batches; None when nothing was measured."""
        window = self.steady_s
        return self.steady_samples / window if window else None

    def window_marks(self) -> np.ndarray:
        """The steady window's items as rows (delivered at, samples, bytes, files), times in
        seconds since the epoch (comparable between the consumers of a host)."""
        out = np.asarray(self.marks, dtype=np.float64).reshape(-1, 4)
        out[:, 0] += self.epoch_offset
        return out

    @property
    def window(self) -> tuple[float, float] | None:
        """The steady window's (start, end) in seconds since the epoch; None without one."""
        if self.steady_s is None or self.t_first_end is None:
            return None
        return self.t_first_end + self.epoch_offset, self.t_end + self.epoch_offset


def consumer_stats(
    tally: Tally,
    *,
    rank: int,
    stages: Sequence[str],
    copies: Copies | None,
    loader_name: str | None,
    barrier_idle_s: float | None,
) -> ConsumerStats:
    """The consumer's stats from its tally: stage statistics (a training loader's as one stage)
    with their shares, rates over the wall time and after the warm-up, and the AU."""
    wall_s = tally.wall_s
    stats = [
        stage_stats(name, c, latencies=tally.read_latencies if name == "read" else None)
        for name, c in tally.clocks.items()
    ]
    if loader_name is not None:
        stats.append(_loader_stage(loader_name, tally))
    if "transfer" in stages:
        if copies is not None:
            stats.extend(copies.stats())
        else:
            stats.append(
                StageStats("transfer", 0, 0.0, 0, 0.0, 0.0, 0.0, None, False, "no CUDA device")
            )
    set_shares(stats)
    return ConsumerStats(
        rank=rank,
        samples=tally.samples,
        files=tally.files,
        read_bytes=tally.read_bytes,
        errors=tally.errors,
        failed_files=tally.failed_files,
        failed_names=list(tally.failed_names),
        batches=tally.batches,
        wall_s=wall_s,
        first_batch_s=tally.first_batch_s,
        samples_per_s=tally.samples / wall_s if wall_s > 0 else 0.0,
        steady_samples_per_s=tally.steady_samples_per_s,
        warmup_batches=tally.warmup,
        warmup_settled=tally.settled,
        steady_s=tally.steady_s,
        window_start=tally.window[0] if tally.window else None,
        window_end=tally.window[1] if tally.window else None,
        started_at=tally.t_start + tally.epoch_offset,
        steady_samples=tally.steady_samples,
        steady_read_bytes=tally.steady_bytes,
        steady_files=tally.steady_files,
        stages=stats,
        step_s=tally.step_s,
        step_late_s=tally.step_late_s,
        step_extra_s=tally.step_extra_s,
        data_wait_s=tally.data_wait_s,
        sync_wait_s=tally.sync_wait_s,
        barrier_idle_s=barrier_idle_s,
        data_wait=percentiles(tally.waits),
        # the step's own length over it with the loader's cost to it and the waits
        au=accelerator_utilisation(
            tally.step_s - tally.step_extra_s,
            tally.data_wait_s + tally.step_extra_s,
            tally.sync_wait_s,
        ),
    )


def _loader_stage(name: str, tally: Tally) -> StageStats:
    """A training loader timed end to end, as one stage over the consumer's wall time."""
    wall_s = tally.wall_s
    return StageStats(
        name=f"loader:{name}",
        samples=tally.samples,
        busy_s=wall_s,
        in_bytes=tally.read_bytes,
        samples_per_s=tally.samples / wall_s if wall_s > 0 else 0.0,
        mb_per_s=tally.read_bytes / wall_s / 1e6 if wall_s > 0 else 0.0,
        share=1.0,
        latency=percentiles(tally.waits),
        note="end to end: read, decode, augment, collate and copy inside the loader; "
        "latency = data wait per batch; bytes = storage reads of the consumer and its workers "
        "(I/O counters); files are not counted",
    )
