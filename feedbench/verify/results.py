"""``feedbench verify`` results: the schema.

The file follows the one results convention (:mod:`feedbench.core.envelope`), ``kind = "verify"``,
written after every run, so an interrupted or failed verify keeps what was measured. Everything
printed or plotted is computed from a :class:`VerifyResult`.

Per step (warm-up excluded) each rank records five parts that add up to the step:

``data_wait_s + forward_backward_s + allreduce_s + optimizer_s + other_s = step_s``

``other_s`` is the remainder (loop bookkeeping): its share of the step is reported as
``unaccounted_fraction`` and stays small when the measured parts cover the step. How each part is
timed on GPU and on CPU is in :data:`TIMING` (and copied into every results file).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any

from feedbench.core import envelope
from feedbench.core.envelope import DatasetInfo, Envelope
from feedbench.core.stats import Percentiles
from feedbench.core.timeline import Timeline

KIND = "verify"

# the one list of a step's parts (the schema below must hold a column for each: checked at import)
PARTS = ("data_wait_s", "forward_backward_s", "allreduce_s", "optimizer_s", "other_s")
# seconds per step beside the parts: the step itself, all-reduce busy time, host time in next()
EXTRA_SECONDS = ("step_s", "allreduce_busy_s", "host_wait_s")
STEP_IDS = ("step", "epoch", "images")  # which step, in which epoch, with how many images

_LABELS = ("data wait", "forward + backward", "all-reduce (exposed)", "optimizer", "other")
PART_LABELS = dict(zip(PARTS, _LABELS, strict=True))  # in the order of PARTS
_SHORT = ("data", "fwd+bwd", "reduce", "optim", "other")
PART_COLUMNS = dict(zip(PARTS, _SHORT, strict=True))  # table headings, in the order of PARTS

SYNTHETIC = "synthetic"

TIMING = {
    "step": "from the end of the previous step's optimizer to the end of this one; consecutive "
    "steps share their boundary, so the steps of a rank tile its measured window",
    "data_wait": "from just before next(loader) until the batch is on the device (host→device "
    "copy and normalisation included): on GPU in GPU time between CUDA events on the training "
    "stream, i.e. how long the GPU had nothing to do because the batch was late; on CPU the "
    "host time blocked in next()",
    "forward_backward": "forward + loss (bf16 autocast on GPU) + backward, less the exposed "
    "all-reduce",
    "allreduce": "exposed gradient all-reduce: a DDP comm hook marks each bucket when it is ready "
    "and when its all-reduce completes (CUDA events on GPU, perf_counter on CPU); exposed = "
    "last completion − last bucket ready, the communication that backward could not hide. "
    "allreduce_busy_s is the union of all bucket intervals (mostly overlapped with backward, "
    "so it is not part of the sum)",
    "optimizer": "optimizer.step() + zero_grad()",
    "other": "step − (data wait + forward/backward + exposed all-reduce + optimizer): loop "
    "bookkeeping",
    "sync": "GPU: no synchronisation inside a step; events are read two steps later, so the host "
    "may run up to two steps ahead as in real training; the measured window starts after a "
    "synchronise + barrier and ends with a synchronise. CPU: perf_counter at phase boundaries",
    "images_per_s": "images of all ranks in the measured steps / the longest rank's measured "
    "window",
}


@dataclass
class PairedBlock:
    """A block of consecutive steps of the paired phase (``--interleave``): on the loader's
    batches or on a batch made on the device once (``synthetic``); per step, seconds."""

    source: str  # "loader" / "synthetic"
    images: int = 0
    step_s: list[float] = field(default_factory=list)
    data_wait_s: list[float] = field(default_factory=list)


@dataclass
class StepSeries:
    """One rank's measured steps, column by column (seconds; see :data:`TIMING`)."""

    rank: int
    step: list[int] = field(default_factory=list)  # step number counted from the first warm-up step
    epoch: list[int] = field(default_factory=list)
    images: list[int] = field(default_factory=list)
    data_wait_s: list[float] = field(default_factory=list)
    forward_backward_s: list[float] = field(default_factory=list)
    allreduce_s: list[float] = field(default_factory=list)  # exposed (not hidden by backward)
    optimizer_s: list[float] = field(default_factory=list)
    other_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    allreduce_busy_s: list[float] = field(default_factory=list)  # union of bucket intervals
    host_wait_s: list[float] = field(default_factory=list)  # host time blocked in next()
    buckets: list[int] = field(default_factory=list)  # all-reduce buckets seen per step
    warmup_step_s: list[float] = field(default_factory=list)
    primed_s: float | None = None  # the model's first steps on a made-up batch, before the loader
    # batches taken without a step at the warm-up's end (ready); as many unmeasured steps follow
    # (TimedLoop.refill), their times in warmup_step_s
    skipped_ready: int | None = None
    window_s: float | None = None  # measured window (None: the rank did not finish it)
    window_start_mono: float | None = None  # time.monotonic() of the window's ends (host clock)
    window_end_mono: float | None = None
    peak_mem_bytes: int | None = None  # torch.cuda.max_memory_allocated (GPU only)
    batches_per_epoch: int | None = None
    workers: int | None = None
    loader_settings: str | None = None  # what the library loader chose (LoaderBase.settings)
    cpus: str | None = None  # the cores this rank ran on (its affinity, e.g. "0-15")
    ddp: str | None = None  # the DDP settings this rank ran with, read back from DDP itself
    compiled: str | None = None  # torch.compile mode of this rank's model (None: eager)
    labels_synthesised: bool = False  # the user's loader yields images alone: labels made up
    image_height: int | None = None  # of the user's loader's first images
    image_width: int | None = None
    # the window's batches per loader worker, its seconds making them and, of those, waiting
    # for a batch slot (loaders.worker_clock; torch and wds backends)
    worker_batches: list[int] | None = None
    worker_make_s: list[float] | None = None
    worker_slot_wait_s: list[float] | None = None
    # after the window, with --interleave: blocks on the loader and on a synthetic batch in turn
    paired: list[PairedBlock] = field(default_factory=list)
    error: str | None = None


