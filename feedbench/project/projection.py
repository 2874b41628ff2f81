"""``feedbench plan``: from a scan's measured points to a projection with its band.

Per pass: the judged one-window aggregate rates (one point per repeat) fitted by each model of
:mod:`.fit`, the better chosen by AICc, the knee and ceiling, the accelerators a demand of
``appetite × target AU`` each keeps fed, the rate and cost per fed accelerator at a target count,
and the held-out check (the chosen model fitted without the largest count, predicting it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from feedbench.core.envelope import Envelope
from feedbench.core.errors import FeedbenchError
from feedbench.project import clients, rules
from feedbench.project import fit as fitting
from feedbench.project.bands import Band
from feedbench.report import current_rules
from feedbench.scan import sizing
from feedbench.scan.results import ScanResult

KIND = "plan"
HUGE = 1e300  # stands for infinity inside a percentile (numpy's warns on inf − inf)
WIDE = 1.0  # a held-out band wider than this × its prediction is too wide to check by
NIL = 1e-9  # a σ or κ under this is none: the knee or ceiling it would give is unbounded
STEPPED = (
    "the scan emulated an accelerator step: no consumer took more than its appetite, so the "
    "curve shows demand met, not the storage's limit (scan without --profile/--rate/--workload "
    "for the storage's own curve, and give plan --rate)"
)


@dataclass
class FitSummary:
    model: str
    params: dict[str, float]
    intervals: dict[str, list[float | None]]  # None: unbounded, or no interval
    rss: float  # relative residuals, as fitted
    points: int
    aicc: float | None
    loo_error: float | None


@dataclass
class HeldOut:
    """The chosen model fitted to all counts but the largest, predicting the largest."""

    consumers: int
    fitted_counts: list[int]
    measured: float  # mean over the held-out count's repeats
    predicted: Band | None  # None: the fit did not converge
    error: float | None  # (predicted − measured) / measured
    within: bool | None  # measured inside the band; None without a band
    repeats: int = 0  # the held-out count's judged repeats the measured mean is over
    # the band wider than the prediction itself (WIDE): inside it says little
    too_wide: bool = False


@dataclass
class PassPlan:
    pass_name: str
    points: dict[str, list[float]]  # consumers → the repeats' aggregate samples/s
    fits: list[FitSummary]
    chosen: str
    criterion: str
    knee: Band | None  # the count where the rate peaks (usl) or meets its ceiling (limit)
    ceiling: Band | None  # the highest rate the model reaches
    reach: int  # the largest count projected to
    fed: Band | None  # accelerators kept at the target AU, the most over counts ≤ reach
    fed_consumers: int | None  # the count giving it
    target: int | None
    rate_at_target: Band | None
    fed_at_target: Band | None
    usd_per_fed: Band | None
    curve: list[list[float]]  # [N, rate, low, high] for N = 1 … reach (the chosen model)
    held_out: HeldOut | None
    flags: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class Plan(Envelope):
    """The projection of one scan. Its ``host``, ``system`` and the config's ``describe`` and
    ``read_latency_s`` are the scan's: the client and storage the projection is about."""

    source: str
    appetite: float | None  # samples/s one accelerator takes at full utilisation
    target_au: float
    demand: float | None  # appetite × target AU: samples/s per fed accelerator
    cost_usd: float | None
    clients: str  # what the scan tells across clients: one line (clients.note)
    passes: list[PassPlan] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # "pass: why" for each pass not fitted
    # a scan across torchrun nodes: per pass, one client's rate apart from the storage's
    # aggregate, and the clients the target needs (older plan files: none)
    splits: list[clients.ClientSplit] = field(default_factory=list)


def points(result: ScanResult, pass_name: str) -> dict[int, list[float]]:
    """The judged one-window aggregate rates of ``pass_name`` by count: measurements that
    completed, whose window held enough batches (the rule sizing judges by)."""
    out: dict[int, list[float]] = {}
    for m in clients.judged(result, pass_name):
        out.setdefault(m.consumers, []).append(m.steady_samples_per_s or 0.0)
    return dict(sorted(out.items()))


