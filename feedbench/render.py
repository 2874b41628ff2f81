"""Rendering of results: rich tables. Never measures; everything comes from a ScanResult."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from feedbench.results import ScanResult


def fmt_rate(x: float | None) -> str:
    if x is None:
        return "—"
    if x >= 10_000:
        return f"{x / 1000:,.1f}k"
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:,.1f}"


def fmt_s(x: float | None) -> str:
    if x is None:
        return "—"
    if x < 1e-3:
        return f"{x * 1e6:.0f} µs"
    if x < 1:
        return f"{x * 1e3:.1f} ms"
    return f"{x:.2f} s"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def render_scan(result: ScanResult, console: Console) -> None:
    ds = result.dataset
    samples = f"{ds.samples:,} samples" if ds.samples is not None else "samples unknown"
    console.print(
        f"[bold]{ds.path}[/]  {ds.format}, {ds.files:,} files, {fmt_bytes(ds.bytes)}, {samples}"
    )
    for p in result.passes:
        title = (
            f"{p.name} pass — {p.consumers} consumer{'s' if p.consumers != 1 else ''}, "
            f"cache resident before: "
            + (f"{p.cache.resident_before:.0%}" if p.cache.resident_before is not None else "?")
            + (" [red](partial)[/]" if p.partial else "")
        )
        table = Table(title=title, title_justify="left")
        table.add_column("stage")
        table.add_column("samples/s", justify="right")
        table.add_column("MB/s in", justify="right")
        table.add_column("busy", justify="right")
        table.add_column("share", justify="right")
        table.add_column("p50 / p99 latency", justify="right")
        for s in p.stages:
            if not s.available:
                table.add_row(s.name, "[dim]unavailable[/]", "", "", "", s.note or "")
                continue
            lat = f"{fmt_s(s.latency.p50_s)} / {fmt_s(s.latency.p99_s)}" if s.latency else ""
            table.add_row(
                s.name,
                fmt_rate(s.samples_per_s),
                f"{s.mb_per_s:,.1f}" if s.in_bytes else "",
                fmt_s(s.busy_s),
                f"{s.share:.0%}",
                lat,
            )
        table.add_section()
        table.add_row(
            "[bold]pipeline[/]",
            f"[bold]{fmt_rate(p.samples_per_s)}[/]",
            f"{p.mb_per_s:,.1f}",
            fmt_s(p.wall_s),
            "",
            "",
        )
        console.print(table)
        console.print(
            f"  {p.samples:,} samples in {p.batches} batches, {p.files:,} files "
            f"({fmt_rate(p.files_per_s)} files/s), {fmt_bytes(p.read_bytes)} read; "
            f"first batch {fmt_s(p.first_batch_s)}, then "
            f"{fmt_rate(p.steady_samples_per_s)} samples/s steady; errors skipped: {p.errors}"
        )
    for e in result.errors[:5]:
        console.print(f"  [yellow]skipped[/] {e.key} ({e.stage}): {e.message}")
    for w in result.warnings:
        console.print(f"[yellow]warning:[/] {w}")
