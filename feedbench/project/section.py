"""The projection where a scan is reported: a section of the scan's own page (HTML, Markdown)
and one line per scan on the compare page. Made by the code ``feedbench plan`` runs, with its
defaults (no ``--at``, ``--rate`` or ``--cost``; the scan's accelerator and target AU), so its
figures are those of ``feedbench plan SCAN``; where plan would refuse, its refusal in one line."""

from __future__ import annotations

import numpy as np

from feedbench.core.errors import FeedbenchError
from feedbench.project import projection
from feedbench.project.bands import Band
from feedbench.project.console import MODELS, clients_lines, projection_lines, show_band
from feedbench.project.projection import HeldOut, PassPlan, Plan
from feedbench.project.rules import MAX_REACH
from feedbench.scan.results import ScanResult

REFUSED = "no projection"
NOTE = (
    "Fitted to the scan's one-window aggregate rates by the code feedbench plan runs, with its "
    "defaults (docs/plan.md); `feedbench plan {source}` adds --at K, --rate, --cost."
)
SIZING = "not valid for sizing"  # a plan flag the scan's page shows already, above


def default_plan(
    result: ScanResult, source: str, passes: list[str] | None = None
) -> tuple[Plan | None, str | None]:
    """What ``feedbench plan`` makes of ``result`` without options: (the plan, None), or (None,
    the refusal's one line)."""
    if not result.measurements:
        return None, f"{REFUSED}: the scan holds no measurements"
    env = {"kind": projection.KIND, "created_utc": result.created_utc, "command": [],
           "config": {"seed": 0}, "host": result.host, "system": result.system}  # fmt: skip
    try:
        appetite, au, demand = projection.demand_of(result, None, None)
        ask = projection.Ask(demand=demand)
        return projection.plan(result, source, ask, passes, env, appetite, au), None
    except FeedbenchError as e:
        why = str(e)
        return None, why if why.startswith(REFUSED) else f"{REFUSED}: {why}"
    except (ValueError, np.linalg.LinAlgError) as e:  # points no fit takes (a rate of 0): the
        # page is the scan's, and goes on without its projection
        return None, f"{REFUSED}: the fit failed on these points ({e})"


def rate_at_reach(p: PassPlan) -> str:
    """The chosen model's rate, with its band, at the farthest count projected to."""
    n, mid, low, high = p.curve[-1]
    return (
        f"at {int(n)} consumers ({MAX_REACH}× the largest measured): "
        f"{show_band(Band(mid, low, high))} samples/s"
    )


def section_lines(plan: Plan) -> list[str]:
    """The scan page's Projection: per pass the chosen model, the rate at the farthest count
    with its band, the knee, accelerators fed, the held-out check and the pass's flags."""
    lines = []
    for p in plan.passes:
        chosen, *rest = projection_lines(p, plan)
        lines.append(f"{p.pass_name} pass, {chosen}; {rate_at_reach(p)}")
        lines += rest
        lines += [f"flag: {f}" for f in p.flags if not f.startswith(SIZING)]
    lines += [f"refused: {w}" for w in plan.refused]
    return lines + clients_lines(plan)


def held_out_short(h: HeldOut | None) -> str:
    if h is None or h.predicted is None or h.error is None:
        return "held-out check: none (the fit did not converge)"
    verdict = {True: "inside the band", False: "OUTSIDE the band", None: "no band"}[h.within]
    wide = ", a band wider than the prediction: says little" if h.too_wide else ""
    return f"held-out check at {h.consumers}: {h.error:+.1%}, {verdict}{wide}"


def one_line(result: ScanResult, source: str, pass_name: str) -> str:
    """The projection of one pass as the compare page shows it, or the refusal."""
    plan, refused = default_plan(result, source, [pass_name])
    if plan is None:
        return refused or REFUSED
    if not plan.passes:  # a scan across nodes at one count: its split of client from storage
        return "; ".join([f"{REFUSED} ({w})" for w in plan.refused] + clients_lines(plan)[1:2])
    p = plan.passes[0]
    return f"{MODELS[p.chosen]}, {rate_at_reach(p)}; {held_out_short(p.held_out)}"
