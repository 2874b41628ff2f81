"""The scan results file: one :class:`ScanResult` (an envelope, :mod:`feedbench.core.envelope`)
holding every measurement, the scaling curve and the verdict."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from feedbench.core import envelope
from feedbench.core.envelope import DatasetInfo, Envelope, HostInfo
from feedbench.core.stats import Percentiles
from feedbench.core.timeline import Timeline

KIND = "scan"
KEEP_NAMES = 5  # failed shards named per consumer and measurement (the rest counted)


@dataclass
class StageStats:
    """One stage within a pass. ``samples_per_s`` is the stage's own rate: samples / busy s."""

    name: str
    samples: int
    busy_s: float
    in_bytes: int
    samples_per_s: float
    mb_per_s: float  # in_bytes / busy_s / 1e6
    share: float  # busy_s / sum of all stages' busy_s
    latency: Percentiles | None = None
    available: bool = True
    note: str | None = None


@dataclass
class SampleError:
    key: str
    stage: str
    message: str


@dataclass
class CacheState:
    mode: str  # "cold" (evicted before the pass) or "warm" (left as it was)
    resident_before: float | None  # fraction of dataset bytes in the page cache before the pass
    evict_failures: int = 0


@dataclass
class ConsumerStats:
    """One consumer (one emulated GPU / rank) in one measurement."""

    rank: int
    samples: int
    files: int
    read_bytes: int
    errors: int
    batches: int
    wall_s: float
    first_batch_s: float | None
    samples_per_s: float
    steady_samples_per_s: float | None
    stages: list[StageStats]
    step_s: float = 0.0  # emulated accelerator time over measured (post-warm-up) steps
    step_late_s: float = 0.0  # the steps' sleep overshoot, all batches (taken off later steps)
    # --emulate gpu: measured steps' time beyond the step's length alone (the loader's cost to
    # it; counted against the AU), and which emulation ran ("sleep" or "gpu")
    step_extra_s: float = 0.0
    emulate: str | None = None
    # gpu: the step's mean length alone, before and after the pass (their mean), and each
    step_alone_s: float | None = None
    step_alone_before_s: float | None = None
    step_alone_after_s: float | None = None
    step_model: str | None = None  # gpu: the model whose real step it was (else matmuls)
    data_wait_s: float = 0.0  # time blocked waiting for the next batch, measured steps
    sync_wait_s: float = 0.0  # time waiting for the other consumers at the step barrier
    barrier_idle_s: float | None = None  # the barrier's own cost with no one late (median of 20)
    data_wait: Percentiles | None = None  # per-batch wait distribution
    au: float | None = None  # step / (step + data wait + sync wait); None without an emulated step
    # --loader of ours: what it chose (LoaderBase.settings: where it decodes, workers, cores)
    loader_settings: str | None = None
    # the steady window (after the warm-up batches) every steady rate is over, and what it held
    steady_s: float | None = None
    steady_samples: int = 0
    steady_read_bytes: int = 0  # bytes read in the window (failed samples' too)
    steady_files: int = 0
    # that window in seconds since the epoch, and what of it fell inside the window every
    # consumer of the measurement shared (Measurement.window_s); None in older files
    window_start: float | None = None
    window_end: float | None = None
    started_at: float | None = None  # the pass's start (the clock's), seconds since the epoch
    common_batches: int | None = None
    failed_files: int = 0  # shards that ended in an error before their end
    failed_names: list[str] = field(default_factory=list)  # the first few of them
    lost_samples: int | None = None  # their samples after the error (None: no index to say)
    common_samples: int | None = None
    common_read_bytes: int | None = None  # bytes read inside the common window (None: older)
    # --loader: batches the loader yielded this pass, to its end (past a synced stop); ranks
    # that differ would hang DDP
    loader_batches: int | None = None
    # the warm-up this consumer took (scan/warmup.py: at least --warmup, more while the loader
    # started up), and whether the loader reached its steady pace by half the pass; None: older
    warmup_batches: int | None = None
    warmup_settled: bool | None = None


