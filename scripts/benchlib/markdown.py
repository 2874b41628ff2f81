"""The Markdown summary of a bench_scan results dict; it reads results only, never measures."""

from __future__ import annotations

from typing import Any

from .common import FEEDBENCH_BATCH, GOAL

ONE_JOB = ("fio", "feedbench_w0", "feedbench_w1", "python_read", "python_readinto", "cat")
LOADED = ONE_JOB[:-1]  # the tools whose other load the read table shows (cat is not metered apart)
READ_HEAD = (
    "| layout | files, MB | fio | feedbench w0 | w0 / fio (paired) | ≥ 0.9 "
    "| feedbench w1 | Python read() | Python readinto | cat | other load |"
)
PARALLEL_HEAD = (
    "| layout | jobs = consumers | fio | feedbench | ratio (paired) | ≥ 0.9 | other load |"
)
DECODE_HEAD = "| reader | consumers | img/s | per consumer | efficiency | ≥ 0.9 |"
DECODE_PAR_HEAD = " plain ×N img/s | plain ×N efficiency | feedbench / plain ×N (paired) | ≥ 0.9 |"


def fmt_ms(s: dict[str, Any] | None, digits: int = 0) -> str:
    if not s or s.get("mean") is None:
        return "–"
    return f"{s['mean']:,.{digits}f} ± {s['std']:,.{digits}f}"


