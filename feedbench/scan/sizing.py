"""What a sizing decision reads from a scan: how many accelerators it feeds (a fraction), and
whether the run follows the rules that make that number usable for sizing (MLPerf Storage's
spirit: data larger than the client can cache, a cold first pass, repeats that agree).

A run that breaks a rule is still a measurement; it is marked "not valid for sizing" in every
output (terminal, JSON, HTML, compare), never only warned about.
"""

from __future__ import annotations

import math
import statistics

from feedbench.core.timeline import summarize
from feedbench.scan.results import Measurement, ScanResult, Sizing
from feedbench.scan.sweep import curve_points

DATASET_VS_RAM = 5  # MLPerf Storage: the dataset at least 5× the client's RAM
MIN_REPEATS = 3  # repeats per point, for a spread to judge by
MAX_CV = 0.10  # std / mean of the repeats at a point
MAX_RESIDENT = 0.01  # share of the data in the page cache when a cold pass started
OTHER_LOAD_CORES = 0.25  # other processes' CPU, in cores, that disturbs a measurement


def fed(consumers: int, au: float, target_au: float) -> float:
    """Accelerators that ``consumers`` at utilisation ``au`` feed at ``target_au``: the
    accelerator time they were given, in accelerators kept at the target, never more than the
    consumers themselves (8 at AU 0.6 keep 5.3 at 0.9)."""
    return min(float(consumers), consumers * au / target_au)


def accelerators_fed(
    result: ScanResult, target_au: float
) -> tuple[float, float | None, int] | None:
    """The most accelerators any measured count of the first pass feeds, the spread of that
    over its repeats (None with one repeat), and the count; None without an emulated step."""
    first = result.measurements[0].pass_name if result.measurements else None
    by_count: dict[int, list[float]] = {}
    for m in result.measurements:
        if m.pass_name == first and m.au_mean is not None and not m.failed:
            by_count.setdefault(m.consumers, []).append(fed(m.consumers, m.au_mean, target_au))
    if not result.accelerator or not by_count:
        return None
    n, values = max(by_count.items(), key=lambda kv: statistics.fmean(kv[1]))
    std = statistics.stdev(values) if len(values) > 1 else None
    return statistics.fmean(values), std, n


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


def broken_rules(result: ScanResult) -> list[str]:
    """Each sizing rule ``result`` breaks, in words; [] when it follows them all."""
    out = []
    ram_bytes = result.host.memory_bytes
    size = result.dataset.bytes
    if size < DATASET_VS_RAM * ram_bytes:
        out.append(
            f"dataset {size / 1e9:,.2f} GB is under {DATASET_VS_RAM}× this client's RAM "
            f"({ram_bytes / 1e9:,.0f} GB): a client could cache it"
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
            f"repeats disagree: CV {worst.cv:.0%} at {worst.consumers} consumers "
            f"(needs ≤ {MAX_CV:.0%})"
        )
    busy = disturbed(result)
    if busy:
        out.append(busy)
    if result.partial or result.failure:
        out.append("the scan did not complete" + (f" ({result.failure})" if result.failure else ""))
    if any(m.failed for m in result.measurements):
        out.append("a measurement failed")
    return out


def assess(result: ScanResult, target_au: float) -> Sizing:
    broken = broken_rules(result)
    fed_ = accelerators_fed(result, target_au)
    value, std, at = fed_ if fed_ else (None, None, None)
    return Sizing(
        valid=not broken,
        broken=broken,
        accelerators_fed=value,
        accelerators_fed_std=std,
        at_consumers=at,
        target_au=target_au if fed_ else None,
        rules={
            "dataset_vs_ram": DATASET_VS_RAM,
            "min_repeats": MIN_REPEATS,
            "max_cv": MAX_CV,
            "max_resident_before_cold": MAX_RESIDENT,
            "other_load_cores": OTHER_LOAD_CORES,
        },
    )
