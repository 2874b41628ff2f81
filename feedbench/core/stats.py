"""Statistics of repeats and latencies: pure functions over numbers."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any


@dataclass
class Percentiles:
    p50_s: float
    p95_s: float
    p99_s: float
    max_s: float


def percentiles(values) -> Percentiles | None:
    """p50/p95/p99 (linear interpolation) and max of a sequence of seconds; None when empty."""
    import numpy as np

    if len(values) == 0:
        return None
    a = np.asarray(values, dtype=np.float64)
    p50, p95, p99 = np.percentile(a, [50, 95, 99])
    return Percentiles(float(p50), float(p95), float(p99), float(a.max()))


def spread(values) -> dict[str, Any]:
    """Repeats summarised: ``n``, ``mean``, ``std`` (sample std; 0 for one value), ``min``,
    ``max`` and ``cv`` (std / mean) of the values that are not None (all None but ``n`` = 0 when
    there are none). The one summary of repeats for the scan's curve and the benchmark scripts."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return {"n": 0, "mean": None, "std": None, "min": None, "max": None, "cv": None}
    mean = statistics.fmean(vals)
    std = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return {
        "n": len(vals),
        "mean": mean,
        "std": std,
        "min": min(vals),
        "max": max(vals),
        "cv": std / mean if mean > 0 else 0.0,
    }