@dataclass
class NodeRates:
    """One torchrun node (one client) in one measurement: what its ranks delivered inside the
    measurement's common window, over that window's length, so that the nodes' rates sum to
    the measurement's aggregate (``steady_samples_per_s``, ``steady_mb_per_s``)."""

    node: int  # torchrun's node rank (GROUP_RANK): two nodes on one machine are two
    hostname: str
    ranks: list[int]
    window_samples: int
    window_read_bytes: int
    samples_per_s: float
    mb_per_s: float


@dataclass
class Measurement:
    """One measured configuration: N consumers, one pass (cold/warm), one repeat."""

    consumers: int
    workers: int  # loader workers per consumer
    pass_name: str  # "cold" / "warm"
    repeat: int  # 1-based
    samples: int  # good samples through every chosen stage, all consumers
    files: int
    read_bytes: int  # bytes actually read from storage, all consumers
    errors: int
    batches: int
    wall_s: float  # the first consumer's start to the last one's end (older: the longest own)
    first_batch_s: float | None  # slowest consumer's first batch
    samples_per_s: float  # samples / wall_s
    # samples in the common window (every consumer measuring: the latest consumer's window
    # start to the earliest end) / its length; older files: the sum of per-consumer rates
    steady_samples_per_s: float | None
    mb_per_s: float
    files_per_s: float
    stages: list[StageStats]  # summed over consumers and workers
    cache: CacheState
    per_consumer: list[ConsumerStats] = field(default_factory=list)
    au_mean: float | None = None
    au_min: float | None = None
    monitor: Timeline | None = None
    partial: bool = False
    failed: str | None = None  # why this measurement is no rate: stalled, most samples failed
    # over the same common window as steady_samples_per_s
    steady_mb_per_s: float | None = None
    steady_files_per_s: float | None = None
    # the common window: its length (None: a consumer had none), what every consumer
    # delivered inside it, and its length ÷ the mean of the consumers' own windows (small: the
    # rates describe little of the run; 0: the windows did not overlap, and the window is
    # their span, first start to last end)
    window_s: float | None = None
    window_samples: int | None = None
    window_read_bytes: int | None = None
    window_files: int | None = None
    window_overlap: float | None = None
    # the longest wait for a batch in any consumer's steady window (a stall the watchdog's
    # timeout did not end), whose, when (seconds into the pass), and the median wait
    longest_gap_s: float | None = None
    longest_gap_rank: int | None = None
    longest_gap_at_s: float | None = None
    median_gap_s: float | None = None
    # shards cut short or corrupt (each lost the samples after its error, uncounted in errors)
    failed_files: int = 0
    failed_names: list[str] = field(default_factory=list)  # the first few of them, by rank
    # the samples those shards held after their error, by the index (scan --index); None
    # without one. Expected = samples + errors - failed_files + lost_samples
    lost_samples: int | None = None
    # a scan under torchrun: each node's share of the common window's aggregate, by node rank;
    # empty for a scan on one machine, in older files, and where the windows did not overlap
    per_node: list[NodeRates] = field(default_factory=list)

    def lost_text(self) -> str:
        """The samples the index expected, those that arrived and those lost, in words."""
        arrived = self.samples + self.errors - self.failed_files
        lost = self.lost_samples or 0
        return (
            f"{arrived + lost:,} samples expected, {arrived:,} arrived: {lost:,} lost in "
            f"{self.failed_files:,} shard{'s' if self.failed_files != 1 else ''} cut short or "
            "corrupt"
        )


@dataclass
class CurvePoint:
    """Repeats of one (consumers, pass) summarised: the scaling curve is a list of these."""

    consumers: int
    pass_name: str
    repeats: int
    samples_per_s_mean: float
    samples_per_s_std: float
    samples_per_s_min: float
    samples_per_s_max: float
    cv: float  # std / mean
    mb_per_s_mean: float
    efficiency: float | None  # throughput(N) / (N * throughput(1)); None without an N=1 point
    au_mean: float | None = None
    au_min: float | None = None
    rate_basis: str = "steady"  # "steady": after warm-up batches; "pass": whole pass incl. start
    workers: int | None = None  # loader workers per consumer
    files_per_s_mean: float | None = None  # over the same window as samples/s and MB/s
    speedup: float | None = None  # samples/s ÷ samples/s of one consumer (same pass)
    failed: int = 0  # repeats that failed (left out of the mean ± std)


