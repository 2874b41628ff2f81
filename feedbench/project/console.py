"""A plan in the terminal: the models side by side, the projection with its band, the held-out
check, and every flag the rules raised (:mod:`feedbench.project.rules`)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from feedbench.project.bands import Band
from feedbench.project.clients import ClientSplit
from feedbench.project.projection import FitSummary, HeldOut, PassPlan, Plan
from feedbench.report.tables import TABLE_STYLE, number_column, print_table, text_column

PARAMS = {"lambda": "λ", "sigma": "σ", "kappa": "κ", "per_consumer": "per consumer", "cap": "cap"}
LOO_NOTE = "  LOO error: leave-one-out, each count predicted from the fit to the others"
MODELS = {"usl": "USL", "amdahl": "Amdahl (κ = 0)", "limit": "min(cap, N × per consumer)"}


def num(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "∞"
    if abs(x) < 1 and x != 0 and digits == 0:
        return f"{x:.3g}"
    return f"{x:,.{digits}f}"


def show_band(b: Band | None, digits: int = 0, unit: str = "") -> str:
    if b is None or b.value is None:
        return "none (no peak)" if b is not None else "—"
    return f"{num(b.value, digits)}{unit} ({num(b.low, digits)}–{num(b.high, digits)})"


def param(f: FitSummary, k: str) -> str:
    lo, hi = f.intervals[k]
    digits = 0 if k in ("lambda", "per_consumer", "cap") else 4
    ci = "" if lo is None else f" [{num(lo, digits)}, {num(hi, digits)}]"  # None: no interval
    return f"{PARAMS[k]} {f.params[k]:,.{digits}f}{ci}"


def fits_table(p: PassPlan) -> Table:
    """The models side by side: one parameter a line (an interval is never split across
    lines), the numbers never wrapped; only the model's name wraps on a narrow terminal."""
    title = f"scaling fits, {p.pass_name} pass (samples/s against consumers)"
    t = Table(title=title, title_justify="left", **TABLE_STYLE)
    text_column(t, "model", min_width=10)
    t.add_column("parameters [95% interval]", no_wrap=True)
    number_column(t, "AICc")
    number_column(t, "LOO error")
    t.add_column("", no_wrap=True)
    for f in p.fits:
        t.add_row(
            MODELS[f.model],
            "\n".join(param(f, k) for k in f.params),
            "—" if f.aicc is None else f"{f.aicc:.1f}",
            "—" if f.loo_error is None else f"{f.loo_error:.1%}",
            "chosen" if f.model == p.chosen else "",
        )
    return t


def knee(p: PassPlan) -> str:
    if p.knee is None:
        return "none (Amdahl has no peak)"
    return f"{show_band(p.knee, 1)} consumers"


def ceiling(p: PassPlan) -> str:
    if p.ceiling is None or p.ceiling.value is None:
        return "none in sight (the rate keeps rising)"
    return f"{show_band(p.ceiling)} samples/s"


def held_out_line(h: HeldOut | None) -> str:
    if h is None:
        return "held-out check: none"
    fitted = ", ".join(map(str, h.fitted_counts))
    head = f"held-out check: fitted on {fitted}, predicted {h.consumers}"
    if h.predicted is None:
        return f"{head}: the fit did not converge"
    verdict = {True: "inside the band", False: "OUTSIDE the band", None: "no band"}[h.within]
    if h.too_wide:
        verdict += ", a band wider than the prediction itself: the check says little"
    err = "" if h.error is None else f", {h.error:+.1%}"
    over = f" ({h.repeats} repeat{'s' if h.repeats != 1 else ''})"
    band = show_band(h.predicted)
    return f"{head}: {band} samples/s; measured {num(h.measured)}{over}{err}: {verdict}"


