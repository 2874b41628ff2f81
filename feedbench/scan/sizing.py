"""What a sizing decision reads from a scan: how many accelerators it feeds (a fraction), and
whether the run follows the rules that make that number usable for sizing (MLPerf Storage's
spirit: data larger than the client can cache, a cold first pass, repeats that agree).

A run that breaks a rule is still a measurement; it is marked "not valid for sizing" in every
output (terminal, JSON, HTML, compare), never only warned about.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from feedbench.core.envelope import HostInfo
from feedbench.core.timeline import summarize
from feedbench.core.words import count, setup_text
from feedbench.scan.results import Measurement, ScanResult, Sizing
from feedbench.scan.sweep import FoundMax, curve_points

DATASET_VS_RAM = 5  # MLPerf Storage: the dataset at least 5× the client's RAM
MIN_REPEATS = 3  # repeats per point, for a spread to judge by
MAX_CV = 0.10  # std / mean of the repeats at a point
MAX_RESIDENT = 0.01  # share of the data in the page cache when a cold pass started
OTHER_LOAD_CORES = 0.25  # other processes' CPU, in cores, that disturbs a measurement
# measured batches per consumer, per batch its loader can have ready (one per worker, at least
# this many with none; DALI: its prefetch queue): when the window opens those are finished, so
# k measured batches with w ready overstate AU and rate by up to k / (k - w); at 5 per batch
# ready that is at most 25%
MIN_BATCHES_PER_WORKER = 5
# the window every consumer measured in, at least this share of their own windows' mean: the
# consumers of a short run start and end apart, and a rate over a sliver of it describes little
MIN_OVERLAP = 0.5
# a wait for one batch this many times the median wait, and at least STALL_MIN_S: a stall
STALL_FACTOR = 10
STALL_MIN_S = 1.0
# the rate's figure this far under the AU's: said in words (closer is measurement noise)
RATE_DISAGREES = 0.05


def fed(consumers: int, au: float, target_au: float) -> float:
    """Accelerators that ``consumers`` at utilisation ``au`` feed at ``target_au``: the
    accelerator time they were given, in accelerators kept at the target, never more than the
    consumers themselves (8 at AU 0.6 keep 5.3 at 0.9)."""
    return min(float(consumers), consumers * au / target_au)


def rate_fed(samples_per_s: float, appetite: float, target_au: float) -> float:
    """Accelerators kept at ``target_au`` that a measured rate can feed: each takes
    ``target_au`` × its appetite (2 × 400 samples/s at AU 0.9 take 720 samples/s)."""
    return samples_per_s / (appetite * target_au)


@dataclass
class Fed:
    """Accelerators fed at one measurement: by its AU, by its rate, and the figure (the smaller:
    a measurement cannot feed more accelerators than its samples/s support)."""

    by_au: float
    by_rate: float
    value: float


def fed_at(m: Measurement, appetite: float, target_au: float) -> Fed:
    rate = m.steady_samples_per_s if m.steady_samples_per_s is not None else m.samples_per_s
    by_au = fed(m.consumers, m.au_mean or 0.0, target_au)
    by_rate = min(float(m.consumers), rate_fed(rate, appetite, target_au))
    return Fed(by_au, by_rate, min(by_au, by_rate))


def accelerators_fed(
    result: ScanResult, target_au: float
) -> tuple[float, float | None, int, Fed] | None:
    """The most accelerators any judged count of the first pass feeds, the spread of that over
    its repeats (None with one repeat), the count, and its AU's and rate's figures (means over
    the repeats); None without an emulated step or without a judged count. A count is judged
    when one of its repeats held enough batches in the window every consumer shared
    (:func:`short_count`); its short repeats are left out too: a figure from a window that
    the prefetched batches decide is not one to size by."""
    first = result.measurements[0].pass_name if result.measurements else None
    acc = result.accelerator
    ms = [m for m in result.measurements
          if m.pass_name == first and m.au_mean is not None and not m.failed
          and short_window(m, result.config) is None]  # fmt: skip
    if not acc or not ms:
        return None
    by_count: dict[int, list[Fed]] = {}
    for m in ms:
        by_count.setdefault(m.consumers, []).append(
            fed_at(m, float(acc["samples_per_s"]), target_au)
        )
    n, feds = max(by_count.items(), key=lambda kv: statistics.fmean(f.value for f in kv[1]))
    values = [f.value for f in feds]
    std = statistics.stdev(values) if len(values) > 1 else None
    means = Fed(*(statistics.fmean(getattr(f, k) for f in feds) for k in Fed.__annotations__))
    return means.value, std, n, means


def not_judged(result: ScanResult) -> list[dict]:
    """Each (consumer count, pass) none of whose repeats can be judged: every repeat failed,
    or its window held too few batches or overlapped too little; with why, in words. No
    headline, "fed" or winner comes from these; plots mark them."""
    out = []
    for key in dict.fromkeys((m.consumers, m.pass_name) for m in result.measurements):
        ms = [m for m in result.measurements if (m.consumers, m.pass_name) == key]
        done = [m for m in ms if not m.failed and not m.partial]
        shorts = [s for m in done if (s := short_window(m, result.config)) is not None]
        if done and len(shorts) < len(done):
            continue
        if not done:
            why = "no repeat completed"
        elif any(thin_overlap(m) for m in done):
            why = f"the consumers measured together for under {MIN_OVERLAP:.0%} of their windows"
        else:
            k, need = max(shorts)
            why = f"{k} measured batches per consumer in the common window (needs ≥ {need})"
        out.append({"consumers": key[0], "pass": key[1], "why": why})
    return out


def rate_disagrees(z: Sizing) -> bool:
    """Whether the figure is the rate's, clearly under what the AU alone would have said."""
    au, rate = z.accelerators_fed_by_au, z.accelerators_fed_by_rate
    return au is not None and rate is not None and rate < au * (1 - RATE_DISAGREES)


