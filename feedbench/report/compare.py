"""``feedbench compare``: several scan results side by side, for storage and host procurement.

Everything comes from the results files (never re-measured): per file its host, data, settings,
scaling curve (mean ± std over repeats at each consumer count) and verdict; its sizing is
recomputed from its measurements by today's rules (:mod:`feedbench.report.current_rules`), so
that files of different feedbench versions are judged alike. The comparison says
which setup delivers more at each consumer count that all of them measured, and whether the
difference is larger than the measurements' own spread; and it warns when the files did not
measure the same thing (other data, stages, batch, cache state, emulated accelerator), because a
ranking across different workloads is not a storage comparison.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from feedbench.core import envelope
from feedbench.core.envelope import Envelope
from feedbench.core.errors import FeedbenchError
from feedbench.project import section
from feedbench.report.current_rules import load_scan
from feedbench.report.fmt import count, fed_text, supported_text
from feedbench.report.sut import system_facts
from feedbench.scan.results import NOT_VALID, CurvePoint, ScanResult
from feedbench.scan.sizing import stopped_undecided
from feedbench.scan.sweep import curve_points

SAME_DATA_TOLERANCE = 0.01  # datasets whose bytes differ by more than this are "other data"

NOISE_SIGMAS = 2.0  # a difference is real when it exceeds this many combined standard deviations


@dataclass
class Column:
    """One results file, as the comparison uses it."""

    label: str
    path: str
    host: str
    cpus: int
    gpus: list[str]
    dataset: str
    dataset_format: str
    dataset_bytes: int
    dataset_files: int
    stages: list[str]
    batch_size: int | None
    image_size: int | None
    cache: str  # cold / warm / direct, as configured
    accelerator: str | None
    created_utc: str
    partial: bool
    points: dict[int, CurvePoint]  # consumers → the curve point of the compared pass
    verdict: str | None = None
    bound: str | None = None
    resource: str | None = None
    supported_consumers: int | None = None
    supported_at_least: bool = False  # find-max stopped undecided: a lower bound ("≥ N")
    feeds_accelerators: float | None = None
    failed: list[str] = field(default_factory=list)  # measurements that failed: no points
    storage: str | None = None  # where the bytes came from: "nfs4 from srv:/x", "s3 at host"
    described: str | None = None  # the user's --describe
    system: SystemRow | None = None  # the one-row summary a procurement table shows
    accelerator_samples_per_s: float | None = None  # one emulated accelerator's appetite
    # the system under test as the scan's own report describes it: (what, value) pairs, and
    # what makes the numbers not the system's own (slowed on purpose, partial)
    system_facts: list[tuple[str, str]] = field(default_factory=list)
    system_flags: list[str] = field(default_factory=list)
    # consumer counts of this pass not judged (too few batches in the common window): shown,
    # never the best or a ranking's leader
    not_judged: list[int] = field(default_factory=list)
    # feedbench plan's projection of this pass with its defaults, in one line (or its refusal);
    # None: a comparison from before it was kept
    projection: str | None = None

    def best(self) -> CurvePoint | None:
        judged = [p for n, p in self.points.items() if n not in self.not_judged]
        return max(judged, key=lambda p: p.samples_per_s_mean, default=None)


@dataclass
class SystemRow:
    """One system in one row: what it feeds and delivers at its reference point (the count
    that fed the most accelerators, else its fastest), whether it may size, what it costs."""

    consumers: int | None
    accelerators_fed: float | None
    accelerators_fed_std: float | None
    target_au: float | None
    samples_per_s: float | None
    mb_per_s: float | None
    files_per_s: float | None
    read_p99_ms: float | None
    clients: int
    valid_for_sizing: bool | None  # None: a file from before the sizing rules
    not_valid_because: list[str] = field(default_factory=list)
    cost_usd: float | None = None
    usd_per_accelerator_fed: float | None = None


@dataclass
class Ranking:
    """Every setup that measured ``consumers``, fastest first, each against the fastest."""

    consumers: int
    labels: list[str]
    samples_per_s: list[float]
    vs_leader: list[float]  # each mean / the leader's mean (1.0 for the leader)
    beyond_spread: list[bool | None]  # gap to the leader > NOISE_SIGMAS σ; None: no spread
    text: str


@dataclass(kw_only=True)
class Comparison(Envelope):
    pass_name: str
    columns: list[Column]
    counts: list[int]  # consumer counts, union over the files
    common_counts: list[int]  # measured by every file
    rankings: list[Ranking] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)
    winner: str | None = None  # one sentence: who feeds the most (or costs least), by how much


def _labels(paths: list[str], given: list[str] | None) -> list[str]:
    if given:
        if len(given) != len(paths):
            raise FeedbenchError(
                f"--label given {len(given)} times for {len(paths)} results files: "
                "give one per file"
            )
        return list(given)
    stems = [Path(p).stem for p in paths]
    if len(set(stems)) == len(stems):
        return stems
    return [f"{Path(p).parent.name}/{Path(p).stem}" for p in paths]


def _cache_mode(config: dict[str, Any], pass_name: str) -> str:
    if config.get("direct"):
        return "O_DIRECT"
    if config.get("read_latency_s"):
        return f"{pass_name}, +{config['read_latency_s'] * 1e3:g} ms per read (slowed)"
    if config.get("read_ahead_mb"):
        return f"{pass_name}, read-ahead {config['read_ahead_mb']:g} MiB"
    if config.get("read_thread") is False:  # (files from before the option read in series too)
        return f"{pass_name}, no read thread"
    return pass_name


def _points(result: ScanResult, pass_name: str) -> dict[int, CurvePoint]:
    return {p.consumers: p for p in curve_points(result) if p.pass_name == pass_name}


def _not_judged(result: ScanResult, pass_name: str) -> list[int]:
    z = result.sizing
    return [d["consumers"] for d in (z.not_judged if z else []) if d["pass"] == pass_name]


def column(result: ScanResult, path: str, label: str, pass_name: str) -> Column:
    cfg = result.config
    acc = result.accelerator or {}
    v = result.verdict
    facts, flags = system_facts(result)
    return Column(
        label=label,
        path=str(path),
        host=result.host.hostname,
        cpus=result.host.cpu_count,
        gpus=list(result.host.cuda_devices),
        dataset=result.dataset.path,
        dataset_format=result.dataset.format,
        dataset_bytes=result.dataset.bytes,
        dataset_files=result.dataset.files,
        stages=list(cfg.get("stages") or []),
        batch_size=cfg.get("batch_size"),
        image_size=cfg.get("image_size"),
        cache=_cache_mode(cfg, pass_name),
        accelerator=(acc.get("name") or f"{acc.get('samples_per_s', 0):,.0f} samples/s")
        if acc
        else None,
        created_utc=result.created_utc,
        partial=result.partial,
        points=_points(result, pass_name),
        # the verdict's line and its first reason: why, beside the number
        verdict=(v.text + (f" ({v.evidence[0]})" if v.evidence else "")) if v else None,
        bound=v.bound if v else None,
        resource=v.resource if v else None,
        supported_consumers=v.supported_consumers if v else None,
        supported_at_least=stopped_undecided(cfg.get("find_max_result")),
        feeds_accelerators=v.feeds_accelerators if v else None,
        failed=[
            f"{m.consumers} consumers, {m.pass_name}: {m.failed}"
            for m in result.measurements
            if m.failed and m.pass_name == pass_name
        ],
        system=system_row(result, pass_name),
        storage=_storage(result),
        described=cfg.get("describe"),
        accelerator_samples_per_s=acc.get("samples_per_s") if acc else None,
        system_facts=[(what, value) for what, value in facts],
        system_flags=flags,
        not_judged=_not_judged(result, pass_name),
        projection=section.one_line(result, str(path), pass_name),
    )


def _storage(result: ScanResult) -> str | None:
    z = result.system
    if z is None:
        return None
    if z.kind == "url":
        return f"{z.scheme} at {z.endpoint}"
    return f"{z.fstype} from {z.source}"


def system_row(result: ScanResult, pass_name: str) -> SystemRow:
    z = result.sizing
    points = _points(result, pass_name)
    at = z.at_consumers if z and z.at_consumers in points else None
    judged = [p for n, p in points.items() if n not in _not_judged(result, pass_name)]
    if at is None and judged:
        at = max(judged, key=lambda p: p.samples_per_s_mean).consumers
    p = points.get(at) if at is not None else None
    tr = result.config.get("torchrun") or {}
    clients = max(1, tr.get("world_size", 1) // max(1, tr.get("local_world_size", 1)))
    return SystemRow(
        consumers=at,
        accelerators_fed=z.accelerators_fed if z else None,
        accelerators_fed_std=z.accelerators_fed_std if z else None,
        target_au=z.target_au if z else None,
        samples_per_s=p.samples_per_s_mean if p else None,
        mb_per_s=p.mb_per_s_mean if p else None,
        files_per_s=p.files_per_s_mean if p else None,
        read_p99_ms=_read_p99_ms(result, pass_name, at),
        clients=clients,
        valid_for_sizing=z.valid if z else None,
        not_valid_because=list(z.broken) if z else [],
    )


def _read_p99_ms(result: ScanResult, pass_name: str, n: int | None) -> float | None:
    """The read stage's p99 latency at ``n`` consumers, the mean over repeats."""
    p99s = [
        s.latency.p99_s * 1e3
        for m in result.measurements
        if m.consumers == n and m.pass_name == pass_name and not m.failed
        for s in m.stages
        if s.name == "read" and s.latency is not None
    ]
    return sum(p99s) / len(p99s) if p99s else None


