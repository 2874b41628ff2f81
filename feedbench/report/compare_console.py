"""A comparison of scans as rich tables and sentences."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from feedbench.report.fmt import fmt_bytes, fmt_rate


def render_compare(cmp, console: Console) -> None:
    """A :class:`feedbench.report.compare.Comparison` as tables and sentences."""
    cols = cmp.columns
    console.print(
        f"[bold]comparing {len(cols)} scans[/], {cmp.pass_name} pass "
        "(samples/s after warm-up, mean ± std over repeats)"
    )
    setup = Table(title="setups", title_justify="left")
    setup.add_column("")
    for c in cols:
        setup.add_column(c.label)
    rows = [
        ("host", [c.host for c in cols]),
        (
            "CPUs / GPUs",
            [
                f"{c.cpus} / {len(c.gpus) or 'none'}" + (f" {c.gpus[0]}" if c.gpus else "")
                for c in cols
            ],  # fmt: skip
        ),
        (
            "data",
            [
                f"{c.dataset_format}: {c.dataset_files:,} files, {fmt_bytes(c.dataset_bytes)}"
                for c in cols
            ],
        ),  # fmt: skip
        ("path", [c.dataset for c in cols]),
        ("stages", [",".join(c.stages) for c in cols]),
        ("batch / image", [f"{c.batch_size} / {c.image_size}" for c in cols]),
        ("cache", [c.cache for c in cols]),
        ("accelerator", [c.accelerator or "none" for c in cols]),
        (
            "scanned",
            [
                c.created_utc[:16].replace("T", " ") + (" (partial)" if c.partial else "")
                for c in cols
            ],
        ),  # fmt: skip
    ]
    for name, values in rows:
        setup.add_row(name, *values)
    console.print(setup)

    table = Table(title="throughput by consumer count", title_justify="left")
    table.add_column("N", justify="right")
    for c in cols:
        table.add_column(c.label, justify="right")
    for n in cmp.counts:
        have = [c.points[n].samples_per_s_mean for c in cols if n in c.points]
        top = max(have) if len(have) > 1 else None
        cells = []
        for c in cols:
            p = c.points.get(n)
            if p is None:
                cells.append("[dim]not measured[/]")
                continue
            spread = f" ± {fmt_rate(p.samples_per_s_std)}" if p.repeats > 1 else ""
            rate = f"{fmt_rate(p.samples_per_s_mean)}{spread}"
            if top is not None and p.samples_per_s_mean == top:
                rate = f"[bold]{rate}[/]"
            extra = [f"{p.mb_per_s_mean:,.0f} MB/s"]
            if p.efficiency is not None:
                extra.append(f"eff {p.efficiency:.2f}")
            if p.au_mean is not None:
                extra.append(f"AU {p.au_mean:.0%}")
            cells.append(f"{rate}\n[dim]{' · '.join(extra)}[/]")
        table.add_row(str(n), *cells)
    table.add_section()
    table.add_row(
        "bound",
        *[f"{c.bound} ({c.resource})" if c.bound else "—" for c in cols],
    )
    table.add_row(
        "feeds",
        *[
            f"{c.supported_consumers} × {c.accelerator}"
            if c.supported_consumers is not None
            else (
                f"≈ {c.feeds_accelerators:.1f} × {c.accelerator}"
                if c.feeds_accelerators and c.accelerator
                else "—"
            )  # fmt: skip
            for c in cols
        ],
    )
    console.print(table)
    for r in cmp.rankings:
        console.print(r.text, markup=False)
    for line in cmp.summary:
        console.print(line, markup=False)
    for c in cols:
        if c.verdict:
            console.print(f"[bold]{c.label}:[/] {c.verdict}")
    for w in cmp.warnings:
        console.print(f"[yellow]warning:[/] {w}")
