"""A scan → the bottleneck in words and numbers. A pure function of a ScanResult.

A verdict's text is one line: the bound, its resource and the number that shows it (samples/s, or
the AU); its evidence, one line each, says why (the reasons first, then the measurements behind
them). Advice is given only where the run did not already follow it."""

from __future__ import annotations

from dataclasses import dataclass

from feedbench.core.timeline import steal_said, summarize
from feedbench.core.words import count, setup_text
from feedbench.scan.results import (
    NOT_VALID,
    CurvePoint,
    Measurement,
    ScanResult,
    StageStats,
    Verdict,
    measured_steps,
    step_alone_moved,
)
from feedbench.scan.sizing import OTHER_LOAD_CORES, find_max_note, short_count, short_window
from feedbench.scan.sweep import in_curve

RESOURCE = {
    "read": "storage",
    "decode": "cpu",
    "augment": "cpu",
    "collate": "cpu",
    "transfer": "pcie",
}
CPU_SATURATED = 0.85  # mean busy cores / cores
WARM_FASTER = 1.25  # a warm pass this much faster than the cold one: the storage limited it


def _rate(x: float) -> str:
    return f"{x / 1000:.1f}k" if x >= 10_000 else f"{x:,.0f}"


def _reference(result: ScanResult) -> Measurement | None:
    ms = [m for m in result.measurements if not m.partial and not m.failed and m.samples > 0]
    if not ms:
        return None
    first_pass = ms[0].pass_name
    ms = [m for m in ms if m.pass_name == first_pass]
    return max(ms, key=lambda m: (m.consumers, m.repeat))


@dataclass
class _Case:
    """What every kind of verdict is built from: the reference measurement and what it feeds."""

    top: Measurement
    point: CurvePoint | None  # the curve's point for ``top``'s consumers and pass
    warm_ratio: float | None  # warm samples/s ÷ cold samples/s at ``top``'s consumers
    appetite: float | None  # the emulated accelerator's samples/s
    stages: list[StageStats]  # available, pageable copies left out
    busy: float | None  # mean busy cores
    others: float | None  # of those, cores used by processes outside the scan
    cores: int
    rate: float  # the reference's samples/s, as the curve gives it
    where: str  # "2 consumers × 1 worker, cold pass"
    feeding: str | None  # "… samples/s = …× the appetite of one …"; None without an accelerator
    supported: int | None
    feeds: float | None
    evidence: list[str]
    repeats: list[Measurement]  # the completed repeats of ``top``'s point (its AU's mean)


def judge(result: ScanResult, target_au: float = 0.9) -> Verdict | None:
    """The bottleneck of ``result``'s reference measurement (most consumers, first pass): with
    an emulated step accelerator- or sync-bound when it is; else the training loader (--loader)
    or the limiting stage. None without a complete measurement."""
    top = _reference(result)
    if top is None:
        return None
    case = _case(result, top, target_au)
    short = short_window(top, result.config)
    # AU over a window of prefetched batches says nothing of the data: no step verdict from it
    verdict = _step_verdict(case, target_au) if case.appetite and not short else None
    if verdict is None:
        backend = result.config.get("loader")
        verdict = _loader_verdict(case, backend) if backend else _stage_verdict(case)
    if short and case.appetite:
        k, need = short
        why = f"AU not judged: {count(k, 'measured batch')} per consumer, needs ≥ {need}"
        verdict.evidence.insert(0, f"{why}; {NOT_VALID}")
    elif short:  # the rate above is this count's own: no headline or sizing figure from it
        k, need = short
        verdict.evidence.append(
            f"this count not judged: {count(k, 'measured batch')} per consumer in the window "
            f"all measured in, needs ≥ {need}; no headline from it"
        )
    undecided = find_max_note(result.config.get("find_max_result") or {})
    if undecided:  # its supported consumers are a lower bound, or none: say why
        verdict.evidence.insert(0, undecided)
    return verdict