def unjudged(result: ScanResult, pass_name: str, judged: set[int]) -> list[tuple[int, str]]:
    """(count, why) for each count measured in ``pass_name`` but left out of the fit."""
    marks = result.sizing.not_judged if result.sizing else sizing.not_judged(result)
    why = {d["consumers"]: d["why"] for d in marks if d.get("pass") == pass_name}
    counts = dict.fromkeys(m.consumers for m in result.measurements if m.pass_name == pass_name)
    return [(n, why.get(n, "no completed repeat had a rate")) for n in counts if n not in judged]


def band(value: float, samples: np.ndarray) -> Band:
    """``value`` with the 95% percentile band of ``samples`` (an infinite side: None)."""
    if len(samples) == 0:
        return Band(_num(value), None, None)
    lo, hi = np.percentile(np.nan_to_num(samples, posinf=HUGE, neginf=-HUGE), [2.5, 97.5])
    return Band(_num(value), _num(float(lo)), _num(float(hi)))


def _num(x: float) -> float | None:
    return x if math.isfinite(x) and abs(x) < HUGE else None


def knee_of(model: str, p: np.ndarray) -> tuple[float, float]:
    """(knee count, ceiling rate) of one parameter vector: USL's peak N* = √((1−σ)/κ) and the
    rate there; Amdahl has no knee and approaches λ/σ; limit meets its cap at cap / rate."""
    if model == "usl":
        lam, sigma, kappa = p
        if kappa < NIL:
            return math.inf, (lam / sigma if sigma >= NIL else math.inf)
        n = max(1.0, math.sqrt(max(1 - sigma, 0) / kappa))  # σ = 1: no consumer adds
        return n, float(fitting.usl(n, lam, sigma, kappa))
    if model == "amdahl":
        return math.inf, (p[0] / p[1] if p[1] >= NIL else math.inf)
    per, cap = p
    return (cap / per if per > 0 else math.inf), cap


def fed_curve(rates: np.ndarray, ns: np.ndarray, demand: float) -> np.ndarray:
    """Accelerators kept fed at each count: N of them while the rate covers N × demand, then
    what the rate covers; ``rates`` (draws × counts) or (counts,)."""
    return np.minimum(ns, rates / demand)


def draw_rates(f: fitting.ModelFit, ns: np.ndarray) -> np.ndarray:
    """The model's rate at each of ``ns`` for each of the fit's draws (draws × counts)."""
    fn = fitting.MODELS[f.model].fn
    return np.array([fn(ns, *d) for d in f.draws]).reshape(len(f.draws), len(ns))


def curve_rows(f: fitting.ModelFit, ns: np.ndarray) -> list[list[float]]:
    mid, drawn = f.predict(ns), draw_rates(f, ns)
    if len(drawn) == 0:
        return [[float(n), float(m), float(m), float(m)] for n, m in zip(ns, mid, strict=True)]
    lo, hi = np.percentile(drawn, [2.5, 97.5], axis=0)
    return [[float(v) for v in row] for row in zip(ns, mid, lo, hi, strict=True)]


def held_out(f: fitting.ModelFit, pts: dict[int, list[float]], seed: int) -> HeldOut:
    """Fit ``f``'s model to every count but the largest and predict the largest."""
    last = max(pts)
    kept = {n: xs for n, xs in pts.items() if n != last}
    n = np.array([c for c, xs in kept.items() for _ in xs], dtype=float)
    x = np.array([v for xs in kept.values() for v in xs])
    measured = float(np.mean(pts[last]))
    try:
        g = fitting.fit(f.model, n, x, seed)
    except RuntimeError:
        return HeldOut(last, list(kept), measured, None, None, None, len(pts[last]))
    at = np.array([float(last)])
    predicted = band(float(g.predict(at)[0]), draw_rates(g, at)[:, 0])
    within = None
    if predicted.low is not None and predicted.high is not None:
        within = predicted.low <= measured <= predicted.high
    error = (predicted.value - measured) / measured if predicted.value is not None else None
    wide = within is not None and predicted.value is not None and predicted.value > 0 and (
        (predicted.high - predicted.low) / predicted.value > WIDE  # type: ignore[operator]
    )  # fmt: skip
    return HeldOut(last, list(kept), measured, predicted, error, within, len(pts[last]), wide)