def _differ(columns: list[Column], what: str, get) -> str | None:
    values = {c.label: get(c) for c in columns}
    if len({repr(v) for v in values.values()}) <= 1:
        return None
    listed = "; ".join(f"{k}: {v}" for k, v in values.items())
    return f"{what} differ ({listed})"


def comparability(columns: list[Column]) -> list[str]:
    """What makes these files measure different things (each a warning in words)."""
    out = []
    sizes = [c.dataset_bytes for c in columns]
    if max(sizes) > 0 and (max(sizes) - min(sizes)) / max(sizes) > SAME_DATA_TOLERANCE:
        out.append(
            "the datasets differ in size ("
            + "; ".join(
                f"{c.label}: {c.dataset_files:,} files, {c.dataset_bytes / 1e6:,.0f} MB"
                for c in columns
            )  # fmt: skip
            + "): samples/s compares workloads, not only storage; MB/s is the fairer column"
        )
    for what, get in (
        ("dataset layouts", lambda c: c.dataset_format),
        ("stages", lambda c: ",".join(c.stages)),
        ("batch sizes", lambda c: c.batch_size),
        ("image sizes", lambda c: c.image_size),
        ("cache states", lambda c: c.cache),
        ("emulated accelerators", lambda c: c.accelerator),
    ):
        w = _differ(columns, what, get)
        if w:
            out.append(w)
    for c in columns:
        for f in c.failed:
            out.append(f"{c.label}: a measurement failed ({f}); it is no point, not compared")
        if c.system and c.system.valid_for_sizing is False:
            out.append(f"{c.label}: {NOT_VALID}: " + "; ".join(c.system.not_valid_because))
        if c.partial:
            out.append(f"{c.label} holds partial results (the scan was interrupted or failed)")
        if not c.points:
            out.append(f"{c.label} has no measurement of this pass")
        elif all(p.repeats < 2 for p in c.points.values()):
            out.append(
                f"{c.label} has one repeat per point: no spread, so no difference against it can "
                "be called real (scan with --repeat 3)"
            )
    return out