@dataclass
class Paired:
    """The loader's step against the synthetic step in the same process, block by block
    (``--interleave``): the host's speed drifts by more than a small batch's loss between runs
    a minute apart (BENCHMARKS.md, runs 11–13), and blocks of a few seconds in turn pair each
    loader block with the synthetic blocks either side of it. Only each block's second half
    counts: a worker's batch takes many steps to make, so the loader's work goes on into the
    synthetic block after a loader block and starts late in the next one. Per pair:
    ``slowdown`` = the loader block's work per step (its step less its data wait) − its
    neighbours' synthetic step; ``fraction`` = that synthetic step ÷ (the loader block's work +
    the window's data wait per step): the wait comes from the window because a block starts with
    whatever the loader queued during the synthetic block before it. Means over the pairs, 95%
    t-intervals."""

    block_steps: int
    pairs: int
    ceiling_step_s: float  # the synthetic blocks' mean step
    slowdown_s: float
    slowdown_lo_s: float | None  # None: one pair, no interval
    slowdown_hi_s: float | None
    ceiling_fraction: float
    ceiling_fraction_lo: float | None
    ceiling_fraction_hi: float | None


@dataclass
class TurnWaits:
    """Waits that recur once every ``workers`` steps, at one (or a few) of the workers' turns.
    A DataLoader takes its workers' batches in a fixed turn; workers that start together stay
    in phase, so whatever delays a round of batches (every worker too slow, or one of them)
    shows as one wait a round at the same turn, not as scattered stalls (BENCHMARKS.md, "Waits
    once per round of the workers' turns"). Counted on the rank whose turns waited the most."""

    rank: int
    workers: int  # the period: the rank's loader workers
    turns: int  # how many of the workers' turns wait
    stalls: int  # steps at those turns that waited, of ...
    visits: int  # ... the steps at those turns in the window
    stall_min_s: float
    stall_max_s: float
    wait_share: float  # the share of the rank's data wait spent at those turns


