"""Scaling models fitted to aggregate rate against consumers, with their intervals.

Three models, each fitted by scipy's ``curve_fit`` (no optimiser of our own):

- ``usl``: Gunther's Universal Scalability Law, X(N) = λN / (1 + σ(N−1) + κN(N−1));
  σ is contention (a share that serialises), κ coherency (a cost that grows with pairs).
- ``amdahl``: the USL with κ = 0: the rate approaches λ/σ and never falls.
- ``limit``: min(storage limit, N × per-consumer rate): linear until a hard ceiling.

Each rate is weighted by its own size (relative errors): a rate's spread over repeats grows with
the rate, and an unweighted fit lets the largest counts decide every parameter.

Intervals are the t-intervals R's ``usl`` package reports (estimate ± t × standard error from the
fit's covariance, t on points − parameters degrees of freedom). A bootstrap over repeats was
tried first: with the 3 repeats a scan makes per count it resamples too little spread, and in
40 simulated curves its 95% intervals held the true σ and κ only 75–80% of the time. Every
derived figure (knee, rate at N, accelerators fed) takes its band from ``draws``: parameter
vectors from the same normal, its covariance scaled so that their percentiles match the
t-intervals; one way for all of them.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

LEVEL = 0.95  # the intervals' confidence
DRAWS = 400  # parameter vectors each band is taken from


def usl(n, lam, sigma, kappa):
    return lam * n / (1 + sigma * (n - 1) + kappa * n * (n - 1))


def amdahl(n, lam, sigma):
    return usl(n, lam, sigma, 0.0)


def limit(n, per_consumer, cap):
    return np.minimum(cap, n * per_consumer)


@dataclass(frozen=True)
class Model:
    name: str
    fn: Callable[..., np.ndarray]
    params: tuple[str, ...]
    lower: tuple[float, ...]
    upper: tuple[float, ...]


MODELS = {
    "usl": Model("usl", usl, ("lambda", "sigma", "kappa"), (0, 0, 0), (np.inf, 1, 1)),
    "amdahl": Model("amdahl", amdahl, ("lambda", "sigma"), (0, 0), (np.inf, 1)),
    "limit": Model("limit", limit, ("per_consumer", "cap"), (0, 0), (np.inf, np.inf)),
}


@dataclass
class ModelFit:
    """One model fitted to (consumers, rate) points: its parameters and intervals, the sum of
    squared relative residuals (as fitted), AICc (None where too few points define it) and the
    leave-one-count-out error (mean |predicted − measured| / measured, each count left out in
    turn)."""

    model: str
    params: dict[str, float]
    intervals: dict[str, tuple[float, float]]
    rss: float
    points: int
    aicc: float | None
    loo_error: float | None
    draws: np.ndarray = field(repr=False, default_factory=lambda: np.zeros((0, 0)))

    def predict(self, n) -> np.ndarray:
        return MODELS[self.model].fn(np.asarray(n, dtype=float), *self.params.values())


def _start(model: Model, n: np.ndarray, x: np.ndarray) -> list[float]:
    """A starting point: the smallest count's rate per consumer, a little contention, and
    (limit) the largest rate seen as the ceiling."""
    per = float(np.mean(x[n == n.min()]) / n.min())
    return {"usl": [per, 0.05, 1e-3], "amdahl": [per, 0.05], "limit": [per, float(x.max())]}[
        model.name
    ]


def fit_params(name: str, n: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares parameters and their covariance; RuntimeError where it does not converge."""
    from scipy import optimize  # here: scipy costs every command that renders a scan a second

    model = MODELS[name]
    with warnings.catch_warnings():  # an undefined covariance is reported as inf, handled below
        warnings.simplefilter("ignore", optimize.OptimizeWarning)
        p, cov = optimize.curve_fit(
            model.fn, n, x, p0=_start(model, n, x), bounds=(model.lower, model.upper),
            sigma=x, maxfev=20_000,
        )  # fmt: skip
    return p, cov


def aicc(rss: float, points: int, params: int) -> float | None:
    """Corrected Akaike information criterion of a least-squares fit; the noise variance counts
    as a parameter. None where points ≤ parameters + 2 (the correction is undefined)."""
    k = params + 1
    if points - k - 1 <= 0 or rss <= 0:
        return None
    return points * math.log(rss / points) + 2 * k + 2 * k * (k + 1) / (points - k - 1)