def measured_batches(m: Measurement, warmup: int) -> int | None:
    """Batches in the measured window of the consumer with the fewest: inside the window every
    consumer shared, or (older files) after ``warmup``; None for a measurement without
    per-consumer figures."""
    if not m.per_consumer:
        return None
    common = [c.common_batches for c in m.per_consumer]
    if all(k is not None for k in common):
        return min(k for k in common if k is not None)
    return max(0, min(c.batches for c in m.per_consumer) - warmup)


def thin_overlap(m: Measurement) -> bool:
    """Whether the consumers' windows overlapped too little (:data:`MIN_OVERLAP`) for the
    measurement's rates to describe the run."""
    return m.window_overlap is not None and m.window_overlap < MIN_OVERLAP


def batches_ahead(m: Measurement, config: dict) -> int:
    """Batches a consumer's loader can have ready when the window opens (:func:`loader_ahead`)."""
    return loader_ahead(config.get("loader"), config.get("loader_options") or {}, m.workers)


def loader_ahead(loader: str | None, options: dict, workers: int) -> int:
    """Batches a loader with ``workers`` can have ready ahead of the consumer: one per worker
    process, but DALI's threads build one batch together and queue ``prefetch`` (2) of them."""
    if loader == "dali":
        return int(options.get("prefetch", 2))
    return max(1, workers)


def short_window(m: Measurement, config: dict) -> tuple[int, int] | None:
    """(measured batches, batches needed) when ``m``'s window held too few to judge its AU
    and rate by, else None; ``config``: the scan's (warm-up batches, loader)."""
    k = measured_batches(m, config.get("warmup_batches", 1))
    need = MIN_BATCHES_PER_WORKER * batches_ahead(m, config)
    return (k, need) if k is not None and (k < need or thin_overlap(m)) else None


def short_count(result: ScanResult, n: int) -> tuple[int, int] | None:
    """(measured batches, batches needed) when no first-pass measurement at ``n`` consumers
    held enough batches to judge its AU by (the longest of them), else None: a count is
    judged when one of its repeats was long enough."""
    first = result.measurements[0].pass_name if result.measurements else None
    shorts = []
    for m in result.measurements:
        if m.consumers == n and m.pass_name == first and not m.failed:
            s = short_window(m, result.config)
            if s is None:
                return None
            shorts.append(s)
    return max(shorts) if shorts else None


def find_max_result(result: ScanResult, found: FoundMax, limit: int) -> dict:
    """find-max's answer as the results file keeps it: the supported consumers (None when the
    search stopped undecided before any count passed), every count tried (None: undecided),
    and the undecided ones' measured and needed batches."""
    undecided = {}
    for n, ok in found.tried.items():
        short = short_count(result, n) if ok is None else None
        if short is not None:
            undecided[str(n)] = {"measured_batches": short[0], "batches_needed": short[1]}
    stopped = found.undecided_at is not None
    return {
        "supported_consumers": None if stopped and not found.best else found.best,
        "tried": {str(k): v for k, v in found.tried.items()},
        "limit": limit,
        "undecided": undecided,
        "undecided_at": found.undecided_at,
    }


