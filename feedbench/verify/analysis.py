"""The numbers a verify computes from its runs (pure): per-run totals and breakdown, efficiency,
fraction of the synthetic ceiling, verdicts per loader and the summary."""

from __future__ import annotations

from dataclasses import replace
from statistics import fmean, median, stdev

from feedbench.core.stats import percentiles
from feedbench.core.timeline import steal_said
from feedbench.verify.results import (
    MEANS,
    SYNTHETIC,
    Breakdown,
    Drain,
    LoaderVerdict,
    Paired,
    StepSeries,
    TurnWaits,
    VerifyResult,
    VerifyRun,
    WorkerTimes,
    fmt_wait,
    units,
)


def summarize_run(run: VerifyRun) -> VerifyRun:
    """Fill a run's totals, breakdown and fractions from its ranks' step series (in place)."""
    ranks = [r for r in run.ranks if r.step_s]
    if not ranks:
        run.steps, run.images, run.window_s, run.images_per_s = 0, 0, 0.0, 0.0
        run.breakdown = None
        return run
    run.steps = min(len(r.step_s) for r in ranks)
    # a partial run: count only the steps every rank finished, so ranks stay comparable
    cut = run.steps if run.partial or run.status != "ok" else None

    def col(r: StepSeries, name: str) -> list[float]:
        values = getattr(r, name)
        return values[:cut] if cut is not None else values

    run.images = sum(sum(col(r, "images")) for r in ranks)
    windows = [r.window_s for r in ranks if r.window_s is not None and cut is None]
    run.window_s = (
        max(windows) if len(windows) == len(ranks) else max(sum(col(r, "step_s")) for r in ranks)
    )
    run.images_per_s = run.images / run.window_s if run.window_s > 0 else 0.0
    n = sum(len(col(r, "step_s")) for r in ranks)

    def mean(name: str) -> float:
        return sum(sum(col(r, name)) for r in ranks) / n

    steps_all = [x for r in ranks for x in col(r, "step_s")]
    run.breakdown = Breakdown(**{name: mean(name) for name in MEANS}, step=percentiles(steps_all))
    fractions = []
    for r in ranks:
        total = sum(col(r, "step_s"))
        fractions.append(sum(col(r, "data_wait_s")) / total if total > 0 else 0.0)
    run.data_wait_fraction = sum(fractions) / len(fractions)
    run.data_wait_fraction_max = max(fractions)
    total = sum(steps_all)
    other = sum(abs(x) for r in ranks for x in col(r, "other_s"))
    run.unaccounted_fraction = other / total if total > 0 else None
    ratios = [
        sum(r.step_s) / r.window_s for r in ranks if r.window_s and cut is None and r.window_s > 0
    ]
    run.steps_vs_window = sum(ratios) / len(ratios) if ratios else None
    peaks = [r.peak_mem_bytes for r in ranks if r.peak_mem_bytes is not None]
    run.gpu_peak_alloc_bytes = max(peaks) if peaks else None
    return run


def ok_runs(result: VerifyResult, loader: str | None = None) -> list[VerifyRun]:
    return sorted(
        (
            r
            for r in result.runs
            if r.status == "ok" and r.images_per_s > 0 and (loader is None or r.loader == loader)
        ),
        key=lambda r: r.gpus,
    )


def loaders_in(result: VerifyResult) -> list[str]:
    return list(dict.fromkeys(r.loader for r in result.runs))


