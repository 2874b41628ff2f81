"""Consumer counts and the scaling curve: pure functions over measurements."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from feedbench.core.stats import spread
from feedbench.scan.results import CurvePoint, Measurement


def curve(measurements: Sequence[Measurement]) -> list[CurvePoint]:
    """Repeats summarised per (consumers, pass): mean ± std of the measurements that completed
    (failed ones are counted beside it, partial ones left out); speedup against one consumer, and
    efficiency where it means something (:func:`scaling`)."""
    groups: dict[tuple[str, int], list[Measurement]] = {}
    failed: dict[tuple[str, int], int] = {}
    for m in measurements:
        if m.failed:
            failed[(m.pass_name, m.consumers)] = failed.get((m.pass_name, m.consumers), 0) + 1
        elif in_curve(m):
            groups.setdefault((m.pass_name, m.consumers), []).append(m)
    points: list[CurvePoint] = []
    # warm-up apart: the steady rate where every measurement has one, else whole-pass rates;
    # MB/s and files/s over the same window (results recorded before the window counted bytes
    # keep their whole-pass MB/s)
    steady = all(m.steady_samples_per_s is not None for ms in groups.values() for m in ms)
    for (pass_name, n), ms in sorted(groups.items(), key=lambda kv: (kv[0][0] != "cold", kv[0])):
        rates = spread([repeat_rates(m, steady)[0] for m in ms])
        aus = [m.au_mean for m in ms if m.au_mean is not None]
        mins = [m.au_min for m in ms if m.au_min is not None]
        points.append(
            CurvePoint(
                consumers=n,
                pass_name=pass_name,
                repeats=len(ms),
                samples_per_s_mean=rates["mean"],
                samples_per_s_std=rates["std"],
                samples_per_s_min=rates["min"],
                samples_per_s_max=rates["max"],
                cv=rates["cv"],
                mb_per_s_mean=_mean([repeat_rates(m, steady)[1] for m in ms]),
                files_per_s_mean=_mean([repeat_rates(m, steady)[2] for m in ms]),
                efficiency=None,
                au_mean=float(np.mean(aus)) if aus else None,
                au_min=float(min(mins)) if mins else None,
                rate_basis="steady" if steady else "pass",
                workers=ms[0].workers,
                failed=failed.get((pass_name, n), 0),
            )
        )
    scaling(points)
    return points


def in_curve(m: Measurement) -> bool:
    """Whether a repeat counts in its point's mean ± std: it completed and has a rate."""
    return not m.failed and not m.partial


def repeat_rates(m: Measurement, steady: bool) -> tuple[float | None, float, float]:
    """One repeat's (samples/s, MB/s, files/s) as its curve point counts them: over the steady
    window (after the warm-up batches) when ``steady``, else over the whole pass. The one
    definition for the curve's means and the report's per-repeat rows."""
    if not steady:
        return m.samples_per_s, m.mb_per_s, m.files_per_s
    return (
        m.steady_samples_per_s,
        _in(m.steady_mb_per_s, m.mb_per_s),
        _in(m.steady_files_per_s, m.files_per_s),
    )


def _mean(values: list) -> float:
    return float(np.mean(values))


def _in(windowed: float | None, whole: float) -> float:
    return windowed if windowed is not None else whole


def scaling(points: list[CurvePoint]) -> None:
    """Speedup = rate(N) / rate(1) for every point; efficiency = rate(N) / (N × rate(1)) only
    where each of the N consumers had the resources the one consumer had (the same loader
    workers). With the cores shared out (default workers = cores / N) one consumer already has
    the whole machine, so N × rate(1) is no ideal and efficiency stays None."""
    for p in points:
        one = next((q for q in points if q.pass_name == p.pass_name and q.consumers == 1), None)
        if one is None or one.samples_per_s_mean <= 0:
            continue
        p.speedup = p.samples_per_s_mean / one.samples_per_s_mean
        if p.workers == one.workers:
            p.efficiency = p.speedup / p.consumers


def curve_points(result) -> list[CurvePoint]:
    """A scan result's scaling curve; when it has none (an older run), the one its measurements
    give."""
    return list(result.curve) if result.curve else curve(result.measurements)


class FoundMax(NamedTuple):
    """What :func:`find_max` found: ``best``, the largest count that passed (0: even one
    consumer failed; a lower bound when ``undecided_at`` is set), ``tried``, every count probed
    in order with its outcome (None: undecided), and ``undecided_at``, the count whose outcome
    was undecided, where the search stopped (None when it finished)."""

    best: int
    tried: dict[int, bool | None]
    undecided_at: int | None


def find_max(
    probe: Callable[[int], bool | None],
    *,
    limit: int,
    known: dict[int, bool | None] | None = None,
) -> FoundMax:
    """Largest N in 1..limit with ``probe(N)`` true, assuming it holds up to some N and then fails.

    Grows 1, 2, 4, … until a probe fails (or ``limit``), then bisects between the last success
    and the first failure. ``known`` holds results already measured. A probe that returns None
    could not decide: neither side of the search can be chosen without it, so it stops there.
    """
    tried: dict[int, bool | None] = dict(known or {})
    good, bad = 0, None
    while (n := _next_probe(good, bad, limit)) is not None:
        if n not in tried:
            ok = probe(n)
            tried[n] = None if ok is None else bool(ok)
        if tried[n] is None:
            return FoundMax(good, tried, n)
        if tried[n]:
            good = n
        else:
            bad = n
    return FoundMax(good, tried, None)


def _next_probe(good: int, bad: int | None, limit: int) -> int | None:
    """The count to probe after ``good`` passed and ``bad`` failed (0 and None: none yet):
    doubling while every probe passed, then ``limit`` itself; bisecting once one failed; None
    when the answer is found."""
    if bad is None:
        return min(max(1, 2 * good), limit) if good < limit else None
    return (good + bad) // 2 if bad - good > 1 else None


def max_consumers_default(cores: int) -> int:
    """Upper bound for --find-max: beyond 2 processes per core a host is only measuring itself."""
    return max(8, 2 * cores)