@dataclass
class WorkerTimes:
    """How long the loader's workers took to make a batch in the window, on the rank that
    waited most (:mod:`loaders.worker_clock`; torch and wds backends), against how long they
    may take: each makes one batch a round of ``workers`` steps."""

    rank: int
    workers: int
    batches: int  # made in the window, all workers
    make_min_s: float  # the workers' mean seconds a batch: the fastest worker's ...
    make_median_s: float
    make_max_s: float  # ... the slowest's
    slowest: int  # its worker id
    slot_wait_share: float  # of the workers' making time, waiting for a batch slot
    allowed_s: float  # workers × the run's step less its data wait: the most a batch may take


@dataclass
class Drain:
    """A window whose data wait rose toward its end, its typical step waiting there: batches
    the loader queued ahead before it (while a slow step ran: a cudnn search on a new shape, a
    recompile, a pause) were still being drained inside it, so the whole window's rate
    overstates the loader's sustained one."""

    first_half_wait: float  # Σ data wait / Σ step over the window's first half, mean over ranks
    last_quarter_wait: float  # the same over its last quarter
    # the fraction of the synthetic ceiling at the last quarter's pace (its mean step against
    # the window's): nearer the loader's sustained supply, an upper bound while still draining
    last_quarter_ceiling_fraction: float


@dataclass
class Breakdown:
    """Mean seconds per measured step over all ranks; the five parts add up to ``step_s``."""

    data_wait_s: float
    forward_backward_s: float
    allreduce_s: float
    optimizer_s: float
    other_s: float
    step_s: float
    allreduce_busy_s: float
    host_wait_s: float
    step: Percentiles | None = None  # distribution of step times (all ranks)


@dataclass
class VerifyRun:
    """One DDP training run: one loader on ``gpus`` ranks."""

    loader: str
    gpus: int  # ranks: GPUs, or CPU processes without CUDA
    per_gpu_batch: int
    global_batch: int
    status: str = "ok"  # ok / failed / interrupted
    error: str | None = None
    source: str | None = None  # what the loader read
    workers: int | None = None  # loader workers per rank
    # the library loader's choices, rank 0's: where it decodes (DALI: and resizes), its
    # workers and their cores (LoaderBase.settings); None for others and in older files
    loader_settings: str | None = None
    cpus: list[str] | None = None  # each rank's cores (its CPU affinity), in rank order
    steps: int = 0  # measured steps (the fewest any rank completed)
    warmup_steps: int = 0
    epochs: int = 0  # epochs started (all steps)
    images: int = 0  # measured images, all ranks
    window_s: float = 0.0
    images_per_s: float = 0.0
    breakdown: Breakdown | None = None
    data_wait_fraction: float | None = None  # Σ data wait / Σ step, mean over ranks
    data_wait_fraction_max: float | None = None  # the worst rank
    unaccounted_fraction: float | None = None  # Σ |other| / Σ step: what the parts do not explain
    steps_vs_window: float | None = None  # Σ step_s / window, mean over ranks (≈ 1)
    base_gpus: int | None = None  # the run efficiency is relative to (1 GPU when measured)
    speedup: float | None = None  # images/s ÷ images/s at base_gpus, same loader
    efficiency: float | None = None  # speedup × base_gpus / gpus
    ceiling_fraction: float | None = None  # images/s ÷ synthetic images/s at the same gpus
    # the synthetic run only: its images/s measured again after the loaders at the same gpus
    # (``ceiling_twice``); the ceiling is then the mean of the two, and ``ceiling_drift`` the
    # change between them over the first (the host's speed moving under the loaders' runs)
    ceiling_after_images_per_s: float | None = None
    ceiling_drift: float | None = None
    # how much longer a step's work (the step less its data wait) is than the synthetic
    # ceiling's at the same gpus, s per step, and per part (forward_backward_s, allreduce_s,
    # optimizer_s, other_s): a loader that slows the training it feeds (issue 29)
    slowdown_s: float | None = None
    slowdown_parts_s: dict[str, float] | None = None
    drain: Drain | None = None  # the window still drained a queue filled before it (None: no)
    turn_waits: TurnWaits | None = None  # waits once per round of the workers' turns (None: no)
    worker_times: WorkerTimes | None = None  # the workers' time a batch (torch, wds backends)
    paired: Paired | None = None  # with --interleave: the loader against synthetic, in-process
    gpu_util_percent_mean: float | None = None  # NVML, the run's GPUs, measured window
    gpu_mem_used_bytes_max: int | None = None  # NVML, the run's GPUs
    gpu_sm_clock_mhz_min: float | None = None  # NVML, the run's GPUs, measured window
    gpu_power_w_mean: float | None = None  # NVML, per GPU, the run's GPUs, measured window
    gpu_peak_alloc_bytes: int | None = None  # torch allocator peak, worst rank
    cpu_percent_mean: float | None = None  # psutil, whole machine, measured window
    busy_cores_mean: float | None = None
    # cores' worth the hypervisor gave elsewhere while this VM's vCPUs wanted to run (steal),
    # measured window; 0 on bare metal; None: not read (an older file)
    steal_cores_mean: float | None = None
    total_s: float = 0.0  # launch to exit, start-up and warm-up included
    log: str | None = None  # torchrun's output
    monitor: Timeline | None = None  # the whole run
    window_t_s: list[float] = field(default_factory=list)  # [start, end] on the monitor's clock
    ranks: list[StepSeries] = field(default_factory=list)
    partial: bool = False