def _case(result: ScanResult, top: Measurement, target_au: float) -> _Case:
    point = next(
        (c for c in result.curve if c.consumers == top.consumers and c.pass_name == top.pass_name),
        None,
    )
    rate = point.samples_per_s_mean if point else top.samples_per_s
    acc = result.accelerator
    appetite = float(acc["samples_per_s"]) if acc else None
    feeds = rate / appetite if appetite else None
    feeding = None
    if acc and feeds is not None:
        share = f"{feeds:.2f}" if feeds < 1 else f"{feeds:.1f}"
        if acc.get("kind") == "profile":
            what = f"{acc.get('accelerator') or acc['name']} ({acc['name']})"
        elif acc.get("kind") == "workload":
            what = f"{acc['accelerator']} ({acc['workload']})"
        else:  # a step time or rate the user gave: no accelerator's name to show
            what = f"accelerator of {acc.get('name')}"
        # the rate against one accelerator's appetite; "accelerators fed" (at the target AU) is
        # the sizing's figure, not this one
        feeding = f"{_rate(rate)} samples/s = {share}× the appetite of one {what}"
    stages = [s for s in top.stages if s.available and s.name != "transfer-pageable"]
    seen = summarize(top.monitor, *window_on_monitor(top))
    # the machine's busy cores decide: cores taken by other work limit the scan too (the
    # sizing rules mark such a run, and the text says whose the cores were)
    busy = seen.get("busy_cores_mean")
    cores = result.host.cpu_count
    return _Case(
        top=top,
        point=point,
        warm_ratio=_warm_ratio(result, top.consumers),
        appetite=appetite,
        stages=stages,
        busy=busy,
        others=seen.get("other_busy_cores_mean"),
        cores=cores,
        rate=rate,
        where=f"{setup_text(top.consumers, top.workers)}, {top.pass_name} pass",
        feeding=feeding,
        supported=_supported(result, target_au) if appetite else None,
        feeds=feeds,
        evidence=_evidence(top, stages, seen, cores),
        repeats=[
            m
            for m in result.measurements
            if (m.consumers, m.pass_name) == (top.consumers, top.pass_name) and in_curve(m)
        ]
        or [top],
    )


def window_on_monitor(m: Measurement) -> tuple[float | None, float | None]:
    """The window every consumer of ``m`` measured in, on its monitor's clock: the CPU while the
    data flowed, not the start-up (the model built, the step alone measured, the workers
    started) and the tail that an average over the whole timeline takes in (run 21: 10.4 of 16
    cores busy over it, 13-15 while the loader ran). (None, None), the whole timeline, in older
    files, where the windows do not meet or span under two readings."""
    t0 = m.monitor.started_at if m.monitor is not None else None
    spans = [(c.window_start, c.window_end) for c in m.per_consumer]
    if t0 is None or not spans or any(a is None or b is None for a, b in spans):
        return None, None
    start = max(a for a, _ in spans if a is not None) - t0
    end = min(b for _, b in spans if b is not None) - t0
    if end - start < 2 * m.monitor.interval_s:  # type: ignore[union-attr]
        return None, None
    return start, end


def _warm_ratio(result: ScanResult, n: int) -> float | None:
    rate = {p.pass_name: p.samples_per_s_mean for p in result.curve if p.consumers == n}
    if rate.get("cold") and rate.get("warm"):
        return rate["warm"] / rate["cold"]
    return None


def _evidence(top: Measurement, stages: list[StageStats], seen: dict, cores: int) -> list[str]:
    """The measurements behind a verdict: CPU (from ``seen``, the monitor over the consumers'
    window: the machine's busy cores, this scan's, the hypervisor's steal), the barrier's cost,
    disk, read latency (each stage's share is in the stage table)."""
    evidence = []
    machine, own = seen.get("busy_cores_mean"), seen.get("own_busy_cores_mean")
    steal, disk = seen.get("steal_cores_mean"), seen.get("disk_read_mb_per_s_mean")
    if machine is not None:
        mine = f", {own:.1f} by this scan" if own is not None else ""
        evidence.append(f"CPU: {machine:.1f} of {cores} cores busy on average{mine}")
    if steal_said(steal, cores):
        evidence.append(
            f"the hypervisor took {steal:.2f} of {cores} cores' time (steal): this VM shares its "
            "CPUs, and its speed moves with what they are given"
        )
    idle = [c.barrier_idle_s for c in top.per_consumer if c.barrier_idle_s is not None]
    if idle:
        evidence.append(
            f"step barrier's own cost: {max(idle) * 1e3:.2f} ms per step (counted in sync wait)"
        )
    if disk is not None:
        evidence.append(f"disk reads: {disk:,.1f} MB/s (device counters)")
    read = _read_stage(stages)
    if read is not None and read.latency is not None:
        evidence.append(
            f"read latency p50 {read.latency.p50_s * 1e3:.2f} ms, "
            f"p99 {read.latency.p99_s * 1e3:.2f} ms (all consumers' reads)"
        )
    return evidence


def _read_stage(stages: list[StageStats]) -> StageStats | None:
    return next((s for s in stages if s.name == "read"), None)


def _lines(case: _Case, reasons: list[str]) -> list[str]:
    """A verdict's evidence: its reasons, what the rate feeds, then the measurements."""
    return [*reasons, *([case.feeding] if case.feeding else []), *case.evidence]


