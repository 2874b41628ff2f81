"""A scan's results as rich tables and sentences."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from feedbench.report.doc_scan import failed_files_lines, not_judged_text
from feedbench.report.fmt import (
    count,
    emulation_text,
    fed_text,
    fmt_bytes,
    fmt_pct,
    fmt_rate,
    fmt_s,
    plain,
    rate_bound_text,
    setup_text,
    shown,
)
from feedbench.report.sut import fact_groups, partial_flag, slowed_flag
from feedbench.report.tables import TABLE_STYLE, number_column, print_table, text_column
from feedbench.scan.results import NOT_VALID, Measurement, ScanResult
from feedbench.scan.sizing import find_max_note, rate_disagrees


def render_scan(result: ScanResult, console: Console, wide: bool = False) -> None:
    """A scan's results in the terminal; ``wide``: every column (files/s, efficiency, the
    workers, each consumer's first batch)."""
    result = shown(result)  # names from the data: one line each, never markup
    ds = result.dataset
    samples = f"{ds.samples:,} samples" if ds.samples is not None else "samples counted per pass"
    console.print(
        f"[bold]{plain(ds.path)}[/]  {plain(ds.format)}, {ds.files:,} files, "
        f"{fmt_bytes(ds.bytes)}, {samples}"
    )
    cfg = result.config
    console.print(f"stages {plain(','.join(cfg['stages']))}; batch {cfg['batch_size']}")
    for line in system_lines(result):
        console.print(line, markup=False)
    if cfg.get("loader"):
        console.print(_loader_line(cfg, ran_with(result)), highlight=False, soft_wrap=True)
    acc = result.accelerator
    if acc:
        mode = "async" if cfg.get("async_steps") else "synchronous (DDP-like)"
        console.print(
            f"emulated accelerator: {plain(acc.get('name'))} — "
            f"{fmt_rate(acc['samples_per_s'])} samples/s,"
            f" {fmt_s(acc['step_s'])} per batch of {acc.get('batch_size', cfg['batch_size'])}, "
            f"steps {mode}"
        )
        how = emulation_text(result.measurements)
        if how:
            console.print(f"emulated step: {plain(how)}", highlight=False)
    _curve_table(result, console, wide)
    for m in _references(result):
        _stage_table(m, console)
        if m.consumers > 1:
            _consumer_table(m, console, wide)
    fm = cfg.get("find_max_result")
    undecided = find_max_note(fm) if fm else None
    if fm:
        mark = {True: "✓", False: "✗", None: "?"}  # ?: undecided, its window too short
        tried = ", ".join(f"{k}{mark[v]}" for k, v in fm["tried"].items())
        console.print(f"find-max (AU ≥ {cfg['target_au']:.0%}): tried {tried}")
        if undecided:
            console.print(f"[yellow]{escape(undecided)}[/] ({NOT_VALID})")
    v = result.verdict
    if v is not None:
        console.print(f"[bold]verdict:[/] {plain(v.text)}")
        for line in v.evidence:
            if line != undecided:  # said above, under find-max
                console.print(f"  · {plain(line)}", highlight=False)
    _sizing_line(result, console)
    for e in result.errors[:5]:
        console.print(f"  [yellow]skipped[/] {plain(e.key)} ({plain(e.stage)}): {plain(e.message)}")
    for line in failed_files_lines(result):
        console.print(f"  [yellow]failed files:[/] {plain(line)}", highlight=False)
    for w in result.warnings:
        console.print(f"[yellow]warning:[/] {plain(w)}")
    partial = partial_flag(result)
    if partial:
        console.print(f"[red]{escape(partial)}[/]")