def loo_error(name: str, n: np.ndarray, x: np.ndarray) -> float | None:
    """Mean relative error predicting each count's mean rate from a fit to the other counts;
    None where leaving one out leaves fewer counts than parameters."""
    counts = np.unique(n)
    if len(counts) - 1 < len(MODELS[name].params):
        return None
    errors = []
    for c in counts:
        keep = n != c
        try:
            p, _ = fit_params(name, n[keep], x[keep])
        except RuntimeError:
            return None
        measured = float(np.mean(x[~keep]))
        errors.append(abs(float(MODELS[name].fn(float(c), *p)) - measured) / measured)
    return float(np.mean(errors))


def normal_draws(name: str, p: np.ndarray, cov: np.ndarray, dof: int, seed: int) -> np.ndarray:
    """Parameter vectors drawn from the fit's normal, its covariance scaled by (t / z)² so
    that percentile bands agree with the t-intervals; kept inside the model's bounds. None
    drawn where the fit has no covariance (as many points as parameters)."""
    from scipy import stats

    model = MODELS[name]
    if dof <= 0 or not np.all(np.isfinite(cov)):
        return np.zeros((0, len(p)))
    widen = (stats.t.ppf((1 + LEVEL) / 2, dof) / stats.norm.ppf((1 + LEVEL) / 2)) ** 2
    rng = np.random.default_rng(seed)
    draws = rng.multivariate_normal(p, cov * widen, size=DRAWS, check_valid="ignore")
    return np.clip(draws, model.lower, model.upper)


def t_intervals(model: Model, p: np.ndarray, cov: np.ndarray, dof: int) -> dict[str, tuple]:
    """Estimate ± t(dof) × standard error, as R's ``usl`` reports, cut to the parameter's
    bounds (σ below 0 means nothing); nan without a covariance."""
    from scipy import stats

    if dof <= 0 or not np.all(np.isfinite(np.diag(cov))):
        return {k: (math.nan, math.nan) for k in model.params}
    t = float(stats.t.ppf((1 + LEVEL) / 2, dof))
    se = np.sqrt(np.maximum(np.diag(cov), 0))
    lo = np.maximum(p - t * se, model.lower)
    hi = np.minimum(p + t * se, model.upper)
    return {k: (float(a), float(b)) for k, a, b in zip(model.params, lo, hi, strict=True)}


def fit(name: str, n, x, seed: int = 0) -> ModelFit:
    """Fit model ``name`` to rates ``x`` at consumer counts ``n`` (one point per repeat);
    RuntimeError where the fit does not converge. ``seed``: the draws' (bands repeat)."""
    n, x = np.asarray(n, dtype=float), np.asarray(x, dtype=float)
    model = MODELS[name]
    p, cov = fit_params(name, n, x)
    rss = float(np.sum(((model.fn(n, *p) - x) / x) ** 2))  # relative, as fitted
    dof = len(x) - len(p)
    intervals = t_intervals(model, p, cov, dof)
    draws = normal_draws(name, p, cov, dof, seed)
    if name == "limit":
        unbounded(p, n, x, intervals, draws)
    return ModelFit(
        model=name,
        params={k: float(v) for k, v in zip(model.params, p, strict=True)},
        intervals=intervals,
        rss=rss,
        points=len(x),
        aicc=aicc(rss, len(x), len(p)),
        loo_error=loo_error(name, n, x),
        draws=draws,
    )


def unbounded(p: np.ndarray, n: np.ndarray, x: np.ndarray, intervals: dict, draws) -> None:
    """The limit model's parameter no point determines, bounded on one side only (its
    covariance says 0, as if known exactly): the cap where no point reaches it (at least the
    largest rate), the per-consumer rate where every point is at the cap (at least the cap
    over the smallest count)."""
    per, cap = p
    if not np.any(n * per >= cap):
        intervals["cap"] = (float(x.max()), math.inf)
        draws[:, 1] = math.inf
    elif not np.any(n * per < cap):
        intervals["per_consumer"] = (float(cap / n.min()), math.inf)
        draws[:, 0] = math.inf


def choose(fits: list[ModelFit]) -> tuple[ModelFit, str]:
    """The better fit and the criterion that chose it: the lowest AICc where every fit has one,
    else the lowest leave-one-count-out error, else the smallest residual sum of squares."""
    if all(f.aicc is not None for f in fits):
        return min(fits, key=lambda f: f.aicc), "lowest AICc"  # type: ignore[arg-type,return-value]
    if all(f.loo_error is not None for f in fits):
        return min(fits, key=lambda f: f.loo_error), "lowest leave-one-count-out error"  # type: ignore[arg-type,return-value]
    return min(fits, key=lambda f: f.rss), "smallest residual sum of squares"
