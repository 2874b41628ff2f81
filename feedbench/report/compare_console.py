"""A comparison of scans as rich tables and sentences."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from feedbench.report.compare import Column, Comparison, SystemRow, question
from feedbench.report.fmt import fed_text, fmt_bytes, fmt_rate, plain, shown, supported_text
from feedbench.report.tables import TABLE_STYLE, number_column, print_table, text_column
from feedbench.scan.results import CurvePoint


def render_compare(cmp: Comparison, console: Console) -> None:
    """A :class:`feedbench.report.compare.Comparison` as tables and sentences."""
    cmp = shown(cmp)  # names and labels from the data: one line each, never markup
    console.print(
        f"[bold]{plain(question(cmp.columns))}[/] {len(cmp.columns)} scans, "
        f"{plain(cmp.pass_name)} pass (samples/s after warm-up, mean ± std over repeats)"
    )
    for table in (_setup_table(cmp.columns), _systems_table(cmp.columns), _throughput_table(cmp)):
        print_table(console, table)
    _print_sentences(cmp, console)


def _systems_table(cols: list[Column]) -> Table:
    """One row per system: what a procurement table needs, at each system's reference point
    (the consumer count that fed the most accelerators, else the fastest)."""
    rows = [(c, c.system) for c in cols if c.system is not None]
    priced = any(r.cost_usd for _, r in rows)
    several = any(r.clients > 1 for _, r in rows)
    found = any(c.supported_consumers is not None or c.supported_at_least for c, _ in rows)
    heads = ["system", "fed", "N"] + ["supported"] * found + ["MB/s", "files/s", "read p99"]
    heads += ["clients"] * several + ["$/fed"] * priced + ["sizing"]
    table = Table(title="systems (each at its best consumer count N)", title_justify="left",
                  **TABLE_STYLE)  # fmt: skip
    for name in heads:
        if name in ("system", "sizing"):
            text_column(table, name)
        else:
            number_column(table, name)
    for c, r in rows:
        cells = [
            plain(c.label),
            fed_text(r.accelerators_fed, r.accelerators_fed_std),
            str(r.consumers or "—"),
            *[supported_text(c.supported_consumers, c.supported_at_least)] * found,
            f"{r.mb_per_s:,.0f}" if r.mb_per_s is not None else "—",
            f"{r.files_per_s:,.0f}" if r.files_per_s is not None else "—",
            f"{r.read_p99_ms:.1f} ms" if r.read_p99_ms is not None else "—",
        ]
        cells += [str(r.clients)] * several
        if priced:
            cells += [_usd(r.usd_per_accelerator_fed)]
        table.add_row(*cells, _valid(r))
    return table


def _usd(v: float | None) -> str:
    return f"${v:,.0f}" if v else "—"


def _valid(r: SystemRow) -> str:
    if r.valid_for_sizing is None:
        return "[dim]not assessed[/]"
    return "[green]valid[/]" if r.valid_for_sizing else "[red]not valid[/]"


def _setup_table(cols: list[Column]) -> Table:
    """What each scan measured, one column per scan."""
    table = Table(title="setups", title_justify="left", **TABLE_STYLE)
    text_column(table, "", min_width=6)
    for c in cols:
        text_column(table, plain(c.label))
    for name, values in _setup_rows(cols):
        table.add_row(name, *(plain(v) for v in values))
    return table


def _setup_rows(cols: list[Column]) -> list[tuple[str, list[str]]]:
    def gpus(c: Column) -> str:
        return f"{c.cpus} / {len(c.gpus) or 'none'}" + (f" {c.gpus[0]}" if c.gpus else "")

    def data(c: Column) -> str:
        return f"{c.dataset_format}: {c.dataset_files:,} files, {fmt_bytes(c.dataset_bytes)}"

    def scanned(c: Column) -> str:
        return c.created_utc[:16].replace("T", " ") + (" (partial)" if c.partial else "")

    return [
        ("host", [c.host for c in cols]),
        ("storage", [c.storage or "—" for c in cols]),
        ("described", [c.described or "—" for c in cols]),
        ("CPUs / GPUs", [gpus(c) for c in cols]),
        ("data", [data(c) for c in cols]),
        ("path", [c.dataset for c in cols]),
        ("stages", [",".join(c.stages) for c in cols]),
        ("batch / image", [f"{c.batch_size} / {c.image_size}" for c in cols]),
        ("cache", [c.cache for c in cols]),
        ("accelerator", [c.accelerator or "none" for c in cols]),
        ("scanned", [scanned(c) for c in cols]),
    ]


def _throughput_table(cmp: Comparison) -> Table:
    """One row per consumer count (the fastest in bold where several measured it), then the
    verdicts' limiting stage and how many accelerators each setup feeds."""
    cols = cmp.columns
    table = Table(
        title="throughput by consumer count N (samples/s; MB/s, efficiency, AU under it)",
        title_justify="left",
        **TABLE_STYLE,
    )
    number_column(table, "N")
    for c in cols:
        # the first line of a cell (samples/s ± std) never breaks; the line under it may
        rates = [_rate_text(c.points[n]) for n in cmp.counts if n in c.points]
        width = max([len(r) for r in rates] + [len(c.label), len("not measured")])
        table.add_column(plain(c.label), justify="right", overflow="fold", min_width=width)
    for n in cmp.counts:
        have = [c.points[n].samples_per_s_mean for c in cols if n in c.points]
        top = max(have) if len(have) > 1 else None
        table.add_row(str(n), *(_rate_cell(c.points.get(n), top) for c in cols))
    table.add_section()
    table.add_row("bound", *[plain(f"{c.bound} ({c.resource})") if c.bound else "—" for c in cols])
    table.add_row("feeds", *[_feeds_cell(c) for c in cols])
    return table