def _step_verdict(case: _Case, target_au: float) -> Verdict | None:
    """With an emulated step: accelerator-bound at the target AU, sync-bound when consumers
    wait more for each other than for their data; None when neither."""
    point, top = case.point, case.top
    if point is not None and point.au_mean is not None and point.au_mean >= target_au:
        text = (
            f"accelerator-bound: AU {point.au_mean:.0%} (min {point.au_min:.0%}) at "
            f"{case.where}: the data keeps up"
        )
        why = [f"AU {point.au_mean:.0%} ≥ the {target_au:.0%} that counts as fed"]
        return Verdict("accelerator", "none", text, _lines(case, why), case.supported, case.feeds)
    waits = sum(c.data_wait_s for c in top.per_consumer)
    # waiting for a slower consumer = sync wait beyond the barrier's own cost on every step
    syncs = sum(
        max(0.0, c.sync_wait_s - (c.barrier_idle_s or 0.0) * max(0, c.batches - 1))
        for c in top.per_consumer
    )
    # one consumer has no other to wait for: its sync time is the step's own overhead
    if top.consumers > 1 and syncs > waits and syncs > 0:
        text = (
            f"sync-bound (straggler): consumers wait {syncs:.2f} s for each other, "
            f"{waits:.2f} s for their own data, at {case.where}"
        )
        why = ["uneven shards or a straggler: the consumers wait more for each other than for data"]
        return Verdict("sync", "straggler", text, _lines(case, why), case.supported, case.feeds)
    return _contention_verdict(case)


def _contention_verdict(case: _Case) -> Verdict | None:
    """``--emulate gpu``: the model's step ran longer beside the loader than alone by more time
    than the consumers waited for data, over the point's repeats (whose AU's mean decided it
    was not fed). A host-bound step (small batches) shares the host with the loader's work;
    more loader throughput or faster storage would not give that back."""
    gpu = [c for m in case.repeats for c in m.per_consumer if c.step_alone_s]
    extra = sum(c.step_extra_s for c in gpu)
    waits = sum(c.data_wait_s for c in gpu)
    if not gpu or extra <= waits:
        return None
    steps = sum(measured_steps(c) for c in gpu)
    alone = sum(c.step_alone_s for c in gpu) / len(gpu)
    per_step, wait = extra / steps, waits / steps
    step = "the model's step" if any(c.step_model for c in gpu) else "the emulated step"
    text = (
        f"contention-bound (host): {step} ran {per_step * 1e3:.1f} ms longer beside "
        f"the loader than alone ({per_step / alone:.0%}), against {wait * 1e3:.1f} ms a step "
        f"waiting for data, at {case.where}"
    )
    why = [
        "the loading work competes on the host with the thread that launches the step's "
        "kernels: fewer loader workers, cores kept free of them (loaders: reserve_cores) or a "
        "decode on the GPU give it back; faster storage would not"
    ]
    moved = max(step_alone_moved(c) * c.step_alone_s for c in gpu)  # seconds
    if moved >= per_step:
        why.append(
            f"the step alone moved by ±{moved * 1e3:.1f} ms over a pass, as much as this: the "
            "host's own drift could make it (a steadier host tells)"
        )
    return Verdict("contention", "host", text, _lines(case, why), case.supported, case.feeds)


def _processes(case: _Case) -> int:
    """The processes loading data: each consumer's workers, or the consumer itself."""
    return case.top.consumers * max(1, case.top.workers)


def _idle_cpu(case: _Case) -> tuple[str, str]:
    """(resource, reason) where the cores were not saturated: more workers, when fewer
    processes loaded than there are cores; else the workers waited on something else."""
    busy, cores, n = case.busy or 0.0, case.cores, _processes(case)
    share = f"CPU only {busy / cores:.0%} busy"
    if n < cores:
        return "cpu (too few workers)", (
            f"{share} with {count(n, 'loading process')} on {count(cores, 'core')}: more loader "
            "workers (--workers) would use the idle cores"
        )
    return "cpu (cores idle)", (
        f"{share} with {count(n, 'loading process')} on {count(cores, 'core')}: the workers wait "
        "on something other than the cores (I/O, locks, the consumers)"
    )


def _headline(bound: str, resource: str, case: _Case) -> str:
    return f"{bound}-bound ({resource}): {_rate(case.rate)} samples/s at {case.where}"


