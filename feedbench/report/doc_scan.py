"""A scan's results as a :class:`~feedbench.report.doc.Document`: the answer (accelerators fed,
whether the run may size a system), one row per consumer count and pass, the system under test,
the method, the warnings and the command."""

from __future__ import annotations

import statistics
from pathlib import Path

from feedbench.project.projection import Plan
from feedbench.project.section import NOTE, default_plan, section_lines
from feedbench.report.doc import Document, Row, Shown, SystemBlock, Table, command_text, dash
from feedbench.report.doc import plural as _plural
from feedbench.report.fmt import (
    emulation_text,
    fed_text,
    fmt_bytes,
    fmt_pct,
    fmt_rate,
    fmt_s,
    rate_bound_text,
)
from feedbench.report.sut import system_facts
from feedbench.scan.results import CurvePoint, Measurement, ScanResult
from feedbench.scan.sizing import fed_at, rate_disagrees
from feedbench.scan.sweep import curve_points, in_curve, repeat_rates

# the scan's Projection: (the plan, None) or (None, the refusal's line)
Projected = tuple[Plan | None, str | None]


def scan_document(result: ScanResult, source: str, fitted: Projected | None = None) -> Document:
    """The scan's page; its Projection ``fitted`` where the caller fitted it already (the page's
    figure draws the same), else fitted here."""
    z = result.sizing
    facts, flags = system_facts(result)
    plan, refused = fitted if fitted is not None else default_plan(result, source)
    return Document(
        kind="scan",
        title=f"Can {result.dataset.path} keep the accelerators fed?",
        subtitle=f"feedbench scan · {Path(source).name} · {result.created_utc}",
        answer=answer(result),
        valid=z.valid if z else None,
        broken=list(z.broken) if z else [],
        summary=summary_table(result),
        tables=[stage_table(m) for m in _references(result)],
        systems=[SystemBlock("System under test", facts, flags)],
        method=method(result),
        findings=list(result.verdict.evidence) if result.verdict else [],
        projection=section_lines(plan) if plan else [refused or ""],
        projection_note=NOTE.format(source=Path(source).name),
        warnings=warnings(result),
        command=command_text(result.command),
        created_utc=result.created_utc,
        tool_version=result.tool_version,
    )


def accelerator_name(acc: dict | None) -> str:
    """An emulated accelerator in words: a profile's or workload's name, else its appetite."""
    if not acc:
        return "accelerators"
    each = f"{fmt_rate(acc.get('samples_per_s'))} samples/s each"
    if acc.get("kind") in ("profile", "workload"):
        return f"× {acc.get('name')} ({each})"
    if acc.get("kind") == "step":
        return f"accelerators ({acc.get('name')}, {each})"
    return f"accelerators ({each})"


def answer(result: ScanResult) -> list[str]:
    """Accelerators fed (a fraction, ± its spread) first, then the verdict."""
    lines = []
    z = result.sizing
    if z is not None and z.accelerators_fed is not None and result.accelerator:
        bound = f"; {rate_bound_text(z.accelerators_fed_by_au, z.accelerators_fed_by_rate)}"
        lines.append(
            f"Feeds {fed_text(z.accelerators_fed, z.accelerators_fed_std)} "
            f"{accelerator_name(result.accelerator)} at AU ≥ {z.target_au:.0%} "
            f"(best at {_plural(z.at_consumers or 0, 'consumer')}"
            f"{bound if rate_disagrees(z) else ''})."
        )
    elif z is not None and result.accelerator and z.not_judged:
        lines.append(f"Accelerators fed: not judged ({not_judged_text(z)}).")
    elif result.accelerator is None and result.curve:
        lines.append(delivers(result))
    if result.verdict is not None:
        lines.append(result.verdict.text)
    return lines


def not_judged_text(z) -> str:
    """Why no count could be judged, in words (the first few points)."""
    return "no consumer count held a window to judge by: " + "; ".join(
        f"{_plural(d['consumers'], 'consumer')}, {d['pass']}: {d['why']}" for d in z.not_judged[:3]
    )