def compare(result: VerifyResult, threshold: float | None = None) -> VerifyResult:
    """Efficiency vs the fewest GPUs, fraction of the synthetic ceiling, verdicts and summary."""
    if threshold is None:
        threshold = 1 - float(result.config.get("target_au", 0.9))
    synthetic = {r.gpus: r for r in ok_runs(result, SYNTHETIC)}
    ceiling = {g: ceiling_rate(r) for g, r in synthetic.items()}
    steps = {g: ceiling_breakdown(r) for g, r in synthetic.items()}  # the ceiling's step, by count
    for loader in loaders_in(result):
        runs = ok_runs(result, loader)
        base = runs[0] if runs else None
        for r in (x for x in result.runs if x.loader == loader):
            r.base_gpus = r.speedup = r.efficiency = r.ceiling_fraction = None
            if base is not None and r.images_per_s > 0 and (r.gpus != base.gpus or base.gpus == 1):
                r.base_gpus = base.gpus
                r.speedup = r.images_per_s / base.images_per_s
                r.efficiency = r.speedup * base.gpus / r.gpus
            c = ceiling.get(r.gpus) if loader != SYNTHETIC else r.images_per_s
            if c and r.images_per_s > 0:
                r.ceiling_fraction = r.images_per_s / c
            slowdown(r, steps.get(r.gpus) if loader != SYNTHETIC else None)
            r.drain = drain(r) if loader != SYNTHETIC else None
            # DALI's workers are threads of one pipeline, not DataLoader workers taking turns
            turns = loader != SYNTHETIC and not loader.startswith("dali")
            r.turn_waits = turn_waits(r) if turns else None
            r.worker_times = worker_times(r) if loader != SYNTHETIC else None
            r.paired = paired(r) if loader != SYNTHETIC else None
    unit = str(result.config.get("unit", "GPU"))
    result.verdicts = [_verdict(loader, ok_runs(result, loader), threshold, unit)
                       for loader in loaders_in(result)]  # fmt: skip
    for v in result.verdicts:  # at the largest count: the loader's slowdown, the ceiling's drift
        last = ok_runs(result, v.loader)[-1:]
        if not last:
            continue
        step, ceil = steps.get(last[0].gpus), synthetic.get(last[0].gpus)
        said = slowdown_text(last[0], step.step_s) if step and v.loader != SYNTHETIC else None
        if last[0].paired is not None:  # the same question, answered without the host's drift
            said = paired_text(last[0].paired)
            v.slowdown_s = last[0].paired.slowdown_s
        if said:
            v.text += "; " + said
        cores = cores_text(last[0], result.host.cpu_count) if v.loader != SYNTHETIC else None
        if cores:
            v.text += "; " + cores
        stolen = steal_text(last[0], result.host.cpu_count)
        if stolen:
            v.text += "; " + stolen
        if last[0].drain is not None:
            v.text += "; " + drain_text(last[0].drain)
        if last[0].turn_waits is not None:
            v.text += "; " + turn_waits_text(last[0].turn_waits)
        w = last[0].worker_times
        waited = (last[0].data_wait_fraction or 0.0) >= WORKERS_SAID_FROM_WAIT
        if w is not None and (waited or last[0].turn_waits is not None):
            v.text += "; " + worker_times_text(w)
        if ceil is not None and ceil.ceiling_drift is not None:
            v.text += drift_text(ceil, v.loader == SYNTHETIC)
    for v in result.verdicts:
        hint = _broadcast_hint(v, result.config, threshold)
        if hint:
            v.text += hint
    result.summary = _summary(result, unit)
    return result


SUPERLINEAR = 1.05  # efficiency above this is no scaling figure, measurement noise aside
# A ceiling that moved by this share between its runs before and after the loaders is said in
# every loader's verdict: the fractions then differ from run to run by as much.
DRIFT_SAID = 0.03


def ceiling_rate(synthetic: VerifyRun) -> float:
    """The ceiling at the synthetic run's count: its images/s, or the mean of its two runs
    (before and after the loaders), the host's drift shared out between them."""
    after = synthetic.ceiling_after_images_per_s
    return synthetic.images_per_s if not after else (synthetic.images_per_s + after) / 2


def drift_text(synthetic: VerifyRun, own: bool) -> str:
    """What a verdict says of the ceiling's two runs: on the synthetic one, both rates; on a
    loader's, only a drift of DRIFT_SAID or more, as the resolution of its fraction."""
    drift, after = synthetic.ceiling_drift or 0.0, synthetic.ceiling_after_images_per_s or 0.0
    if own:
        return (
            f"; again after the loaders {after:,.0f} img/s ({drift:+.0%}): the ceiling is "
            f"their mean, {ceiling_rate(synthetic):,.0f} img/s"
        )
    if abs(drift) < DRIFT_SAID:
        return ""
    return (
        f"; the ceiling moved {drift:+.0%} between its runs before and after the loaders (the "
        f"host's speed drifting): fractions of it are resolved to about ±{abs(drift) / 2:.0%}"
    )


def _superlinear(last: VerifyRun, first: VerifyRun, unit: str) -> str:
    """Efficiency over 100% (each of N ranks faster than one alone, with no data to load) says
    the baseline ran slower, not that N scale beyond N: on CPU ranks the host's other load,
    clocks and shared caches moved between the runs. Said, so that no one reads it as a
    ceiling."""
    if last.efficiency is None or last.efficiency <= SUPERLINEAR:
        return ""
    return (
        f" (over 100%: each of {units(last.gpus, unit)} ran faster than the one alone; the "
        f"{units(first.gpus, unit)} run was slowed, e.g. by other load on the host: no "
        "ceiling to judge scaling by; repeat it on an idle host)"
    )


