"""Scan results with known rates, for the plan's tests: the fit and its rules are statistics on
the measured points, so the points are written here, not measured."""

from __future__ import annotations

import numpy as np

from feedbench.core.envelope import DatasetInfo, HostInfo
from feedbench.project import fit
from feedbench.scan.results import CacheState, Measurement, ScanResult, Sizing


def measurement(n: int, rate: float, repeat: int, pass_name: str = "cold") -> Measurement:
    return Measurement(
        consumers=n, workers=1, pass_name=pass_name, repeat=repeat, samples=int(rate * 10),
        files=int(rate * 10), read_bytes=int(rate * 1e6), errors=0, batches=100, wall_s=10.0,
        first_batch_s=0.1, samples_per_s=rate, steady_samples_per_s=rate, mb_per_s=rate / 10,
        files_per_s=rate, stages=[], cache=CacheState("cold", 0.0),
    )  # fmt: skip


def scan(rates: dict[int, list[float]], appetite: float | None = None) -> ScanResult:
    """A cold-pass scan of ``rates`` (one measurement per repeat); the command judges it by
    today's sizing rules on load, as report does."""
    ms = [measurement(n, x, i + 1) for n, xs in rates.items() for i, x in enumerate(xs)]
    return ScanResult(
        kind="scan", created_utc="2026-12-03T10:00:00+00:00", command=["feedbench", "scan"],
        config={"warmup_batches": 1, "describe": "test NAS", "read_latency_s": 0.01,
                "stages": ["read"], "batch_size": 8},
        host=HostInfo.current(),
        dataset=DatasetInfo(path="/data", format="tree", files=1000, bytes=10**9, samples=1000),
        measurements=ms,
        accelerator={"samples_per_s": appetite} if appetite else None,
        sizing=Sizing(valid=True),
    )  # fmt: skip


def usl_rates(
    counts, lam: float, sigma: float, kappa: float, noise: float, seed: int, repeats: int = 3
) -> dict[int, list[float]]:
    """USL rates at ``counts``, each repeat off by a relative normal error of sd ``noise``."""
    rng = np.random.default_rng(seed)
    return {
        n: list(fit.usl(n, lam, sigma, kappa) * (1 + noise * rng.standard_normal(repeats)))
        for n in counts
    }