def delivers(result: ScanResult) -> str:
    """The headline without an emulated step: the best judged point of the first pass (cold:
    first-epoch speed, what storage delivers), the warm pass's beside it, each named."""
    z = result.sizing
    judged = [p for p in result.curve if z is None or z.judged(p.consumers, p.pass_name)]
    first = result.curve[0].pass_name
    parts = []
    for name in dict.fromkeys([first, *(p.pass_name for p in result.curve)]):
        pts = [p for p in judged if p.pass_name == name]
        if not pts:
            parts.append(f"{name} pass: not judged (no count held a window to judge by)")
            continue
        best = max(pts, key=lambda p: p.samples_per_s_mean)
        parts.append(
            f"{fmt_rate(best.samples_per_s_mean)} samples/s ({best.mb_per_s_mean:,.1f} MB/s) at "
            f"{_plural(best.consumers, 'consumer')}, {name} pass"
            + (" (first epoch)" if name == "cold" else " (page cache)" if name == "warm" else "")
        )
    return (
        f"Delivers {parts[0]}"
        + "".join(f"; {x}" for x in parts[1:])
        + " (no accelerator emulated: add --profile or --step-time for accelerators fed)."
    )


def _read_p99_ms(m: Measurement) -> float | None:
    """One repeat's read stage 99th-percentile latency per sample, in ms."""
    p99 = [s.latency.p99_s for s in m.stages if s.name == "read" and s.latency]
    return p99[0] * 1e3 if p99 else None


def _fed(m: Measurement, target: float | None, acc: dict | None) -> float | None:
    """One repeat's accelerators fed as the sizing counts them: its AU's figure, never more
    than its samples/s feed (:func:`~feedbench.scan.sizing.fed_at`)."""
    if m.au_mean is None or not target or not acc:
        return None
    return fed_at(m, float(acc["samples_per_s"]), target).value


def _mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


def _target(result: ScanResult) -> float | None:
    return result.sizing.target_au if result.sizing else result.config.get("target_au")


def _repeats(result: ScanResult, p: CurvePoint) -> list[Measurement]:
    """Every repeat the file holds at the point, in order (the failed ones too)."""
    key = (p.consumers, p.pass_name)
    return sorted((m for m in result.measurements if (m.consumers, m.pass_name) == key),
                  key=lambda m: m.repeat)  # fmt: skip


def repeat_row(m: Measurement, steady: bool, target: float | None, acc: dict | None) -> Row:
    """One repeat's own measured numbers; a repeat the mean leaves out has none, only why."""
    row: Row = {"consumers": m.consumers, "pass": m.pass_name, "repeat": m.repeat,
                "workers": m.workers}  # fmt: skip
    if not in_curve(m):
        row["left_out"] = m.failed or "partial: the scan stopped during this repeat"
        return row
    samples, mb, files = repeat_rates(m, steady)
    row.update({
        "samples_per_s": samples, "mb_per_s": mb, "files_per_s": files,
        "read_p99_ms": _read_p99_ms(m), "au_mean": m.au_mean, "au_min": m.au_min,
        "fed": _fed(m, target, acc),
    })  # fmt: skip
    return row


def mean_row(p: CurvePoint, repeats: list[Row]) -> Row:
    """The curve point's numbers (mean ± std over its repeats), with the read stage's p99
    latency and the accelerators fed: the mean of the repeat rows' own."""
    counted = [r for r in repeats if "left_out" not in r]
    return {
        "consumers": p.consumers, "pass": p.pass_name, "repeat": "mean", "repeats": p.repeats,
        "failed": p.failed, "workers": p.workers,
        "samples_per_s": p.samples_per_s_mean, "samples_per_s_std": p.samples_per_s_std,
        "samples_per_s_min": p.samples_per_s_min, "samples_per_s_max": p.samples_per_s_max,
        "cv": p.cv, "mb_per_s": p.mb_per_s_mean, "files_per_s": p.files_per_s_mean,
        "read_p99_ms": _mean([r["read_p99_ms"] for r in counted]),
        "au_mean": p.au_mean, "au_min": p.au_min, "fed": _mean([r["fed"] for r in counted]),
        "speedup": p.speedup, "efficiency": p.efficiency,
    }  # fmt: skip