# The parts of a step that are its work, not its wait for data.
WORK_PARTS = ("forward_backward_s", "allreduce_s", "optimizer_s", "other_s")
# A slowdown is named in the verdict from this share of the ceiling's step (run-to-run noise of
# the synthetic ceiling at 64 per GPU on one H200 was ±4%; BENCHMARKS.md, "Small batches").
SLOWDOWN_SHARE = 0.05


def ceiling_breakdown(synthetic: VerifyRun | None) -> Breakdown | None:
    """The ceiling's step, part by part: the synthetic run's, or with a second run after the
    loaders (``ceiling_twice``) scaled to their mean rate (each part alike: the host's drift
    is taken to stretch the whole step), so that the slowdown and the fraction agree."""
    if synthetic is None or synthetic.breakdown is None:
        return None
    b, mean = synthetic.breakdown, ceiling_rate(synthetic)
    if not synthetic.ceiling_after_images_per_s or mean <= 0:
        return b
    k = synthetic.images_per_s / mean
    fields = ("data_wait_s", *WORK_PARTS, "step_s", "allreduce_busy_s", "host_wait_s")
    return replace(b, **{f: getattr(b, f) * k for f in fields}, step=None)


def slowdown(run: VerifyRun, c: Breakdown | None) -> None:
    """Fill ``run.slowdown_s`` (and per part): the step's work less the synthetic ceiling's
    (``c``: :func:`ceiling_breakdown`) at the same GPU count; None without both."""
    run.slowdown_s, run.slowdown_parts_s = None, None
    b = run.breakdown
    if b is None or c is None:
        return
    run.slowdown_parts_s = {p: getattr(b, p) - getattr(c, p) for p in WORK_PARTS}
    run.slowdown_s = (b.step_s - b.data_wait_s) - (c.step_s - c.data_wait_s)


# A loader's data wait from this share of the step on is explained by the host's cores:
# the issue 29 bar for "fed" (3%).
WAIT_EXPLAINED = 0.03
# Busy cores from this share of the machine on: the CPU is the limit.
CPU_FULL = 0.9


def cores_text(run: VerifyRun, cores: int) -> str | None:
    """Whether the host's CPU explains a loader's data wait: ``X of N cores busy``, the limit or
    not; None while it waits less than WAIT_EXPLAINED or the cores went unmeasured."""
    wait, busy = run.data_wait_fraction, run.busy_cores_mean
    if wait is None or wait < WAIT_EXPLAINED or busy is None or cores <= 0:
        return None
    if busy >= CPU_FULL * cores:
        return f"it waited with {busy:.1f} of {cores} cores busy: the host's CPU is the limit"
    return (
        f"it waited with {busy:.1f} of {cores} cores busy: not for cores (its queue, its "
        "pacing, storage or a lock)"
    )


def steal_text(run: VerifyRun, cores: int) -> str | None:
    """``the hypervisor took X of N cores (steal)`` where this run's window lost at least
    STEAL_SAID of the machine to it: a VM's CPU time is shared, and what it gets moves the
    step's and the loader's speed from run to run; None below that or unmeasured."""
    steal = run.steal_cores_mean
    if not steal_said(steal, cores):
        return None
    return (
        f"the hypervisor took {steal:.2f} of {cores} cores' time (steal) in its window: this "
        "VM shares its CPUs, and its speed moves with what they are given"
    )


