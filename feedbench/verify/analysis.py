"""The numbers a verify computes from its runs (pure): per-run totals and breakdown, efficiency,
fraction of the synthetic ceiling, verdicts per loader and the summary."""

from __future__ import annotations

from dataclasses import replace

from feedbench.core.stats import percentiles
from feedbench.core.timeline import steal_said
from feedbench.verify.diagnose import (
    WORKERS_SAID_FROM_WAIT,
    drain,
    drain_text,
    paired,
    paired_text,
    turn_waits,
    turn_waits_text,
    worker_times,
    worker_times_text,
)
from feedbench.verify.results import (
    MEANS,
    SYNTHETIC,
    Breakdown,
    LoaderVerdict,
    StepSeries,
    VerifyResult,
    VerifyRun,
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