def _sd(p: CurvePoint) -> float:
    return p.samples_per_s_std if p.repeats > 1 else math.nan


def ranking(columns: list[Column], n: int) -> Ranking | None:
    """The setups that measured ``n`` consumers, fastest first, and whether each gap to the
    fastest is larger than the two measurements' combined spread (``NOISE_SIGMAS`` σ)."""
    have = sorted(
        (c for c in columns if n in c.points and n not in c.not_judged),
        key=lambda c: c.points[n].samples_per_s_mean,
        reverse=True,
    )
    if len(have) < 2 or have[0].points[n].samples_per_s_mean <= 0:
        return None
    lead = have[0].points[n]
    ratios, beyond, parts = [1.0], [None], []
    for c in have[1:]:
        p = c.points[n]
        ratio = p.samples_per_s_mean / lead.samples_per_s_mean
        spread = math.hypot(_sd(lead), _sd(p))
        gap = lead.samples_per_s_mean - p.samples_per_s_mean
        if math.isnan(spread):
            real, why = None, "one repeat: not tested"
        else:
            real = gap > NOISE_SIGMAS * spread
            why = "beyond the spread" if real else "within the spread"
        ratios.append(ratio)
        beyond.append(real)
        parts.append(f"{_times(1 / ratio)} more than {c.label} ({why})")
    rates = " > ".join(f"{c.label} {c.points[n].samples_per_s_mean:,.0f}" for c in have)
    text = f"at {count(n, 'consumer')}, samples/s: {rates}; {have[0].label} delivers "
    text += ", ".join(parts)
    return Ranking(
        consumers=n,
        labels=[c.label for c in have],
        samples_per_s=[c.points[n].samples_per_s_mean for c in have],
        vs_leader=ratios,
        beyond_spread=beyond,
        text=text,
    )