def _loader_line(cfg: dict, chosen: list[str]) -> str:
    """The training loader measured: its spec, options, (the user's) file hash, and what ours
    chose (``chosen``: :func:`ran_with`)."""
    line = f"loader: {escape(cfg['loader'])}"
    options = cfg.get("loader_options") or {}
    if options:
        line += " with " + ", ".join(f"{plain(k)}={plain(repr(v))}" for k, v in options.items())
    code = cfg.get("loader_code")
    if code:
        line += f" ({escape(code['file'])}, sha256 {code['sha256'][:12]})"
    if chosen:
        line += "; ran with " + "; ".join(plain(c) for c in chosen)
    return line


def ran_with(result: ScanResult) -> list[str]:
    """What our loader chose (the first consumer's ``loader_settings``: where it decoded, its
    workers and their cores): once, or per consumer count where those differ (unescaped)."""
    by_text: dict[str, list[int]] = {}
    for m in result.measurements:
        said = next((c.loader_settings for c in m.per_consumer if c.loader_settings), None)
        if said and m.consumers not in by_text.setdefault(said, []):
            by_text[said].append(m.consumers)
    if len(by_text) == 1:
        return list(by_text)
    return [
        f"{text} (at {', '.join(map(str, n))} {'consumer' if n == [1] else 'consumers'})"
        for text, n in by_text.items()
    ]


def _curve_table(result: ScanResult, console: Console, wide: bool) -> None:
    if not result.curve:
        return
    basis = "after warm-up" if result.curve[0].rate_basis == "steady" else "whole pass"
    workers = {(m.consumers, m.pass_name): m.workers for m in result.measurements}
    passes = len({c.pass_name for c in result.curve}) > 1
    few = {workers.get((c.consumers, c.pass_name)) for c in result.curve}
    show_workers = wide or len(few) > 1
    au = any(c.au_mean is not None for c in result.curve)
    title = f"scaling ({basis}; mean ± std over repeats"
    title += "" if show_workers or None in few else f"; {count(few.pop(), 'worker')} per consumer"
    table = Table(title=title + ")", title_justify="left", **TABLE_STYLE)
    number_column(table, "N")
    if passes:
        table.add_column("pass", no_wrap=True)
    if show_workers:
        number_column(table, "workers")
    for head in ("samples/s", "± std", "CV", "MB/s"):
        number_column(table, head)
    if wide:
        number_column(table, "files/s")
    number_column(table, "speedup")
    if wide:
        number_column(table, "effic.")
    if au:
        number_column(table, "AU mean")
        number_column(table, "AU min")
    text_column(table, "runs", min_width=4)
    z = result.sizing
    for c in result.curve:
        judged = z is None or z.judged(c.consumers, c.pass_name)
        cells = [str(c.consumers) + ("" if judged else " [red]✗[/]")]
        cells += [plain(c.pass_name)] * passes
        cells += [str(workers.get((c.consumers, c.pass_name), ""))] * show_workers
        cells += [fmt_rate(c.samples_per_s_mean), fmt_rate(c.samples_per_s_std), f"{c.cv:.1%}",
                  f"{c.mb_per_s_mean:,.1f}"]  # fmt: skip
        cells += [fmt_rate(c.files_per_s_mean)] * wide
        cells.append(f"{c.speedup:.2f}×" if c.speedup is not None else "—")
        cells += [fmt_pct(c.efficiency)] * wide
        cells += [fmt_pct(c.au_mean), fmt_pct(c.au_min)] * au
        cells.append(str(c.repeats) + (f" (+{c.failed} failed)" if c.failed else ""))
        table.add_row(*cells)
    print_table(console, table)
    console.print(
        "  speedup: samples/s ÷ samples/s of one consumer"
        + (
            "; effic.: samples/s ÷ (N × that), shown only where every consumer had the workers "
            "the one consumer had (with the cores shared out, one consumer already has the "
            "whole machine)"
            if wide
            else "; files/s and efficiency: --wide"
        )
    )
    for d in z.not_judged if z else []:
        console.print(
            f"  [red]✗ not judged[/] {count(d['consumers'], 'consumer')}, {d['pass']}: "
            f"{escape(d['why'])} (no headline or accelerators fed from it)",
            highlight=False,
        )
    for m in result.measurements:
        if m.failed:
            console.print(
                f"  [red]failed[/] {count(m.consumers, 'consumer')}, "
                f"{plain(m.pass_name)}, repeat {m.repeat}: {plain(m.failed)} "
                "(no rate: left out of the curve)",
                highlight=False,
            )