def measured_steps(c) -> int:
    """A consumer's steps after its own warm-up batches (older files: after one), at least 1."""
    return max(c.batches - (getattr(c, "warmup_batches", None) or 1), 1)


def step_alone_moved(c) -> float:
    """Half the change of a consumer's step alone between its timings before and after the
    pass, over their sum: the share its mean (the AU's reference) may be off by where the host
    changed speed during the pass. 0 where it was timed once, or a sleep; older files' consumers
    lack the fields."""
    before = getattr(c, "step_alone_before_s", None)
    after = getattr(c, "step_alone_after_s", None)
    if not before or not after:
        return 0.0
    return abs(after - before) / (after + before)


@dataclass
class Verdict:
    # the limiting stage (read/decode/augment/collate/transfer), or "accelerator", "sync",
    # "contention" (the loader slowed the emulated step), "loader"
    bound: str
    resource: str  # storage, cpu, pcie, gpu, host, none
    text: str  # one sentence for humans
    evidence: list[str] = field(default_factory=list)
    supported_consumers: int | None = None  # largest N with AU >= target (when a step is emulated)
    feeds_accelerators: float | None = None  # throughput / accelerator appetite


NOT_VALID = "not valid for sizing"


@dataclass
class Sizing:
    """Whether a scan may size a system, and what it feeds (:mod:`feedbench.scan.sizing`)."""

    valid: bool
    broken: list[str] = field(default_factory=list)  # each rule the run breaks, in words
    accelerators_fed: float | None = None  # fractional, at the target AU (None: no step)
    accelerators_fed_std: float | None = None  # from the repeats' spread at that point
    # what that point's AU alone and its samples/s alone give; accelerators_fed is the smaller
    accelerators_fed_by_au: float | None = None
    accelerators_fed_by_rate: float | None = None
    at_consumers: int | None = None  # the consumer count that gave it
    target_au: float | None = None
    rules: dict[str, float] = field(default_factory=dict)
    # each (consumers, pass) point no figure may come from: {"consumers", "pass", "why"};
    # with a step and none judged accelerators_fed is None (older files: not recorded)
    not_judged: list[dict[str, Any]] = field(default_factory=list)

    def judged(self, consumers: int, pass_name: str) -> bool:
        return not any(
            d.get("consumers") == consumers and d.get("pass") == pass_name for d in self.not_judged
        )

    def label(self) -> str:
        return "valid for sizing" if self.valid else f"{NOT_VALID}: " + "; ".join(self.broken)


@dataclass
class RankHosts:
    """One node of a scan across machines (torchrun) and the consumer ranks it ran."""

    ranks: list[int]
    host: HostInfo
    # torchrun's node rank (GROUP_RANK): two agents on one machine are two nodes (None: older
    # files, which kept one entry per hostname)
    node: int | None = None


@dataclass(kw_only=True)
class ScanResult(Envelope):
    dataset: DatasetInfo
    measurements: list[Measurement] = field(default_factory=list)
    curve: list[CurvePoint] = field(default_factory=list)
    accelerator: dict[str, Any] | None = None  # the emulated step: profile, step_s, rate, source
    verdict: Verdict | None = None
    errors: list[SampleError] = field(default_factory=list)  # the first few, for the report
    failure: str | None = None  # why the scan stopped early (a consumer died, storage stalled)
    sizing: Sizing | None = None  # the sizing rules and accelerators fed (older files: none)
    hosts: list[RankHosts] = field(default_factory=list)  # torchrun: each node, its ranks


def load(path: str | os.PathLike[str], data: dict[str, Any] | None = None) -> ScanResult:
    return envelope.load(path, KIND, ScanResult, data)


@dataclass
class RankOutcome:
    """What rank 0 hands back for one measurement (the other ranks hand back nothing): the
    measurement built from every consumer's stats, every consumer's failed samples, and the
    warnings from preparing the cache."""

    measurement: Measurement
    errors: list[SampleError]
    warnings: list[str]