def _times(x: float) -> str:
    """A ratio as a reader says it: "1.6×", "12×"."""
    return f"{x:.0f}×" if x >= 10 else f"{x:.1f}×"


def same_storage(columns: list[Column]) -> bool:
    """Whether every scan read the same storage from the same host: then they compare settings
    (a loader's workers, the batch, a cache state), not storage."""
    return len({(c.host, c.storage) for c in columns}) == 1 and columns[0].storage is not None


def question(columns: list[Column]) -> str:
    """The question these files can answer: of storage, or (one storage) of settings; by cost
    per accelerator fed where every system is priced, by accelerators fed where each feeds
    one, else by samples/s."""
    what = "setting" if same_storage(columns) else "storage"
    fed = [c for c in columns if c.system and c.system.accelerators_fed is not None]
    if len(fed) == len(columns) and all(c.system.usd_per_accelerator_fed for c in fed):
        return f"Which {what} costs least per accelerator fed?"
    if len(fed) == len(columns) and len({c.accelerator for c in fed}) == 1:
        return f"Which {what} feeds more accelerators?"
    return f"Which {what} delivers more samples/s?"


def summarize(columns: list[Column], common: list[int]) -> list[str]:
    lines = []
    for c in columns:
        best = c.best()
        if best is None:
            continue
        parts = [
            f"{c.label}: best {best.samples_per_s_mean:,.0f} samples/s "
            f"({best.mb_per_s_mean:,.0f} MB/s) at {count(best.consumers, 'consumer')}"
        ]
        fed = c.system.accelerators_fed if c.system else None
        if fed is not None:
            parts.append(f"feeds {fed_text(fed)} × {c.accelerator} at the target AU")
        elif c.supported_consumers is not None:
            n = supported_text(c.supported_consumers, c.supported_at_least)
            parts.append(f"feeds {n} of {c.accelerator} at the target AU")
        elif c.supported_at_least:
            parts.append("find-max stopped undecided before any count passed")
        elif c.feeds_accelerators is not None and c.accelerator:
            parts.append(f"≈ {c.feeds_accelerators:.1f}× the appetite of one {c.accelerator}")
        if c.bound:
            parts.append(f"{c.bound}-bound ({c.resource})")
        lines.append("; ".join(parts))
    if not common and len(columns) > 1:
        lines.append("no consumer count was measured by every file: no ranking")
    return lines