def stopped_undecided(fm: dict | None) -> bool:
    """Whether find-max stopped at a count it could not decide: its supported consumers are
    then a lower bound ("≥ N"), or none passed before it stopped."""
    return bool(fm) and fm.get("undecided_at") is not None


def find_max_note(fm: dict) -> str | None:
    """find-max's undecided counts, why, and what that leaves of its answer, in words (the
    verdict's and the console's); None when it decided every count it probed."""
    undecided = fm.get("undecided") or {}
    if not undecided:
        return None
    parts = []
    for n, w in undecided.items():
        k, need = w["measured_batches"], w["batches_needed"]
        parts.append(
            f"{n} consumer{'s' if n != '1' else ''} undecided ({k} measured batch"
            f"{'es' if k != 1 else ''} per consumer, needs ≥ {need}: prefetched batches would "
            "decide its AU)"
        )
    text = "find-max: " + "; ".join(parts)
    at, best = fm.get("undecided_at"), fm.get("supported_consumers")
    if at is not None:
        found = f"supported consumers at least {best}" if best else "before any count passed"
        text += f"; the search stopped at {at}, {found}"
    return text


def short_rule(result: ScanResult) -> str | None:
    """The sizing rule on the measured window, in words, for its shortest measurement."""
    short = [(s, m) for m in result.measurements if not m.failed
             if (s := short_window(m, result.config)) is not None]  # fmt: skip
    if not short:
        return None
    (k, need), m = min(short, key=lambda sm: sm[0][0] - sm[0][1])
    n, w = m.consumers, m.workers
    bs = result.config.get("batch_size")
    at = f"at {setup_text(n, w)}, "
    advice = (
        f"give it more data, a smaller --batch-size{f' (now {bs})' if bs else ''}, fewer "
        "--consumers or --workers"
    )
    if k >= need:  # enough batches, but the consumers measured apart
        return (
            f"the consumers measured together for {m.window_overlap or 0:.0%} of their windows "
            f"{at}{m.pass_name} pass (needs ≥ {MIN_OVERLAP:.0%}: its rates describe a sliver "
            f"of the run): {advice}"
        )
    return (
        f"{k} measured batch{'es' if k != 1 else ''} per consumer {at}{m.pass_name} pass "
        f"(needs ≥ {need}: {MIN_BATCHES_PER_WORKER} per batch the loader can have ready, one "
        "per worker, in the window every consumer measured in, or the batches prefetched "
        f"before it decide AU and rate): {advice}"
    )


def stalled(m: Measurement) -> str | None:
    """A stall inside ``m``'s window (shorter than the watchdog's timeout, so the scan went
    on), in words; None without one."""
    gap, median = m.longest_gap_s, m.median_gap_s
    if gap is None or median is None or gap < max(STALL_MIN_S, STALL_FACTOR * median):
        return None
    at = f" at {m.longest_gap_at_s:.1f} s into the pass" if m.longest_gap_at_s is not None else ""
    n = m.consumers
    return (
        f"a stall: consumer {m.longest_gap_rank} waited {gap:.1f} s for one batch{at} "
        f"({n} consumer{'s' if n != 1 else ''}, {m.pass_name} pass, repeat {m.repeat}; the "
        f"median wait was {median * 1e3:.0f} ms): its rates average the stall in"
    )


def other_load(m: Measurement) -> float | None:
    """Cores' worth of CPU that processes outside the scan used during ``m``, on average (None
    where the scan's own use was not measured)."""
    return summarize(m.monitor).get("other_busy_cores_mean")


def disturbed(result: ScanResult) -> str | None:
    """The worst other load during a measurement, in words, when it was enough to disturb it."""
    loads = [(x, m) for m in result.measurements if (x := other_load(m)) is not None]
    if not loads:
        return None
    worst, m = max(loads, key=lambda xm: xm[0])
    if worst < max(OTHER_LOAD_CORES, 0.1 * result.host.cpu_count):
        return None
    n = m.consumers
    return (
        f"other processes kept {worst:.1f} of {result.host.cpu_count} cores busy during "
        f"{n} consumer{'s' if n != 1 else ''}, {m.pass_name} pass: the host was not idle"
    )