def slowdown_text(run: VerifyRun, ceiling_step_s: float) -> str | None:
    """``the loader slows training by X ms per step (...)`` when the step's extra work, not
    its data wait, is what the run loses to the ceiling; else None."""
    extra, parts = run.slowdown_s, run.slowdown_parts_s
    if extra is None or parts is None or run.breakdown is None:
        return None
    if extra < SLOWDOWN_SHARE * ceiling_step_s or extra <= run.breakdown.data_wait_s:
        return None
    named = {"forward_backward_s": "fwd+bwd", "optimizer_s": "optim", "other_s": "other",
             "allreduce_s": "reduce"}  # fmt: skip
    shown = [f"{named[p]} {v * 1e3:+.1f}" for p, v in parts.items()
             if p != "allreduce_s" or abs(v) >= 5e-4]  # fmt: skip
    return (
        f"the loader slows training by {extra * 1e3:.1f} ms per step ({', '.join(shown)} ms "
        f"over the synthetic ceiling's {ceiling_step_s * 1e3:.1f} ms step), more than it waits "
        f"for data ({run.breakdown.data_wait_s * 1e3:.1f} ms)"
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


def _verdict(loader: str, runs: list[VerifyRun], threshold: float, unit: str) -> LoaderVerdict:
    if not runs:
        return LoaderVerdict(loader, f"{loader}: no complete run")
    first, last = runs[0], runs[-1]
    v = LoaderVerdict(
        loader,
        "",
        gpus=last.gpus,
        images_per_s=last.images_per_s,
        speedup=last.speedup if last is not first else None,
        efficiency=last.efficiency if last is not first else None,
        ceiling_fraction=last.ceiling_fraction,
        data_wait_fraction=last.data_wait_fraction,
    )
    bound = [r for r in runs if (r.data_wait_fraction or 0.0) > threshold]
    v.data_bound_from = bound[0].gpus if bound else None
    scale = []
    if last is not first and last.speedup is not None:
        scale.append(f"{last.speedup:.2f}× on {units(last.gpus, unit)}")
    elif last is first:
        scale.append(f"{last.images_per_s:,.0f} img/s on {units(last.gpus, unit)}")
    if loader == SYNTHETIC:
        if last is not first and last.efficiency is not None:
            scale.append(f"efficiency {last.efficiency:.0%}" + _superlinear(last, first, unit))
        v.text = f"{loader} (compute + communication ceiling): " + ", ".join(scale)
        return v
    if last.ceiling_fraction is not None:
        scale.append(f"{last.ceiling_fraction:.2f} of the ceiling")
    w_last = last.data_wait_fraction or 0.0
    if bound and bound[0] is first:
        head = (
            f"data-bound from {units(first.gpus, unit)}, "
            f"{fmt_wait(first.data_wait_fraction or 0.0)} of each step waits for data"
        )
        if last is not first:
            head += f" ({fmt_wait(w_last)} at {units(last.gpus, unit)})"
        v.text = f"{loader}: {head}" + ("; " + ", ".join(scale) if scale else "")
    elif bound:
        b = bound[0]
        v.text = (
            f"{loader}: " + ", ".join(scale) + f"; fed at {units(first.gpus, unit)} (data wait "
            f"{fmt_wait(first.data_wait_fraction or 0.0)}), data-bound from "
            f"{units(b.gpus, unit)}: {fmt_wait(b.data_wait_fraction or 0.0)} of each step "
            "waits for data"
        )
    else:
        v.text = f"{loader}: " + ", ".join([*scale, f"data wait {fmt_wait(w_last)}"])
    v.slowdown_s = last.slowdown_s
    return v


def _broadcast_hint(v: LoaderVerdict, config: dict, threshold: float) -> str | None:
    """The DALI loader fed (data wait under the threshold) yet short of the ceiling on several
    GPUs, with DDP broadcasting buffers every step: name the setting to try, and where it was
    measured."""
    ddp = config.get("ddp_options") or {}
    pace = ((config.get("options_per_loader") or {}).get("dali") or {}).get("pace", 1)
    if (
        v.loader != "dali"
        or config.get("device") != "cuda"
        or (v.gpus or 0) < 2
        or ddp.get("broadcast_buffers", True) is not True
        or ddp.get("forward_sync_buffers", True) is not True
        or not pace
        or v.ceiling_fraction is None
        or v.ceiling_fraction >= 0.95
        or (v.data_wait_fraction or 0.0) > threshold
    ):
        return None
    return (
        "; the gap is not data wait: DDP broadcasts its buffers before every forward (on here), "
        "launched only after the loader's per-step wait for the GPU (pace), so the GPU idles at "
        "each step's start; try --ddp-option broadcast_buffers=false (forward_sync_buffers=false "
        'in newer PyTorch; BENCHMARKS.md, "The DALI loader at 0.97")'
    )


def _summary(result: VerifyResult, unit: str) -> str | None:
    runs = ok_runs(result)
    if not runs:
        return None
    top = max(r.gpus for r in runs)
    at = sorted(
        (r for r in runs if r.gpus == top and r.loader != SYNTHETIC),
        key=lambda r: -r.images_per_s,
    )
    if not at:
        return None
    parts = []
    for r in at:
        s = f"{r.loader} {r.images_per_s:,.0f} img/s"
        if r.ceiling_fraction is not None:
            s += f" ({r.ceiling_fraction:.2f} of the ceiling)"
        parts.append(s)
    text = f"at {units(top, unit)}: " + " > ".join(parts)
    synth = next((r for r in runs if r.gpus == top and r.loader == SYNTHETIC), None)
    if synth is not None:
        text += f"; ceiling (synthetic) {synth.images_per_s:,.0f} img/s"
    if len(at) > 1:
        best, worst = at[0], at[-1]
        text += f"; {best.loader} is {best.images_per_s / worst.images_per_s:.2f}× {worst.loader}"
    return text
