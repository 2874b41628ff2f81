"""What a verify run's steps say beyond its totals (pure): the loader against the synthetic
batch block by block (``--interleave``), a window that drained a queue filled before it, waits
once per round of the workers' turns, and the workers' time a batch; each with the words its
verdict uses (:func:`feedbench.verify.analysis.compare` adds them)."""

from __future__ import annotations

from statistics import fmean, median, stdev

from feedbench.verify.results import (
    Drain,
    Paired,
    StepSeries,
    TurnWaits,
    VerifyRun,
    WorkerTimes,
    fmt_wait,
)


def paired(run: VerifyRun) -> Paired | None:
    """The loader against the synthetic batch block by block in one process (``--interleave``;
    :class:`~feedbench.verify.results.Paired`); None without a complete loader block between
    two complete synthetic ones."""
    ranks = [r for r in run.ranks if r.paired]
    if not ranks or run.breakdown is None:
        return None
    size = max(len(b.step_s) for r in ranks for b in r.paired)
    complete = min(_complete(r.paired, size) for r in ranks)  # blocks every rank finished
    if size < 2 or complete < 3:
        return None

    def per_step(i: int, name: str) -> float:  # block i's second half, per step, over ranks
        return fmean(fmean(getattr(r.paired[i], name)[size // 2 :]) for r in ranks)

    sources = [ranks[0].paired[i].source for i in range(complete)]
    wait = run.breakdown.data_wait_s  # the window's: a block starts with a queue filled before
    ceilings, slow, frac = [], [], []
    for i in range(1, complete - 1):
        if sources[i - 1 : i + 2] != ["synthetic", "loader", "synthetic"]:
            continue
        ceiling = (per_step(i - 1, "step_s") + per_step(i + 1, "step_s")) / 2
        work = per_step(i, "step_s") - per_step(i, "data_wait_s")
        ceilings.append(ceiling)
        slow.append(work - ceiling)
        frac.append(ceiling / (work + wait))
    if not slow:
        return None
    s_lo, s_hi = _interval(slow)
    f_lo, f_hi = _interval(frac)
    return Paired(
        block_steps=size, pairs=len(slow), ceiling_step_s=fmean(ceilings),
        slowdown_s=fmean(slow), slowdown_lo_s=s_lo, slowdown_hi_s=s_hi,
        ceiling_fraction=fmean(frac), ceiling_fraction_lo=f_lo, ceiling_fraction_hi=f_hi,
    )  # fmt: skip


def _complete(blocks: list, size: int) -> int:
    """How many of ``blocks`` from the first are complete (``size`` steps)."""
    n = 0
    while n < len(blocks) and len(blocks[n].step_s) == size:
        n += 1
    return n


def _interval(values: list[float]) -> tuple[float | None, float | None]:
    """The 95% t-interval of the mean of ``values`` (None, None: fewer than two)."""
    if len(values) < 2:
        return None, None
    from scipy.stats import t

    half = t.ppf(0.975, len(values) - 1) * stdev(values) / len(values) ** 0.5
    return fmean(values) - half, fmean(values) + half


def paired_text(p: Paired) -> str:
    """What the paired blocks say: the loader's fraction of the ceiling and its slowdown."""

    def span(lo: float | None, hi: float | None, scale: float, fmt: str) -> str:
        if lo is None or hi is None:
            return ""
        return f" (95% CI {lo * scale:{fmt}} to {hi * scale:{fmt}})"

    fraction = span(p.ceiling_fraction_lo, p.ceiling_fraction_hi, 1, ".2f")
    slower = span(p.slowdown_lo_s, p.slowdown_hi_s, 1e3, ".1f")
    if p.slowdown_lo_s is not None and p.slowdown_lo_s > 0:  # longer, beyond the interval
        step = f"the loader slows training by {p.slowdown_s * 1e3:.1f} ms per step{slower}"
    else:
        step = f"the loader's step {p.slowdown_s * 1e3:+.1f} ms{slower}"
    return (
        f"paired with the synthetic batch in one process ({p.pairs} blocks of {p.block_steps} "
        f"steps each way): {p.ceiling_fraction:.2f} of the ceiling{fraction}, {step} against "
        f"the synthetic step's {p.ceiling_step_s * 1e3:.1f} ms"
    )


# A window drains a queue filled before it when its last quarter waits this share of its steps
# more than its first half (the issue 29 bar for "fed") ...
DRAIN_RISE = 0.03
# ... and the last quarter's typical step waits at least this share of itself: a shortfall every
# step once the queue is gone, not a few stalls (run 13's wds: two, at steps 46 and 74).
DRAIN_TYPICAL = 0.05
DRAIN_MIN_STEPS = 8  # fewer steps in a rank's window: its quarters say nothing


def drain(run: VerifyRun) -> Drain | None:
    """Whether ``run``'s window still drained batches its loader queued before it: a loader
    slower than the step whose workers filled their queue during a slow step (not the first
    ones, which verify primes: scripts/first_wave.py) looks fed until the queue is gone."""
    ranks = [r for r in run.ranks if len(r.step_s) >= DRAIN_MIN_STEPS]
    if not ranks or run.ceiling_fraction is None or run.status != "ok" or run.partial:
        return None
    first, last, typical, pace = [], [], [], []
    for r in ranks:
        n = len(r.step_s)
        half, quarter = n // 2, n - n // 4
        first.append(_wait_share(r, 0, half))
        last.append(_wait_share(r, quarter, n))
        typical.append(median(r.data_wait_s[quarter:]) / max(median(r.step_s[quarter:]), 1e-12))
        pace.append(fmean(r.step_s) / max(fmean(r.step_s[quarter:]), 1e-12))
    rise = fmean(last) - fmean(first)
    if rise < DRAIN_RISE or median(typical) < DRAIN_TYPICAL:
        return None
    return Drain(
        first_half_wait=fmean(first),
        last_quarter_wait=fmean(last),
        last_quarter_ceiling_fraction=run.ceiling_fraction * fmean(pace),
    )


def _wait_share(r: StepSeries, a: int, b: int) -> float:
    total = sum(r.step_s[a:b])
    return sum(r.data_wait_s[a:b]) / total if total > 0 else 0.0


def drain_text(d: Drain) -> str:
    return (
        f"its data wait rose from {fmt_wait(d.first_half_wait)} in the window's first half to "
        f"{fmt_wait(d.last_quarter_wait)} in its last quarter: batches it queued ahead before "
        "the window (in a slow step) were still being drained, so this window overstates it; at "
        f"the last quarter's pace it gives {d.last_quarter_ceiling_fraction:.2f} of the ceiling "
        "or less (measure more --steps)"
    )


# A step stalls when its data wait is at least this share of the window's median step (and no
# less than STALL_MIN_S) ...
STALL_SHARE = 0.25
STALL_MIN_S = 0.005
# ... and a worker's turn is late when at least this share of its visits stall, at least
# TURN_MIN_STALLS times; at most a quarter of the turns may be late (more is a slow loader, which
# the data wait already says, not a slow worker)
TURN_LATE_SHARE = 0.5
TURN_MIN_STALLS = 3


def turn_waits(run: VerifyRun) -> TurnWaits | None:
    """Stalls at one or a few of a rank's worker turns (:class:`TurnWaits`); None where the
    rank's stalls do not recur with its workers' period, or it has fewer than two workers."""
    found = [t for r in run.ranks if (t := _turn_waits(r)) is not None]
    return max(found, key=lambda t: t.wait_share, default=None)


def _turn_waits(r: StepSeries) -> TurnWaits | None:
    k, n = r.workers or 0, len(r.data_wait_s)
    if k < 2 or n < TURN_MIN_STALLS * k or not r.step_s:
        return None
    floor = max(STALL_SHARE * median(r.step_s), STALL_MIN_S)
    by_turn: dict[int, list[int]] = {}  # the stalled steps at each turn
    for i, w in enumerate(r.data_wait_s):
        if w >= floor:
            by_turn.setdefault(i % k, []).append(i)
    late = []
    for turn, hits in sorted(by_turn.items()):
        visits = range(turn, n, k)
        if len(hits) >= TURN_MIN_STALLS and len(hits) >= TURN_LATE_SHARE * len(visits):
            late.append((turn, hits, len(visits)))
    if not late or len(late) > k // 4:
        return None
    waits = [r.data_wait_s[i] for _, hits, _ in late for i in hits]
    total = sum(r.data_wait_s)
    return TurnWaits(
        rank=r.rank, workers=k, turns=len(late), stalls=len(waits),
        visits=sum(v for _, _, v in late), stall_min_s=min(waits), stall_max_s=max(waits),
        wait_share=sum(waits) / total if total > 0 else 0.0,
    )  # fmt: skip


def turn_waits_text(t: TurnWaits) -> str:
    head = "one step" if t.turns == 1 else f"{t.turns} steps"
    return (
        f"{head} in every {t.workers} waited ({t.stalls} of {t.visits} such steps, "
        f"{t.stall_min_s * 1e3:.0f}–{t.stall_max_s * 1e3:.0f} ms; {t.wait_share:.0%} of its data "
        "wait): a DataLoader takes its workers' batches in turn, so whatever delays a round of "
        "them shows as one wait a round"
    )


def worker_times(run: VerifyRun) -> WorkerTimes | None:
    """The workers' seconds a batch in the window (:class:`WorkerTimes`) on the rank that
    waited most; None where the loader records none or a worker made no batch."""
    ranks = [r for r in run.ranks if r.worker_batches and r.worker_make_s and r.step_s]
    if not ranks:
        return None
    r = max(ranks, key=lambda x: sum(x.data_wait_s))
    made = r.worker_batches or []
    if min(made) < 1:
        return None
    per = [m / b for m, b in zip(r.worker_make_s or [], made, strict=True)]
    work = fmean(r.step_s) - fmean(r.data_wait_s)
    return WorkerTimes(
        rank=r.rank, workers=len(per), batches=sum(made), make_min_s=min(per),
        make_median_s=median(per), make_max_s=max(per), slowest=per.index(max(per)),
        slot_wait_share=sum(r.worker_slot_wait_s or [0.0]) / max(sum(r.worker_make_s or []), 1e-12),
        allowed_s=len(per) * work,
    )  # fmt: skip


# The workers' times are said where the loader waited at least this share of its steps (the
# issue 29 bar for fed), or its waits came once a round
WORKERS_SAID_FROM_WAIT = 0.03
# A worker is named the slowest when its batches take this much longer than the median worker's
SLOWEST_OVER_MEDIAN = 1.2


def _secs(s: float) -> str:
    return f"{s:.2f} s" if s >= 1 else f"{s * 1e3:.0f} ms" if s >= 0.01 else f"{s * 1e3:.1f} ms"


def worker_times_text(w: WorkerTimes) -> str:
    """The workers' time a batch against what keeping up allows them."""
    slots = ""
    if w.slot_wait_share >= 0.005:
        slots = f", {w.slot_wait_share:.0%} of it waiting for a batch slot"
    slowest = ""
    if w.make_max_s > SLOWEST_OVER_MEDIAN * w.make_median_s:
        slowest = f"; worker {w.slowest} the slowest"
    return (
        f"its {w.workers} workers took {_secs(w.make_min_s)} to {_secs(w.make_max_s)} a batch "
        f"(median {_secs(w.make_median_s)}{slots}{slowest}), where keeping up allows each "
        f"{_secs(w.allowed_s)} ({w.workers} of its steps, less their data wait)"
    )