def point_rows(result: ScanResult) -> list[tuple[Row, list[Row]]]:
    """Per consumer count and pass: its mean row and the rows of its repeats."""
    target = _target(result)
    out = []
    for p in curve_points(result):
        steady = p.rate_basis == "steady"
        repeats = [repeat_row(m, steady, target, result.accelerator) for m in _repeats(result, p)]
        mean = mean_row(p, repeats)
        why = _not_judged(result, p)
        if why is not None:  # no figure to size by: its fed is none, and it says why
            mean["fed"], mean["not_judged"] = None, why
        out.append((mean, repeats))
    return out


def _not_judged(result: ScanResult, p: CurvePoint) -> str | None:
    """Why point ``p`` is not judged (:func:`feedbench.scan.sizing.not_judged`); None if it is."""
    z = result.sizing
    for d in z.not_judged if z else []:
        if (d["consumers"], d["pass"]) == (p.consumers, p.pass_name):
            return d["why"]
    return None


def csv_rows(points: list[tuple[Row, list[Row]]]) -> list[Row]:
    """The CSV's rows: each point's repeats (1, 2, …), then its mean row (repeat "mean"); a
    repeat that failed keeps its row, empty but for why it is left out."""
    return [r for mean, repeats in points for r in [*repeats, mean]]


SCAN_CSV = [
    ("consumers", "consumers"),
    ("pass", "pass"),
    ("repeat", "repeat"),
    ("repeats", "repeats"),
    ("failed repeats", "failed"),
    ("loader workers per consumer", "workers"),
    ("samples/s", "samples_per_s"),
    ("samples/s std", "samples_per_s_std"),
    ("samples/s min", "samples_per_s_min"),
    ("samples/s max", "samples_per_s_max"),
    ("CV (std/mean)", "cv"),
    ("MB/s (1 MB = 10^6 B)", "mb_per_s"),
    ("files/s", "files_per_s"),
    ("read p99 latency (ms)", "read_p99_ms"),
    ("AU mean (0-1)", "au_mean"),
    ("AU worst consumer (0-1)", "au_min"),
    ("accelerators fed at target AU", "fed"),
    ("speedup vs 1 consumer (x)", "speedup"),
    ("efficiency (0-1)", "efficiency"),
    ("left out of the mean (why)", "left_out"),
    ("not judged (why)", "not_judged"),
]


def _mean_std(r: Row) -> str:
    spread = f" ± {fmt_rate(r['samples_per_s_std'])}" if r["repeats"] > 1 else ""
    return fmt_rate(r["samples_per_s"]) + spread