def summary(f: fitting.ModelFit) -> FitSummary:
    return FitSummary(
        model=f.model,
        params=f.params,
        intervals={k: [_num(a) for a in v] for k, v in f.intervals.items()},
        rss=f.rss,
        points=f.points,
        aicc=f.aicc,
        loo_error=f.loo_error,
    )


def fit_all(pts: dict[int, list[float]], seed: int) -> tuple[list[fitting.ModelFit], list[str]]:
    """Every model fitted to ``pts``, and a flag for each that did not converge."""
    n = np.array([c for c, xs in pts.items() for _ in xs], dtype=float)
    x = np.array([v for xs in pts.values() for v in xs])
    fits, flags = [], []
    for name in fitting.MODELS:
        try:
            fits.append(fitting.fit(name, n, x, seed))
        except RuntimeError:
            flags.append(f"the {name} model did not converge: left out")
    if not fits:
        raise FeedbenchError("no scaling model converged on these points")
    return fits, flags


@dataclass
class Ask:
    """What the user asks of a plan: the demand per accelerator, the target count, a price."""

    demand: float | None = None  # samples/s per accelerator kept at the target AU
    target: int | None = None
    cost_usd: float | None = None
    seed: int = 0


def knee_bands(f: fitting.ModelFit) -> tuple[Band | None, Band]:
    value = knee_of(f.model, np.array(list(f.params.values())))
    drawn = np.array([knee_of(f.model, d) for d in f.draws]).reshape(len(f.draws), 2)
    knee = None if f.model == "amdahl" else band(value[0], drawn[:, 0])
    return knee, band(value[1], drawn[:, 1])


def fed_bands(f: fitting.ModelFit, reach: int, ask: Ask) -> dict:
    """Accelerators fed (the most over counts ≤ ``reach``), at the target, and the cost per fed
    accelerator there (at the most-fed count without a target)."""
    if ask.demand is None:
        return {}
    ns = np.arange(1, reach + 1, dtype=float)
    mid, drawn = fed_curve(f.predict(ns), ns, ask.demand), draw_rates(f, ns)
    best = int(np.argmax(mid))
    out: dict = {
        "fed": band(float(mid[best]), fed_curve(drawn, ns, ask.demand).max(axis=1)),
        "fed_consumers": int(ns[best]),
    }
    at = ask.target or int(ns[best])
    fed_at = band(float(mid[at - 1]), fed_curve(drawn[:, at - 1], float(at), ask.demand))
    if ask.target is not None:
        out["fed_at_target"] = fed_at
    if ask.cost_usd is not None:
        out["usd_per_fed"] = Band(*(ask.cost_usd / x if x else None for x in
                                    (fed_at.value, fed_at.high, fed_at.low)))  # fmt: skip
    return out


