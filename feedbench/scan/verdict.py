"""A scan → the bottleneck in words and numbers. A pure function of a ScanResult."""

from __future__ import annotations

from feedbench.core.timeline import Timeline
from feedbench.scan.results import Measurement, ScanResult, Verdict

RESOURCE = {
    "read": "storage",
    "decode": "cpu",
    "augment": "cpu",
    "collate": "cpu",
    "transfer": "pcie",
}
CPU_SATURATED = 0.85  # mean busy cores / cores


def busy_cores(timeline: Timeline | None) -> float | None:
    """Mean number of busy cores (Σ per-core % / 100) over a measurement, None without readings."""
    if timeline is None or not timeline.samples:
        return None
    readings = [sum(s.cpu_percent) / 100.0 for s in timeline.samples if s.cpu_percent]
    return sum(readings) / len(readings) if readings else None


def disk_mb_per_s(timeline: Timeline | None) -> float | None:
    if timeline is None or not timeline.samples:
        return None
    return sum(s.disk_read_bytes_per_s for s in timeline.samples) / len(timeline.samples) / 1e6


def _rate(x: float) -> str:
    return f"{x / 1000:.1f}k" if x >= 10_000 else f"{x:,.0f}"


def _reference(result: ScanResult) -> Measurement | None:
    ms = [m for m in result.measurements if not m.partial and m.samples > 0]
    if not ms:
        return None
    first_pass = ms[0].pass_name
    ms = [m for m in ms if m.pass_name == first_pass]
    return max(ms, key=lambda m: (m.consumers, m.repeat))


def judge(result: ScanResult, target_au: float = 0.9) -> Verdict | None:
    top = _reference(result)
    if top is None:
        return None
    point = next(
        (c for c in result.curve if c.consumers == top.consumers and c.pass_name == top.pass_name),
        None,
    )
    rate = point.samples_per_s_mean if point else top.samples_per_s
    acc = result.accelerator
    appetite = float(acc["samples_per_s"]) if acc else None
    acc_name = (acc.get("accelerator") or acc.get("name")) if acc else None
    model = f" ({acc['name']})" if acc and acc.get("kind") == "profile" else ""
    feeds = rate / appetite if appetite else None
    supported = _supported(result, target_au) if appetite else None

    stages = [s for s in top.stages if s.available and s.name != "transfer-pageable"]
    total_busy = sum(s.busy_s for s in stages)
    limiting = max(stages, key=lambda s: s.busy_s)
    bound = "transfer" if limiting.name.startswith("transfer") else limiting.name
    cores = result.host.cpu_count
    busy = busy_cores(top.monitor)
    n, workers = top.consumers, top.workers
    where = f"{n} consumer{'s' if n != 1 else ''} × {workers} workers, {top.pass_name} cache"
    evidence = [
        f"{s.name}: {s.share:.0%} of loader time ({_rate(s.samples_per_s)} samples/s per worker)"
        for s in stages
    ]
    if busy is not None:
        evidence.append(f"CPU: {busy:.1f} of {cores} cores busy on average")
    idle = [c.barrier_idle_s for c in top.per_consumer if c.barrier_idle_s is not None]
    if idle:
        evidence.append(
            f"step barrier's own cost: {max(idle) * 1e3:.2f} ms per step (counted in sync wait)"
        )
    disk = disk_mb_per_s(top.monitor)
    if disk is not None:
        evidence.append(f"disk reads: {disk:,.1f} MB/s (device counters)")
    read = next((s for s in stages if s.name == "read"), None)
    if read is not None and read.latency is not None:
        evidence.append(
            f"read latency p50 {read.latency.p50_s * 1e3:.2f} ms, "
            f"p99 {read.latency.p99_s * 1e3:.2f} ms (all consumers' reads)"
        )
    waits = sum(c.data_wait_s for c in top.per_consumer)
    # waiting for a slower consumer = sync wait beyond the barrier's own cost on every step
    syncs = sum(
        max(0.0, c.sync_wait_s - (c.barrier_idle_s or 0.0) * max(0, c.batches - 1))
        for c in top.per_consumer
    )
    feeding = ""
    if feeds is not None:
        feeding = f"; {_rate(rate)} samples/s feeds {feeds:.1f} {acc_name}{model}"

    if appetite and point is not None and point.au_mean is not None and point.au_mean >= target_au:
        text = (
            f"accelerator-bound: the data keeps up — AU {point.au_mean:.0%} (min "
            f"{point.au_min:.0%}) at {n} consumers ({where}){feeding}"
        )
        return Verdict("accelerator", "none", text, evidence, supported, feeds)
    if appetite and syncs > waits and syncs > 0:
        text = (
            f"sync-bound: consumers wait more for each other ({syncs:.2f} s) than for their own "
            f"data ({waits:.2f} s) — uneven shards or a straggler{feeding}"
        )
        return Verdict("sync", "straggler", text, evidence, supported, feeds)

    backend = result.config.get("loader")
    if backend:
        return _loader_verdict(top, backend, busy, cores, evidence, feeding, supported, feeds)
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
            reasons.insert(0, f"{busy:.1f}/{cores} cores busy ({busy / cores:.0%})")
        else:
            resource = "cpu (too few workers)"
            reasons.insert(
                0, f"CPU only {busy / cores:.0%} busy: more loader workers (--workers) would help"
            )
    if read is not None and bound != "read" and read.busy_s > 0:
        reasons.append(f"read alone would run {total_busy / read.busy_s:.1f}× faster")
    if bound == "read" and read is not None and read.latency is not None:
        reasons.append(f"read p99 {read.latency.p99_s * 1e3:.1f} ms")
    text = f"{bound}-bound ({resource}): " + ", ".join(reasons or [where]) + feeding
    return Verdict(bound, resource, text, evidence, supported, feeds)


def _loader_verdict(top, backend, busy, cores, evidence, feeding, supported, feeds) -> Verdict:
    """A training loader is timed end to end: name the resource from the monitor, not a stage."""
    gpu = None
    if top.monitor is not None and top.monitor.samples:
        utils = [sum(s.gpu_util_percent) / len(s.gpu_util_percent)
                 for s in top.monitor.samples if s.gpu_util_percent]  # fmt: skip
        gpu = sum(utils) / len(utils) / 100 if utils else None
    if busy is not None and busy >= CPU_SATURATED * cores:
        resource, why = "cpu", f"{busy:.1f}/{cores} cores busy ({busy / cores:.0%})"
    elif gpu is not None and gpu >= 0.9:
        resource, why = "gpu", f"GPU {gpu:.0%} busy decoding"
    else:
        resource = "storage or loader settings"
        why = "CPU " + (f"{busy / cores:.0%} busy" if busy is not None else "not measured")
        why += "; try more workers (--workers) or a colder/warmer pass to tell storage apart"
    wait = top.per_consumer[0].data_wait if top.per_consumer else None
    if wait is not None:
        why += f"; data wait p50 {wait.p50_s * 1e3:.1f} ms, p99 {wait.p99_s * 1e3:.1f} ms"
    text = f"data-bound with the {backend} loader ({resource}): {why}{feeding}"
    return Verdict("loader", resource, text, evidence, supported, feeds)


def _supported(result: ScanResult, target_au: float) -> int | None:
    fm = result.config.get("find_max_result")
    if fm:
        return int(fm["supported_consumers"])
    first = result.measurements[0].pass_name if result.measurements else None
    ok = [
        c.consumers
        for c in result.curve
        if c.pass_name == first and c.au_mean is not None and c.au_mean >= target_au
    ]
    return max(ok) if ok else 0