def summary_table(result: ScanResult) -> Table:
    points = point_rows(result)
    basis = result.curve[0].rate_basis if result.curve else "steady"
    when = (
        "the samples all consumers delivered in the window every one was measuring in (after "
        "its warm-up batches)"
        if basis == "steady"
        else "all consumers' samples over the whole pass (first start to last end)"
    )
    columns = [
        Shown("consumers", lambda r: str(r["consumers"])),
        Shown("pass", lambda r: r["pass"], "left"),
        Shown("samples/s (mean ± std)", _mean_std),
        Shown("CV", lambda r: f"{r['cv']:.1%}" if r["repeats"] > 1 else "—"),
        Shown("MB/s", lambda r: f"{r['mb_per_s']:,.1f}"),
        Shown("files/s", lambda r: fmt_rate(r["files_per_s"])),
        Shown("read p99", lambda r: dash(r["read_p99_ms"], lambda x: fmt_s(x / 1e3))),
        Shown("AU mean / worst", lambda r: f"{fmt_pct(r['au_mean'])} / {fmt_pct(r['au_min'])}"),
        Shown("accelerators fed", lambda r: dash(r["fed"], lambda x: f"{x:.2f}")),
        Shown("speedup", lambda r: dash(r["speedup"], lambda x: f"{x:.2f}×")),
        Shown(
            "repeats",
            lambda r: str(r["repeats"]) + (f" (+{r['failed']} failed)" if r["failed"] else ""),
        ),
    ]
    return Table(
        title="One row per consumer count and pass",
        rows=[mean for mean, _ in points],  # the page: one row per point
        columns=columns,
        csv=SCAN_CSV,
        csv_rows=csv_rows(points),
        note=f"Rates: {when} ÷ its length; mean ± standard deviation over the repeats. Read "
        "p99: the read stage's 99th-percentile latency per sample. Accelerators fed: the "
        "smaller of N × AU ÷ target AU (at most N) and samples/s ÷ (one accelerator's "
        "samples/s × target AU); none for a point not judged (too few batches in that "
        "window, or consumers measuring apart).",
    )


def _references(result: ScanResult) -> list[Measurement]:
    """The last repeat at the largest consumer count of each pass."""
    out: dict[str, Measurement] = {}
    for m in result.measurements:
        cur = out.get(m.pass_name)
        if not m.failed and (cur is None or (m.consumers, m.repeat) >= (cur.consumers, cur.repeat)):
            out[m.pass_name] = m
    return list(out.values())


def stage_table(m: Measurement) -> Table:
    rows = [
        {
            "stage": s.name,
            "share": s.share,
            "rate": s.samples_per_s,
            "mb": s.mb_per_s,
            "busy_s": s.busy_s,
            "p50": s.latency.p50_s if s.latency else None,
            "p99": s.latency.p99_s if s.latency else None,
            "available": s.available,
        }
        for s in m.stages
    ]
    resident = dash(m.cache.resident_before, lambda x: f"{x:.0%}")
    return Table(
        title=f"Stages at {_plural(m.consumers, 'consumer')} × {_plural(m.workers, 'worker')}, "
        f"{m.pass_name} pass (repeat {m.repeat}; cache resident before: {resident})",
        rows=rows,
        columns=[
            Shown("stage", lambda r: r["stage"], "left"),
            Shown("share of loader time", lambda r: fmt_pct(r["share"]) if r["available"] else ""),
            Shown(
                "samples/s per worker",
                lambda r: fmt_rate(r["rate"]) if r["available"] else "unavailable",
            ),
            Shown("MB/s per worker", lambda r: f"{r['mb']:,.1f}" if r["mb"] else ""),
            Shown("busy (all workers)", lambda r: fmt_s(r["busy_s"])),
            Shown(
                "p50 / p99 latency",
                lambda r: f"{fmt_s(r['p50'])} / {fmt_s(r['p99'])}" if r["p50"] is not None else "",
            ),
        ],
    )