def _rate_cell(p: CurvePoint | None, top: float | None) -> str:
    """samples/s (± std over repeats), bold when it is ``top``; MB/s, efficiency and AU under it."""
    if p is None:
        return "[dim]not measured[/]"
    rate = _rate_text(p)
    if top is not None and p.samples_per_s_mean == top:
        rate = f"[bold]{rate}[/]"
    extra = [f"{p.mb_per_s_mean:,.0f} MB/s"]
    if p.efficiency is not None:
        extra.append(f"eff {p.efficiency:.2f}")
    if p.au_mean is not None:
        extra.append(f"AU {p.au_mean:.0%}")
    return f"{rate}\n[dim]{' · '.join(extra)}[/]"


def _rate_text(p: CurvePoint) -> str:
    spread = f" ± {fmt_rate(p.samples_per_s_std)}" if p.repeats > 1 else ""
    return f"{fmt_rate(p.samples_per_s_mean)}{spread}"


def _feeds_cell(c: Column) -> str:
    """Accelerators fed at the target AU (a fraction), else the appetite ratio, else a dash."""
    r = c.system
    if r is not None and r.accelerators_fed is not None:
        return f"{fed_text(r.accelerators_fed, r.accelerators_fed_std)} × {plain(c.accelerator)}"
    if c.feeds_accelerators and c.accelerator:
        return f"≈ {c.feeds_accelerators:.1f} × {plain(c.accelerator)}"
    return "—"


def _print_sentences(cmp: Comparison, console: Console) -> None:
    """The rankings, the summary, each scan's verdict, and the warnings."""
    if cmp.winner:
        console.print(f"[bold]{plain(cmp.winner)}[/]")
    for r in cmp.rankings:
        console.print(r.text, markup=False)
    for line in cmp.summary:
        console.print(line, markup=False)
    for c in cmp.columns:
        if c.verdict:
            console.print(f"[bold]{plain(c.label)}:[/] {plain(c.verdict)}")
    for w in cmp.warnings:
        console.print(f"[yellow]warning:[/] {plain(w)}")