def _references(result: ScanResult) -> list[Measurement]:
    """The measurement at the largest consumer count of each pass (last repeat)."""
    out: dict[str, Measurement] = {}
    for m in result.measurements:
        cur = out.get(m.pass_name)
        if cur is None or (m.consumers, m.repeat) >= (cur.consumers, cur.repeat):
            out[m.pass_name] = m
    return list(out.values())


def _stage_table(m: Measurement, console: Console) -> None:
    resident = "?" if m.cache.resident_before is None else f"{m.cache.resident_before:.0%}"
    title = (
        f"stages — {setup_text(m.consumers, m.workers)}, {plain(m.pass_name)} (cache resident "
        f"before: {resident}); rates per worker, busy time of all workers"
        + (" [red](partial)[/]" if m.partial else "")
    )
    table = Table(title=title, title_justify="left", **TABLE_STYLE)
    text_column(table, "stage")
    for head in ("share", "samples/s", "MB/s in", "busy", "p50", "p99"):
        number_column(table, head)
    for s in m.stages:
        if not s.available:
            note = f": {plain(s.note)}" if s.note else ""
            table.add_row(f"{plain(s.name)} [dim](unavailable{note})[/]", *[""] * 6)
            continue
        table.add_row(
            plain(s.name),
            f"{s.share:.0%}" if s.name != "transfer-pageable" else "apart",
            fmt_rate(s.samples_per_s),
            f"{s.mb_per_s:,.1f}" if s.in_bytes else "",
            fmt_s(s.busy_s),
            fmt_s(s.latency.p50_s) if s.latency else "",
            fmt_s(s.latency.p99_s) if s.latency else "",
        )
    table.add_section()
    end_to_end = any(s.name.startswith("loader:") for s in m.stages)
    # the measurement's rates: over the window every consumer shared, as the curve and the
    # headline give them (the whole pass where there was none)
    common = m.window_s is not None and m.steady_samples_per_s is not None
    rate = m.steady_samples_per_s if common else m.samples_per_s
    mb = m.steady_mb_per_s if common and m.steady_mb_per_s is not None else m.mb_per_s
    table.add_row(
        "[bold]pipeline[/] (total" + (", storage MB/s)" if end_to_end else ")"),
        "",
        f"[bold]{fmt_rate(rate)}[/]",
        f"{mb:,.1f}",
        "",
        "",
        "",
    )
    print_table(console, table)
    _measurement_lines(m, common, end_to_end, console)


def _warmup_text(m: Measurement) -> str:
    """The warm-up the consumers took before their windows (none in older files)."""
    taken = [c.warmup_batches for c in m.per_consumer if c.warmup_batches is not None]
    if not taken:
        return ""
    lo, hi = min(taken), max(taken)
    span = str(lo) if lo == hi else f"{lo} to {hi}"
    return f", after {span} warm-up {'batch' if hi == 1 else 'batches'}"