def method(result: ScanResult) -> list[tuple[str, str]]:
    """How the numbers were measured, as (what, how) pairs."""
    cfg, ds, acc = result.config, result.dataset, result.accelerator
    samples = f", {ds.samples:,} samples" if ds.samples is not None else ""
    out = [
        ("data", f"{ds.path}: {ds.format}, {ds.files:,} files, {fmt_bytes(ds.bytes)}{samples}"),
        ("stages", ", ".join(cfg.get("stages") or [])),
        (
            "batch",
            f"{cfg.get('batch_size')} samples"
            + (f", image size {cfg['image_size']}" if cfg.get("image_size") else ""),
        ),
        (
            "consumers",
            ", ".join(str(n) for n in cfg.get("consumers") or [])
            + f"; loader workers per consumer: {cfg.get('workers') or 'the cores shared out'}",
        ),
        ("passes", ", ".join(cfg.get("passes") or []) + _cache_words(result)),
        (
            "repeats",
            f"{cfg.get('repeat')} per point; rates after " + _warmup_words(result),
        ),
    ]
    if cfg.get("direct"):
        out.append(("reads", "O_DIRECT (no page cache)"))
    if cfg.get("loader"):
        out.append(("loader", f"{cfg['loader']} (timed end to end)"))
    if acc:
        mode = "asynchronous" if cfg.get("async_steps") else "synchronous across consumers (DDP)"
        rate = fmt_rate(acc.get("samples_per_s"))
        out.append(("accelerator emulated", f"{acc.get('name')}: {rate} samples/s, "
                    f"{fmt_s(acc.get('step_s'))} per batch of "
                    f"{acc.get('batch_size', cfg.get('batch_size'))}, steps {mode}"))  # fmt: skip
        how = emulation_text(result.measurements)
        if how:
            out.append(("emulated step", how))
        target = result.sizing.target_au if result.sizing else cfg.get("target_au")
        out.append(("AU", "step time ÷ (step time + data wait + sync wait), per consumer; "
                    f"target {dash(target, lambda x: f'{x:.0%}')}"))  # fmt: skip
    if cfg.get("workload"):
        out.append(("workload", f"{cfg['workload']} (MLPerf Storage shape)"))
    rules = result.sizing.rules if result.sizing else {}
    if rules:
        out.append(("sizing rules", f"data ≥ {rules.get('dataset_vs_ram', 5):g}× client RAM; "
                    f"cold first pass (≤ {rules.get('max_resident_before_cold', 0.01):.0%} "
                    f"resident); ≥ {rules.get('min_repeats', 3):g} repeats with CV ≤ "
                    f"{rules.get('max_cv', 0.1):.0%}; an idle host; a complete run"))  # fmt: skip
    return out


def _warmup_words(result: ScanResult) -> str:
    """The warm-up the consumers took: at least --warmup, more while the loader started up."""
    least = result.config.get("warmup_batches")
    taken = [c.warmup_batches for m in result.measurements for c in m.per_consumer
             if c.warmup_batches is not None]  # fmt: skip
    if not taken:  # an older file: the fixed count
        return f"{least} warm-up batch(es) per consumer"
    lo, hi = min(taken), max(taken)
    span = f"{lo}" if lo == hi else f"{lo} to {hi}"
    return (
        f"{span} warm-up batch(es) per consumer (at least {least}; more while the loader "
        "started up)"
    )


def _cache_words(result: ScanResult) -> str:
    cold = [m.cache.resident_before for m in result.measurements
            if m.pass_name == "cold" and m.cache.resident_before is not None]  # fmt: skip
    if not cold:
        return ""
    return (f" (page cache emptied before each cold pass: at most {max(cold):.1%} of the data "
            "was resident when one began)")  # fmt: skip


def warnings(result: ScanResult) -> list[str]:
    out = list(result.warnings)
    out += [f"skipped {e.key} ({e.stage}): {e.message}" for e in result.errors[:5]]
    out += failed_files_lines(result)
    out += [f"failed: {_plural(m.consumers, 'consumer')}, {m.pass_name}, repeat {m.repeat}: "
            f"{m.failed} (no rate: left out)" for m in result.measurements if m.failed]  # fmt: skip
    return out


def failed_files_lines(result: ScanResult) -> list[str]:
    """Each measurement's shards whose reads failed before their end (cut short, corrupt):
    how many, and the first few by name."""
    out = []
    for m in result.measurements:
        if not m.failed_files:
            continue
        more = m.failed_files - len(m.failed_names)
        out.append(
            f"{_plural(m.failed_files, 'shard')} failed before the end (cut short or corrupt; "
            f"{_plural(m.consumers, 'consumer')}, {m.pass_name}, repeat {m.repeat}): "
            + ", ".join(m.failed_names)
            + (f" and {more:,} more" if more > 0 else "")
            + (f"; {m.lost_text()} (by the index)" if m.lost_samples is not None else "")
        )
    return out