def _stage_verdict(case: _Case) -> Verdict:
    """The stage with the most busy time limits the pipeline; its resource, and by how much."""
    stages, busy, cores = case.stages, case.busy, case.cores
    total_busy = sum(s.busy_s for s in stages)
    limiting = max(stages, key=lambda s: s.busy_s)
    bound = "transfer" if limiting.name.startswith("transfer") else limiting.name
    resource = RESOURCE.get(bound, "cpu")
    reasons = []
    others = total_busy - limiting.busy_s
    if limiting.busy_s > 0 and others > 0:
        reasons.append(
            f"{bound} takes {limiting.share:.0%} of loader time; without it the rest would run "
            f"{total_busy / others:.1f}× faster"
        )
    if resource == "cpu" and busy is not None:
        if busy >= CPU_SATURATED * cores:
            reasons.insert(0, _busy_text(case))
        else:
            resource, why = _idle_cpu(case)
            reasons.insert(0, why)
    read = _read_stage(stages)
    # (with two stages, "without it" above already says it)
    if read is not None and bound != "read" and read.busy_s > 0 and len(stages) > 2:
        reasons.append(f"read alone would run {total_busy / read.busy_s:.1f}× faster")
    if bound == "read":
        resource, why = _read_resource(case)
        if why:
            reasons.insert(0, why)
        if read is not None and read.latency is not None:
            reasons.append(f"read p99 {read.latency.p99_s * 1e3:.1f} ms")
    text = _headline(bound, resource, case)
    return Verdict(bound, resource, text, _lines(case, reasons), case.supported, case.feeds)


def _busy_text(case: _Case) -> str:
    """ "1.9/2 cores busy (95%)", and whose they were when other processes took a share."""
    busy, cores, others = case.busy or 0.0, case.cores, case.others
    text = f"{busy:.1f}/{cores} cores busy ({busy / cores:.0%})"
    if others is not None and others >= OTHER_LOAD_CORES:
        text += f", {others:.1f} of them by other processes"
    return text


def _read_resource(case: _Case) -> tuple[str, str | None]:
    """Whether reading was limited by the storage or by the client's CPU: cores saturated while
    reading point at the CPU, and so does a warm pass (page cache) no faster than the cold one;
    a warm pass much faster points at the storage."""
    busy, cores, warm = case.busy, case.cores, case.warm_ratio
    if warm is not None and warm >= WARM_FASTER:
        return "storage", f"the warm pass (page cache) ran {warm:.1f}× faster than the cold one"
    if busy is None or busy < CPU_SATURATED * cores:
        return "storage", None
    saturated = _busy_text(case)
    if warm is not None:
        return "cpu", (
            f"{saturated} and the warm pass (page cache) no faster than the cold one "
            f"({warm:.2f}×): the client's CPU limits, not the storage"
        )
    return "cpu", (
        f"{saturated} while reading: the client's CPU limits before the storage can be judged "
        "(--passes cold,warm tells them apart)"
    )


def _loader_verdict(case: _Case, backend: str) -> Verdict:
    """A training loader is timed end to end: name the resource from the monitor, not a stage."""
    top, busy, cores = case.top, case.busy, case.cores
    gpu = None
    if top.monitor is not None and top.monitor.samples:
        utils = [sum(s.gpu_util_percent) / len(s.gpu_util_percent)
                 for s in top.monitor.samples if s.gpu_util_percent]  # fmt: skip
        gpu = sum(utils) / len(utils) / 100 if utils else None
    if busy is not None and busy >= CPU_SATURATED * cores:
        resource, reasons = "cpu", [_busy_text(case)]
    elif gpu is not None and gpu >= 0.9:
        resource, reasons = "gpu", [f"GPU {gpu:.0%} busy decoding"]
    else:
        resource = "storage or loader settings"
        reasons = [_idle_cpu(case)[1] if busy is not None else "CPU not measured"]
        if case.warm_ratio is None:
            reasons.append("--passes cold,warm tells the storage from the loader's settings")
    wait = top.per_consumer[0].data_wait if top.per_consumer else None
    if wait is not None:
        reasons.append(f"data wait p50 {wait.p50_s * 1e3:.1f} ms, p99 {wait.p99_s * 1e3:.1f} ms")
    text = f"data-bound with the {backend} loader ({resource}): {_rate(case.rate)} samples/s at "
    text += case.where
    return Verdict("loader", resource, text, _lines(case, reasons), case.supported, case.feeds)


def _supported(result: ScanResult, target_au: float) -> int | None:
    fm = result.config.get("find_max_result")
    if fm:  # None: the search stopped undecided before any count passed
        best = fm["supported_consumers"]
        return None if best is None else int(best)
    first = result.measurements[0].pass_name if result.measurements else None
    # the counts find-max would decide: the same rule, so that both give one answer
    judged = {m.consumers for m in result.measurements
              if m.pass_name == first and short_count(result, m.consumers) is None}  # fmt: skip
    ok = [
        c.consumers
        for c in result.curve
        if c.pass_name == first
        and c.au_mean is not None
        and c.au_mean >= target_au
        and c.consumers in judged
    ]
    # no count measured long enough to judge its AU: no supported count to show
    return max(ok) if ok else (0 if judged else None)