def projection_lines(p: PassPlan, plan: Plan) -> list[str]:
    lines = [
        f"chosen: {MODELS[p.chosen]} by {p.criterion}",
        f"knee N*: {knee(p)}; ceiling: {ceiling(p)}",
    ]
    if p.fed is not None and plan.demand is not None:
        lines.append(
            f"accelerators fed at AU ≥ {plan.target_au:.0%} ({num(plan.demand)} samples/s "
            f"each): {show_band(p.fed, 1)}, the most at {p.fed_consumers} consumers "
            f"(projected to ≤ {p.reach})"
        )
    elif plan.demand is None:
        lines.append("accelerators fed: no demand (scan with --profile/--rate, or plan --rate)")
    if p.target is not None:
        lines.append(f"at {p.target}: {show_band(p.rate_at_target)} samples/s")
        if p.fed_at_target is not None:
            lines[-1] += f", {show_band(p.fed_at_target, 1)} accelerators fed"
    if p.usd_per_fed is not None:
        at = p.target or p.fed_consumers
        lines.append(f"cost per fed accelerator at {at}: ${show_band(p.usd_per_fed)}")
    lines.append(held_out_line(p.held_out))
    return lines


def split_lines(s: ClientSplit, plan: Plan) -> list[str]:
    """One pass of a scan across nodes: one client's rate, the storage's, the clients asked."""
    each = s.consumers // s.clients if s.consumers % s.clients == 0 else None
    shape = f"{s.clients} clients, {s.consumers} consumers"
    if each:
        shape = f"{s.clients} clients × {each} consumer{'s' if each != 1 else ''}"
    per_node = ", ".join(
        f"node {n.node} on {n.hostname} {num(sum(n.samples_per_s) / len(n.samples_per_s))}"
        for n in s.nodes
    )
    lines = [
        f"{s.pass_name} pass, {shape}, {s.repeats} repeat{'s' if s.repeats != 1 else ''}"
        f": one client pulled {show_band(s.per_client)} samples/s ({per_node}), "
        f"{num(s.per_client_mb_per_s, 1)} MB/s; the storage served {show_band(s.aggregate)} "
        f"samples/s to all {s.clients}, {num(s.aggregate_mb_per_s, 1)} MB/s",
    ]
    if s.client_fed is not None and plan.demand is not None:
        lines.append(
            f"at {num(plan.demand)} samples/s per accelerator (AU ≥ {plan.target_au:.0%}): one "
            f"client feeds {show_band(s.client_fed, 1)} accelerators; the storage fed "
            f"{show_band(s.storage_fed, 1)} to the {s.clients} together"
        )
    else:
        lines.append(
            "accelerators per client: no demand (scan with --profile/--rate, or plan --rate)"
        )
    if s.clients_needed is not None:
        lines.append(
            f"{s.target} accelerators need {show_band(s.clients_needed)} clients "
            f"(⌈{s.target} × {num(plan.demand)} ÷ one client's samples/s⌉)"
        )
    elif s.client_fed is not None and s.target is None:
        lines.append("clients for K accelerators: give --at K")
    return lines + [f"flag: {f}" for f in s.flags]


def clients_lines(plan: Plan) -> list[str]:
    """The clients note, then each pass's split of client from storage (a scan across nodes)."""
    return [f"clients: {plan.clients}"] + [
        f"clients, {line}" if i == 0 else f"  {line}"
        for s in plan.splits
        for i, line in enumerate(split_lines(s, plan))
    ]


def render_plan(plan: Plan, out: Console) -> None:
    from feedbench.report.sut import slowed_flag

    out.print(f"plan from {plan.source}", markup=False, highlight=False)
    slowed = slowed_flag(plan)
    if slowed:
        out.print(slowed, markup=False, highlight=False)
    for p in plan.passes:
        print_table(out, fits_table(p))
        out.print(LOO_NOTE, markup=False, highlight=False)
        for line in projection_lines(p, plan):
            out.print(line, markup=False, highlight=False)
        for flag in p.flags:
            out.print(f"flag: {flag}", markup=False, highlight=False)
    for why in plan.refused:
        out.print(f"refused: {why}", markup=False, highlight=False)
    for line in clients_lines(plan):
        out.print(line, markup=False, highlight=False)