def plan_pass(result: ScanResult, pass_name: str, ask: Ask) -> tuple[PassPlan | None, list[str]]:
    """One pass's plan, or None and why the rules refuse it."""
    pts = points(result, pass_name)
    broken = result.sizing.broken if result.sizing else None
    verdict = rules.check(list(pts), ask.target, broken, unjudged(result, pass_name, set(pts)))
    if verdict.refused:
        return None, verdict.refused
    empty = [n for n, rates in pts.items() if max(rates) <= 0]
    if empty:  # a judged window that delivered nothing: no curve through it to fit
        counts = ", ".join(str(n) for n in empty)
        return None, [f"nothing delivered at {counts} consumers: no curve to fit"]
    fits, flags = fit_all(pts, ask.seed)
    chosen, criterion = fitting.choose(fits)
    reach = rules.reach(list(pts))
    knee, ceiling = knee_bands(chosen)
    fed = fed_bands(chosen, reach, ask)
    rate_at = None
    if ask.target is not None:
        at = np.array([float(ask.target)])
        rate_at = band(float(chosen.predict(at)[0]), draw_rates(chosen, at)[:, 0])
    if knee is not None and knee.value is not None and knee.value > reach:
        flags.append(
            f"the knee (N* ≈ {knee.value:,.0f}) and the ceiling there lie beyond "
            f"{rules.MAX_REACH}× the largest count: extrapolated, not figures to size by; the "
            "curve still rises where it is measured"
        )
    if result.accelerator:
        flags.append(STEPPED)
    if fed and fed["fed_consumers"] == reach:
        flags.append(
            f"accelerators fed still rise at {reach}, the farthest count projected to: the "
            "most this storage feeds lies past what the measured counts can tell"
        )
    return PassPlan(
        pass_name=pass_name,
        points={str(n): xs for n, xs in pts.items()},
        fits=[summary(f) for f in fits],
        chosen=chosen.model,
        criterion=criterion,
        knee=knee,
        ceiling=ceiling,
        reach=reach,
        fed=fed.get("fed"),
        fed_consumers=fed.get("fed_consumers"),
        target=ask.target,
        rate_at_target=rate_at,
        fed_at_target=fed.get("fed_at_target"),
        usd_per_fed=fed.get("usd_per_fed"),
        curve=curve_rows(chosen, np.arange(1, reach + 1, dtype=float)),
        held_out=held_out(chosen, pts, ask.seed),
        flags=verdict.flags + flags,
    ), []


def plan(result: ScanResult, source: str, ask: Ask, pass_names: list[str] | None,
         env: dict, appetite: float | None, target_au: float) -> Plan:  # fmt: skip
    """The plan of every pass asked for (default: every pass measured); one clear error where
    the rules refuse them all."""
    measured = list(dict.fromkeys(m.pass_name for m in result.measurements))
    names = pass_names or measured
    missing = [p for p in names if p not in measured]
    if missing:
        raise FeedbenchError(
            f"{source} has no {', '.join(missing)} pass (it has {', '.join(measured) or 'none'})"
        )
    split = clients.splits(result, names, ask.demand, ask.target)
    out = Plan(**env, source=source, appetite=appetite, target_au=target_au, demand=ask.demand,
               cost_usd=ask.cost_usd, clients=clients.note(result, split),
               splits=split)  # fmt: skip
    for name in names:
        p, why = plan_pass(result, name, ask)
        if p is None:
            out.refused += [f"{name}: {w}" for w in why]
        else:
            out.passes.append(p)
    if not out.passes and not out.splits:  # (a split alone is worth showing: one count, K nodes)
        raise FeedbenchError("no projection: " + "; ".join(out.refused))
    return out


def demand_of(result: ScanResult, rate: float | None, target_au: float | None) -> tuple:
    """(appetite, target AU, demand per accelerator): ``rate`` (samples/s one accelerator takes)
    or the scan's emulated accelerator's; the target AU given, else the scan's."""
    appetite = rate
    if appetite is None and result.accelerator:
        appetite = result.accelerator.get("samples_per_s")
    au = target_au if target_au is not None else current_rules.target_au(result)
    if not 0 < au <= 1:
        raise FeedbenchError(f"--target-au {au:g}: give a utilisation in (0, 1]")
    if appetite is not None and appetite <= 0:
        raise FeedbenchError(f"--rate {appetite:g}: give samples/s above 0")
    return appetite, au, (appetite * au if appetite else None)