def _measurement_lines(m: Measurement, common: bool, end_to_end: bool, console: Console) -> None:
    """Under the stage table: the whole pass, the window its rates come from, and the counts."""
    console.print(
        f"  whole pass: {fmt_rate(m.samples_per_s)} samples/s over {fmt_s(m.wall_s)}"
        + (
            f"; window all {m.consumers} consumers measured in: {fmt_s(m.window_s)} "
            f"({m.window_overlap:.0%} of their own), {m.window_samples:,} samples" + _warmup_text(m)
            if common and m.window_overlap and m.window_samples is not None
            else f"; the consumers' windows did not overlap: rates over their span, "
            f"{fmt_s(m.window_s)} (not judged)"
            if common
            else ""
        )
    )
    console.print(
        f"  {m.samples:,} samples in {count(m.batches, 'batch')}, "
        + (
            f"{fmt_bytes(m.read_bytes)} read from storage (I/O counters; files not counted "
            "inside the loader); first batch "
            if end_to_end
            else f"{m.files:,} files ({fmt_rate(m.files_per_s)} files/s), "
            f"{fmt_bytes(m.read_bytes)} read; first batch "
        )
        + f"{fmt_s(m.first_batch_s)} (slowest consumer); errors skipped: {m.errors}"
    )


def _consumer_table(m: Measurement, console: Console, wide: bool) -> None:
    table = Table(
        title="per consumer (data wait: for its next batch; sync wait: for the other consumers)",
        title_justify="left",
        **TABLE_STYLE,
    )
    heads = ["rank", "samples/s", "batches"] + ["first batch"] * wide
    heads += ["data wait p50", "p99", "sync wait", "idle/step", "AU"]
    for head in heads:
        number_column(table, head)
    for c in m.per_consumer:
        cells = [
            str(c.rank),
            fmt_rate(c.samples_per_s),
            str(c.batches)
            + (f" [red](loader: {c.loader_batches})[/]" if _unequal(m, c.loader_batches) else ""),
        ]
        cells += [fmt_s(c.first_batch_s)] * wide
        cells += [
            fmt_s(c.data_wait.p50_s) if c.data_wait else "—",
            fmt_s(c.data_wait.p99_s) if c.data_wait else "—",
            fmt_s(c.sync_wait_s),
            fmt_s(c.barrier_idle_s) if c.barrier_idle_s is not None else "—",
            fmt_pct(c.au),
        ]
        table.add_row(*cells)
    print_table(console, table)
    console.print("  idle/step: the step barrier's own cost, counted in sync wait")


def _sizing_line(result: ScanResult, console: Console) -> None:
    """Accelerators fed (a fraction) and whether the run may size a system; a run that breaks
    a sizing rule says so in red, with each rule."""
    z = result.sizing
    if z is None:
        return
    if z.accelerators_fed is not None and result.accelerator:
        name = result.accelerator.get("name") or "accelerator"
        fed = fed_text(z.accelerators_fed, z.accelerators_fed_std)
        bound = f"; {rate_bound_text(z.accelerators_fed_by_au, z.accelerators_fed_by_rate)}"
        console.print(
            f"[bold]accelerators fed: {fed} × {plain(name)}[/] at AU ≥ "
            f"{z.target_au:.0%} (best at {count(z.at_consumers, 'consumer')}"
            f"{bound if rate_disagrees(z) else ''})"
        )
    elif result.accelerator and z.not_judged:
        console.print(f"[bold]accelerators fed: not judged[/] ({escape(not_judged_text(z))})")
    if z.valid:
        ram = z.rules.get("dataset_vs_ram")
        console.print(f"[green]valid for sizing[/] (data ≥ {ram:g}× RAM, cold, repeats agree)")
    else:
        console.print(f"[bold red]{NOT_VALID}[/]: " + escape("; ".join(z.broken)))


def system_lines(result: ScanResult) -> list[str]:
    """The system under test, the facts the report shows (:mod:`feedbench.report.sut`), one
    line per group of them; then any slowdown the run added on purpose."""
    lines = [" · ".join(f"{what}: {value}" for what, value in g.facts)
             for g in fact_groups(result) if g.console]  # fmt: skip
    slowed = slowed_flag(result)
    return [*lines, slowed] if slowed else lines


def _unequal(m: Measurement, n: int | None) -> bool:
    """Whether this measurement's ranks yielded different batch counts (``n``: one rank's)."""
    counts = {c.loader_batches for c in m.per_consumer if c.loader_batches is not None}
    return n is not None and len(counts) > 1