def not_checkable(result: ScanResult) -> list[str]:
    """Each sizing rule whose figures ``result`` lacks (a file from an older feedbench), in
    words: a rule that cannot be checked is not followed, so it too makes the run not valid."""
    out = []
    if result.host is None:
        out.append(f"the rule data ≥ {DATASET_VS_RAM}× RAM is not checkable: no host recorded")
    measured = [m for m in result.measurements if not m.failed]
    blind = [m for m in measured if measured_batches(m, 0) is None]
    if blind:
        m = blind[0]
        out.append(
            f"the measured-window rule (≥ {MIN_BATCHES_PER_WORKER} batches per batch ready) is not "
            f"checkable: {len(blind)} of {len(measured)} measurements (first: {m.consumers} "
            f"consumer{'s' if m.consumers != 1 else ''}, {m.pass_name} pass) hold no "
            "per-consumer batch counts"
        )
    # the scan watches its own processes in every measurement since the rule came: none
    # watched is a file from before it (one short measurement may lack a reading, rightly)
    if measured and all(other_load(m) is None for m in measured):
        out.append(
            f"the idle-host rule (other processes ≤ {OTHER_LOAD_CORES:g} cores) is not "
            "checkable: no measurement recorded the CPU used outside the scan"
        )
    return out


def client_memory_text(host: HostInfo) -> str:
    """The memory a client can cache data in, named: "RAM (25 GB)", or "memory (its cgroup's
    limit) (4.0 GB)" in a memory-limited container."""
    n = host.client_memory_bytes
    what = "RAM" if host.memory_limit_bytes is None else "memory (its cgroup's limit)"
    return f"{what} ({n / 1e9:,.{0 if n >= 10e9 else 1}f} GB)"


def broken_rules(result: ScanResult) -> list[str]:
    """Each sizing rule ``result`` breaks, in words, then each it cannot be checked against
    (:func:`not_checkable`); [] when it follows them all."""
    out = []
    size = result.dataset.bytes
    if result.host and size < DATASET_VS_RAM * result.host.client_memory_bytes:
        out.append(
            f"dataset {size / 1e9:,.2f} GB is under {DATASET_VS_RAM}× this client's "
            f"{client_memory_text(result.host)}: a client could cache it"
        )
    first = result.measurements[0].pass_name if result.measurements else None
    if first != "cold":
        out.append("no cold first pass: the data may have come from a cache")
    cold = [m for m in result.measurements if m.pass_name == "cold"]
    warm = [m.cache.resident_before for m in cold if (m.cache.resident_before or 0) > MAX_RESIDENT]
    if warm or any(m.cache.evict_failures for m in cold):
        out.append("the page cache was not emptied before every cold pass")
    points = [p for p in curve_points(result) if p.pass_name == first]
    few = min((p.repeats for p in points), default=0)
    if few < MIN_REPEATS:
        out.append(f"{few} repeat{'s' if few != 1 else ''} per point (needs ≥ {MIN_REPEATS})")
    noisy = [p for p in points if p.repeats > 1 and not math.isnan(p.cv) and p.cv > MAX_CV]
    if noisy:
        worst = max(noisy, key=lambda p: p.cv)
        out.append(
            f"repeats disagree: CV {worst.cv:.0%} at {count(worst.consumers, 'consumer')} "
            f"(needs ≤ {MAX_CV:.0%})"
        )
    busy = disturbed(result) if result.host else None
    if busy:
        out.append(busy)
    short = short_rule(result)
    if short:
        out.append(short)
    out += [x for m in result.measurements if not m.failed and (x := stalled(m))]
    if result.partial or result.failure:
        out.append("the scan did not complete" + (f" ({result.failure})" if result.failure else ""))
    if any(m.failed for m in result.measurements):
        out.append("a measurement failed")
    return out + not_checkable(result)


def assess(result: ScanResult, target_au: float) -> Sizing:
    broken = broken_rules(result)
    fed_ = accelerators_fed(result, target_au)
    value, std, at, both = fed_ if fed_ else (None, None, None, None)
    return Sizing(
        not_judged=not_judged(result),
        valid=not broken,
        broken=broken,
        accelerators_fed=value,
        accelerators_fed_std=std,
        accelerators_fed_by_au=both.by_au if both else None,
        accelerators_fed_by_rate=both.by_rate if both else None,
        at_consumers=at,
        target_au=target_au if fed_ else None,
        rules={
            "dataset_vs_ram": DATASET_VS_RAM,
            "min_repeats": MIN_REPEATS,
            "max_cv": MAX_CV,
            "max_resident_before_cold": MAX_RESIDENT,
            "other_load_cores": OTHER_LOAD_CORES,
            "min_batches_per_worker": MIN_BATCHES_PER_WORKER,
            "min_window_overlap": MIN_OVERLAP,
        },
    )