def fmt_r(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def fmt_load(*xs: float | None) -> str:
    vals = [x for x in xs if x is not None]
    return f"{max(vals):.2f}" if vals else "–"


def verdict(x: float | None) -> str:
    if x is None:
        return "–"
    return "yes" if x >= GOAL else "**no**"


def _get(d: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict) or d.get(k) is None:
            return None
        d = d[k]
    return d


def _ratio_cell(r: float | None, pr: dict[str, Any]) -> str:
    """A ratio of means and, in brackets, the mean ± std of the paired per-repeat ratios."""
    return f"{fmt_r(r)} ({fmt_ms(pr, 2) if pr.get('n') else '–'})"


def machine_line(res: dict[str, Any]) -> str:
    m = res["machine"]
    fs = m["data_filesystem"]
    block = fs.get("block") or {}
    disk = f"{fs.get('fstype', '?')} on {fs.get('device', '?')}"
    if block:
        disk += f" ({block.get('model') or 'no model'}, rotational={block.get('rotational')}"
        disk += f", read_ahead_kb={block.get('read_ahead_kb')})"
    gpus = f", {len(m['gpus'])}× {m['gpus'][0]}" if m.get("gpus") else ""
    return (
        f"Machine: {res['label']} — {m['cpu_model']}, {m['usable_cores']} usable cores "
        f"({m['logical_cpus']} logical), {m['memory_bytes'] / 2**30:.0f} GiB RAM{gpus}, "
        f"kernel {m['kernel']}, data on {disk}; {m['fio'] or 'no fio'}; Python {m['python']}, "
        f"Pillow {m['pillow']} (libjpeg-turbo {m['libjpeg_turbo']}); {res['date']}."
    )


def markdown(res: dict[str, Any]) -> str:
    """The whole summary: machine, command, read tables, decode table, cold check, waiting."""
    lines = [machine_line(res), "", f"Command: `{res['command']}`", ""]
    read = res.get("read") or {}
    if read:
        lines += read_lines(read)
    dec = res.get("decode")
    if dec:
        lines += decode_lines(dec, res["config"]["cores"])
    lines += _cold_check(read)
    if res.get("quiet_waited_s"):
        lines += ["", f"(Waited {res['quiet_waited_s']:.0f} s in all for other load to pass.)"]
    return "\n".join(lines) + "\n"


# --- read --------------------------------------------------------------------------------------


def read_lines(read: dict[str, Any]) -> list[str]:
    """One job per layout, N jobs per layout, then feedbench's read stage alone."""
    rep = next(iter(read.values()))["repeats"]
    lines = [
        f"Read, cold page cache, MB/s (10^6 B/s), mean ± std of {rep} interleaved runs; "
        "'other load' = CPU used by other processes during the runs (cores, worst run):",
        "",
        READ_HEAD,
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *(_read_row(layout, s) for layout, s in read.items()),
        "",
        *_parallel_table(read),
    ]
    stage = [f"{k} {fmt_ms(s['feedbench_w0'].get('read_stage_mb_per_s'))}" for k, s in read.items()]
    return [
        *lines,
        "feedbench w0, read stage alone (bytes / seconds in its read calls; with the "
        "reading thread of shards, seconds waiting for it), MB/s: " + "; ".join(stage) + ".",
        "",
    ]


def _read_row(layout: str, s: dict[str, Any]) -> str:
    r0 = s.get("ratio_feedbench_w0_to_fio")
    load = fmt_load(*(_get(s, k, "other_cores_max") for k in LOADED))
    return (
        f"| {layout} | {s['files']:,}, {s['bytes'] / 1e6:,.0f} "
        f"| {fmt_ms(_get(s, 'fio', 'mb_per_s'))} "
        f"| {fmt_ms(s['feedbench_w0']['mb_per_s'])} "
        f"| {_ratio_cell(r0, s.get('ratio_paired_w0') or {})} | {verdict(r0)} "
        f"| {fmt_ms(_get(s, 'feedbench_w1', 'mb_per_s'))} "
        f"| {fmt_ms(_get(s, 'python_read', 'mb_per_s'))} "
        f"| {fmt_ms(_get(s, 'python_readinto', 'mb_per_s'))} "
        f"| {fmt_ms(_get(s, 'cat', 'mb_per_s'))} | {load} |"
    )


def _parallel_table(read: dict[str, Any]) -> list[str]:
    par = [(k, s["parallel"]) for k, s in read.items() if s.get("parallel")]
    if not par:
        return []
    rows = [_parallel_row(layout, p) for layout, p in par]
    return [PARALLEL_HEAD, "|---|---|---|---|---|---|---|", *rows, ""]


def _parallel_row(layout: str, p: dict[str, Any]) -> str:
    if p.get("skipped"):
        return f"| {layout} | {p['jobs']} | skipped: {p['skipped']} | | | | |"
    r = p.get("ratio_feedbench_to_fio")
    load = fmt_load(_get(p, "fio", "other_cores_max"), _get(p, "feedbench", "other_cores_max"))
    return (
        f"| {layout} | {p['jobs']} | {fmt_ms(_get(p, 'fio', 'mb_per_s'))} "
        f"| {fmt_ms(p['feedbench']['mb_per_s'])} "
        f"| {_ratio_cell(r, p.get('ratio_paired') or {})} | {verdict(r)} "
        f"| {load} |"
    )


def _cold_check(read: dict[str, Any]) -> list[str]:
    """The most of the data found in the page cache when any cold run started."""
    cold = [
        run.get("resident_before")
        for s in read.values()
        for k in ONE_JOB
        for run in (_get(s, k, "runs") or [])
    ]
    cold = [x for x in cold if x is not None]
    if not cold:
        return []
    return [
        "",
        f"Cold check: at most {max(cold):.1%} of the data was in the page cache when a "
        "cold run started.",
    ]


# --- decode ------------------------------------------------------------------------------------


def decode_lines(dec: dict[str, Any], cores: int) -> list[str]:
    """The decode table (plain loop, feedbench per N, plain ×N beside it if run) and its notes."""
    plain = dec["plain_python"]["img_per_s"]
    ref = dec.get("plain_parallel") or {}
    par = bool(ref) and not ref.get("skipped")
    head = DECODE_HEAD + (DECODE_PAR_HEAD if par else "")
    rule = "|---|---|---|---|---|---|" + ("---|---|---|---|" if par else "")
    blank = " | | | |" if par else ""
    lines = [
        f"Decode, warm cache, {dec['files']:,} JPEGs, images/s (feedbench: steady rate after "
        f"the first batch), mean ± std of {plain['n']} interleaved repeats:",
        "",
        head + " other load |",
        rule + "---|",
        f"| plain Python (read + PIL convert) | 1 | {fmt_ms(plain, 1)} | | | |{blank}"
        f" {fmt_load(dec['plain_python']['other_cores_max'])} |",
        *(_decode_row(c, par) for c in dec["feedbench"]),
        "",
        f"feedbench (1 consumer) / plain Python = {fmt_r(dec['ratio_feedbench1_to_plain'])}; "
        f"lowest efficiency for 2 ≤ N ≤ {cores} = "
        f"{fmt_r(dec['min_efficiency_up_to_cores'])}.",
    ]
    if par:
        lines += ["", _parallel_note(ref, cores)]
    return lines


def _decode_row(c: dict[str, Any], par: bool) -> str:
    e = c["efficiency"]
    ok = verdict(e) if c["consumers"] > 1 else ""
    row = (
        f"| feedbench --workers 0 | {c['consumers']} | {fmt_ms(c['img_per_s'], 1)} "
        f"| {c['per_consumer']:,.1f} | {fmt_r(e)} | {ok} |"
    )
    pp = c.get("plain_parallel") or {}
    if par:
        rp = c.get("ratio_to_plain_parallel")
        row += (
            f" {fmt_ms(pp.get('img_per_s'), 1)} | {fmt_r(pp.get('efficiency'))} "
            f"| {_ratio_cell(rp, c.get('ratio_to_plain_parallel_paired') or {})} "
            f"| {verdict(rp)} |"
        )
    load = fmt_load(c["other_cores_max"], pp.get("other_cores_max"))
    return f"{row} {load} |"


def _parallel_note(ref: dict[str, Any], cores: int) -> str:
    low = ref.get("min_ratio_feedbench_to_plain_parallel")
    at = ref.get("min_ratio_at_consumers")
    return (
        f"plain ×N = {ref.get('batch', FEEDBENCH_BATCH)}-image-warm-up steady rates of N "
        "plain-Python decoders started together (one process each, process k decoding "
        "feedbench's consumer k's files), summed; efficiency vs plain ×1. Goal "
        f"feedbench(N) / plain-parallel(N) ≥ {GOAL} for N ≤ {cores}: "
        f"lowest {fmt_r(low)} (N = {at if at is not None else '–'}): "
        f"{'met' if ref.get('goal_met') else '**not met**'}."
    )
