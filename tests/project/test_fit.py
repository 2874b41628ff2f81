"""The scaling models recover known curves: each parameter inside its 95% interval."""

from __future__ import annotations

import math

import numpy as np
import pytest

from feedbench.project import fit

COUNTS = [1, 2, 4, 8, 16]


def points(rates: dict[int, list[float]]) -> tuple[np.ndarray, np.ndarray]:
    n = np.array([c for c, xs in rates.items() for _ in xs], dtype=float)
    return n, np.array([x for xs in rates.values() for x in xs])


def noisy(fn, params, counts, noise, seed, repeats=3):
    rng = np.random.default_rng(seed)
    return {n: list(fn(n, *params) * (1 + noise * rng.standard_normal(repeats))) for n in counts}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    ("sigma", "kappa"), [(0.05, 0.002), (0.2, 0.0005), (0.01, 0.02)]
)  # a knee at 22, at 40, at 7
def test_usl_recovers_sigma_and_kappa_within_their_intervals(seed, sigma, kappa):
    truth = {"lambda": 150.0, "sigma": sigma, "kappa": kappa}
    f = fit.fit("usl", *points(noisy(fit.usl, truth.values(), COUNTS + [32], 0.03, seed)))
    for k, v in truth.items():
        lo, hi = f.intervals[k]
        assert lo <= v <= hi, (k, v, f.intervals[k], f.params[k])
        assert hi - lo < 2 * v + 0.03  # an interval that says something
    assert len(f.draws) == fit.DRAWS and f.draws.shape[1] == 3


def test_amdahl_and_limit_recover_their_parameters():
    a = fit.fit("amdahl", *points(noisy(fit.amdahl, (200.0, 0.1), COUNTS, 0.02, 3)))
    assert a.intervals["sigma"][0] <= 0.1 <= a.intervals["sigma"][1]
    lim = fit.fit("limit", *points(noisy(fit.limit, (100.0, 500.0), COUNTS + [32], 0.02, 4)))
    assert lim.intervals["cap"][0] <= 500 <= lim.intervals["cap"][1]
    assert lim.params["per_consumer"] == pytest.approx(100, rel=0.05)


def test_aicc_chooses_the_model_the_data_came_from():
    usl_fits = [fit.fit(m, *points(noisy(fit.usl, (150, 0.05, 0.004), COUNTS + [32], 0.02, 5)))
                for m in fit.MODELS]  # fmt: skip
    assert fit.choose(usl_fits) == (usl_fits[0], "lowest AICc")
    capped = [fit.fit(m, *points(noisy(fit.limit, (100, 450), COUNTS + [32], 0.01, 6)))
              for m in fit.MODELS]  # fmt: skip
    assert fit.choose(capped)[0].model == "limit"


def test_one_repeat_per_count_still_gets_intervals_and_aicc_needs_points():
    f = fit.fit("usl", *points(noisy(fit.usl, (150, 0.05, 0.002), COUNTS, 0.02, 7, repeats=1)))
    assert all(not math.isnan(lo) for lo, _ in f.intervals.values())
    assert f.aicc is None  # 5 points, 3 parameters and the noise: the correction is undefined
    assert f.loo_error is not None and f.loo_error < 0.1
    exact = fit.fit("usl", *points(noisy(fit.usl, (150, 0.05, 0.002), [1, 2, 4], 0.0, 0, 1)))
    assert all(math.isnan(lo) for lo, _ in exact.intervals.values())  # no degrees of freedom
    assert len(exact.draws) == 0
