"""A plan as a document (``feedbench report plan.json --html/--md/--csv``): the projection with
its band and the held-out check first, the fits side by side, every flag."""

from __future__ import annotations

from pathlib import Path

from feedbench.project.console import (
    MODELS,
    clients_lines,
    knee,
    param,
    projection_lines,
    show_band,
)
from feedbench.project.projection import PassPlan, Plan
from feedbench.report.doc import Document, Shown, SystemBlock, Table, command_text, dash
from feedbench.report.sut import system_facts


def answer(p: PassPlan, plan: Plan) -> str:
    head = f"{p.pass_name} pass, {MODELS[p.chosen]}: "
    if p.fed is not None:
        return (
            head + f"{show_band(p.fed, 1)} accelerators fed at AU ≥ {plan.target_au:.0%}, "
            f"the most at {p.fed_consumers} consumers; knee {knee(p)}"
        )
    return head + f"ceiling {show_band(p.ceiling)} samples/s; knee {knee(p)}"


def fits_table(plan: Plan) -> Table:
    rows = [
        {"pass": p.pass_name, "model": f.model, "fit": f, "aicc": f.aicc, "loo": f.loo_error,
         "chosen": f.model == p.chosen, **f.params}
        for p in plan.passes for f in p.fits
    ]  # fmt: skip
    return Table(
        title="Scaling fits (samples/s against consumers), 95% t-intervals",
        rows=rows,
        columns=[
            Shown("pass", lambda r: r["pass"], "left"),
            Shown("model", lambda r: MODELS[r["model"]], "left"),
            Shown(
                "parameters",
                lambda r: "; ".join(param(r["fit"], k) for k in r["fit"].params),
                "left",
            ),  # fmt: skip
            Shown("AICc", lambda r: dash(r["aicc"], lambda x: f"{x:.1f}")),
            Shown("leave-one-out error", lambda r: dash(r["loo"], lambda x: f"{x:.1%}")),
            Shown("chosen", lambda r: "chosen" if r["chosen"] else ""),
        ],
        csv=[
            ("pass", "pass"),
            ("model", "model"),
            ("lambda (samples/s)", "lambda"),
            ("sigma", "sigma"),
            ("kappa", "kappa"),
            ("per consumer (samples/s)", "per_consumer"),
            ("cap (samples/s)", "cap"),
            ("AICc", "aicc"),
            ("leave-one-out error (0-1)", "loo"),
            ("chosen", "chosen"),
        ],  # fmt: skip
        note="AICc on relative residuals chooses; leave-one-out: each count predicted from "
        "the others.",
    )


def plan_document(plan: Plan, source: str) -> Document:
    lines = [line for p in plan.passes for line in projection_lines(p, plan)]
    lines += clients_lines(plan)[1:]  # a scan across nodes: client apart from storage
    flags = [f for p in plan.passes for f in p.flags]
    facts, slowed = system_facts(plan)  # the scan's client and storage (plan copies them)
    return Document(
        kind="plan",
        title="How far does this storage scale?",
        subtitle=f"feedbench plan · {Path(plan.source).name} · {plan.created_utc}",
        answer=[answer(p, plan) for p in plan.passes] + lines,
        valid=None,
        broken=[],
        summary=fits_table(plan),
        systems=[SystemBlock("System under test (the scan's)", facts, slowed)],
        warnings=flags + [f"refused: {w}" for w in plan.refused] + [f"clients: {plan.clients}"],
        command=command_text(plan.command),
        created_utc=plan.created_utc,
        tool_version=plan.tool_version,
    )