def compare(
    paths: list[str],
    labels: list[str] | None = None,
    pass_name: str = "cold",
    costs: dict[str, float] | None = None,
) -> Comparison:
    """Load ``paths`` (scan results) and compare their ``pass_name`` curves; ``costs``: a price
    (USD) per label, for the cost per accelerator fed."""
    if len(paths) < 2:
        raise FeedbenchError("compare takes at least two scan results files")
    names = _labels(paths, labels)
    if len(set(names)) != len(names):
        raise FeedbenchError(f"labels must differ (got {', '.join(names)})")
    loaded = [load_scan(p) for p in paths]  # each judged by today's sizing rules
    results = [r for r, _ in loaded]
    rejudged = [w for _, w in loaded if w]
    passes = {m.pass_name for r in results for m in r.measurements} | {
        p.pass_name for r in results for p in r.curve
    }
    if pass_name not in passes:
        raise FeedbenchError(
            f"no file measured a {pass_name} pass "
            f"(they hold: {', '.join(sorted(passes)) or 'none'})"
        )
    columns = [column(r, p, n, pass_name) for r, p, n in zip(results, paths, names, strict=True)]
    _price(columns, costs or {})
    counts = sorted({n for c in columns for n in c.points})
    common = [n for n in counts if all(n in c.points for c in columns)]
    ranks = [r for n in common if (r := ranking(columns, n)) is not None]
    return Comparison(
        **envelope.envelope("compare", {"files": list(paths), "labels": names}),
        pass_name=pass_name,
        columns=columns,
        counts=counts,
        common_counts=common,
        rankings=ranks,
        summary=summarize(columns, common),
        winner=winner(columns),
        warnings=rejudged + comparability(columns),
    )


def _price(columns: list[Column], costs: dict[str, float]) -> None:
    known = {c.label for c in columns}
    for label, usd in costs.items():
        if label not in known:
            raise FeedbenchError(
                f"--cost names {label!r}, which is no label here ({', '.join(sorted(known))})"
            )
        if not usd > 0:
            raise FeedbenchError(f"--cost {label}={usd:g}: a price must be above 0")
    for c in columns:
        row = c.system
        if row is None or c.label not in costs:
            continue
        row.cost_usd = costs[c.label]
        if row.accelerators_fed:
            row.usd_per_accelerator_fed = row.cost_usd / row.accelerators_fed


def _beyond(a: float, sa: float | None, b: float, sb: float | None) -> str:
    if sa is None or sb is None:
        return "one repeat: not tested against the spread"
    return (
        "beyond the spread"
        if abs(a - b) > NOISE_SIGMAS * math.hypot(sa, sb)
        else ("within the spread")
    )


def winner(columns: list[Column]) -> str | None:
    """One sentence: the system that feeds the most accelerators (with prices for all: the one
    that costs least per accelerator fed), by how much, and whether that is beyond the spread."""
    rows = [(c, c.system) for c in columns if c.system and c.system.accelerators_fed is not None]
    if len(rows) < 2 or len({c.accelerator for c, _ in rows}) != 1:
        return None
    acc = rows[0][0].accelerator
    if all(r.usd_per_accelerator_fed for _, r in rows):
        rows.sort(key=lambda cr: cr[1].usd_per_accelerator_fed)
        (a, ra), (b, rb) = rows[0], rows[1]
        ua, ub = ra.usd_per_accelerator_fed, rb.usd_per_accelerator_fed

        def sd(r: SystemRow, u: float) -> float | None:
            s = r.accelerators_fed_std
            return None if s is None else u * s / r.accelerators_fed

        return (
            f"{a.label} costs least per {acc} fed: ${ua:,.0f} against ${ub:,.0f} for {b.label}, "
            f"which costs {_times(ub / ua)} more ({_beyond(ua, sd(ra, ua), ub, sd(rb, ub))})"
        )
    rows.sort(key=lambda cr: cr[1].accelerators_fed, reverse=True)
    (a, ra), (b, rb) = rows[0], rows[1]
    fa, fb = ra.accelerators_fed, rb.accelerators_fed
    ratio = f"{_times(fa / fb)} more than {b.label}" if fb > 0 else f"{b.label} feeds none"
    return (
        f"{a.label} feeds the most, {ratio}: {fed_text(fa)} × {acc} at AU ≥ "
        f"{ra.target_au:.0%} against {fed_text(fb)} "
        f"({_beyond(fa, ra.accelerators_fed_std, fb, rb.accelerators_fed_std)})"
    )


def save(comparison: Comparison, path: str | os.PathLike[str]) -> None:
    envelope.save(comparison, path)


def load(path: str | os.PathLike[str], data: dict[str, Any] | None = None) -> Comparison:
    return envelope.load(path, "compare", Comparison, data)