@dataclass
class LoaderVerdict:
    loader: str
    text: str
    data_bound_from: int | None = None  # fewest GPUs with data wait > threshold
    gpus: int | None = None  # the largest GPU count measured
    images_per_s: float | None = None
    speedup: float | None = None
    efficiency: float | None = None
    ceiling_fraction: float | None = None
    data_wait_fraction: float | None = None
    slowdown_s: float | None = None  # the largest GPU count's (VerifyRun.slowdown_s)


@dataclass(kw_only=True)
class VerifyResult(Envelope):
    dataset: DatasetInfo | None = None
    timing: dict[str, str] = field(default_factory=lambda: dict(TIMING))
    runs: list[VerifyRun] = field(default_factory=list)
    verdicts: list[LoaderVerdict] = field(default_factory=list)
    summary: str | None = None


def columns(parts: tuple[str, ...] = PARTS) -> tuple[str, ...]:
    """The per-step lists of a :class:`StepSeries`, in file order."""
    return (*STEP_IDS, *parts, *EXTRA_SECONDS, "buckets")


def means(parts: tuple[str, ...] = PARTS) -> tuple[str, ...]:
    """The per-step means a :class:`Breakdown` holds."""
    return (*parts, *EXTRA_SECONDS)


def schema_gaps(parts: tuple[str, ...] = PARTS) -> list[str]:
    """``Class.field`` for each column the schema lacks for these parts (none for :data:`PARTS`):
    a new part is a new field of :class:`StepSeries` and :class:`Breakdown`, a schema change."""
    want = {StepSeries: columns(parts), Breakdown: means(parts)}
    gaps = []
    for cls, names in want.items():
        have = {f.name for f in fields(cls)}
        gaps += [f"{cls.__name__}.{name}" for name in names if name not in have]
    return gaps


if schema_gaps():  # PARTS and the schema disagree: fail at import, not in a half-written file
    raise TypeError(f"results schema lacks {', '.join(schema_gaps())} (see PARTS)")

COLUMNS = columns()
MEANS = means()


def load(path: str | os.PathLike[str], data: dict[str, Any] | None = None) -> VerifyResult:
    return envelope.load(path, KIND, VerifyResult, data)


def units(n: int, unit: str) -> str:
    if unit == "GPU":
        return f"{n} GPU" + ("s" if n != 1 else "")
    return f"{n} process" + ("es" if n != 1 else "")


def fmt_wait(x: float) -> str:
    return f"{x:.0%}" if x >= 0.095 else f"{x:.1%}"


def unit_plural(unit: str) -> str:
    return "GPUs" if unit == "GPU" else "processes"
