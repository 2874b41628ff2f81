"""A window that still drained a queue its loader filled while starting: verify names it in the
verdict, with the pace at the window's end. The rule on recorded H200 results (runs 10 and 13,
and issue 29's first check, whose wds stalled twice late in one window): none of them drained."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from feedbench.verify import results as verify_results
from feedbench.verify.analysis import compare
from feedbench.verify.diagnose import DRAIN_RISE, drain, drain_text

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
RECORDED = [
    "2026-12-03-h200-issue29/check-b256-r1",
    "2026-12-03-h200-run10/check-b64-r2",
    "2026-12-04-h200-run13/check-b256-r1",
    "2026-12-04-h200-run13/check-b64-r1",
]


def _load(name: str):
    (path,) = BENCH.glob(f"{name}.json*")
    return verify_results.load(path)


@pytest.mark.parametrize("name", RECORDED)
def test_no_recorded_window_drained(name):
    """Fed loaders, steady waits (64 per GPU: 2-5% every step) and late stalls (issue 29's wds
    at 256: 24% of its last quarter in a few steps, the typical step not waiting) alike."""
    result = _load(name)
    compare(result)
    assert [r.loader for r in result.runs if r.drain is not None] == []
    assert not [v.text for v in result.verdicts if "drained" in v.text]


def test_a_window_whose_end_waits_every_step_is_named_with_its_end_pace():
    """Run 13's torch at 256 (0.99, no wait) with its last 40 steps made to wait 12 ms more
    each, as a loader at 0.84 of the ceiling does once the queue a slow step let it fill is gone."""
    result = _load("2026-12-04-h200-run13/check-b256-r1")
    (run,) = [r for r in result.runs if r.loader == "torch"]
    s = run.ranks[0]
    n = len(s.step_s)
    for i in range(n - 40, n):
        s.data_wait_s[i] += 0.012
        s.step_s[i] += 0.012
    s.window_s = sum(s.step_s)
    # the file's totals and fractions, recomputed from the changed steps
    from feedbench.verify.analysis import summarize_run

    summarize_run(run)
    compare(result)
    d = run.drain
    assert d is not None and d.first_half_wait < 0.01 and d.last_quarter_wait > 0.15
    pace = (sum(s.step_s) / n) / (sum(s.step_s[n - n // 4 :]) / (n // 4))
    assert d.last_quarter_ceiling_fraction == pytest.approx(run.ceiling_fraction * pace)
    (verdict,) = [v.text for v in result.verdicts if v.loader == "torch"]
    assert drain_text(d) in verdict
    assert "so this window overstates it" in verdict and "measure more --steps" in verdict


def test_a_rise_below_the_bar_or_stalls_are_no_drain():
    result = _load("2026-12-04-h200-run13/check-b256-r1")
    compare(result)
    (run,) = [r for r in result.runs if r.loader == "torch"]
    below, stalls = copy.deepcopy(run), copy.deepcopy(run)
    n = len(run.ranks[0].step_s)
    step = sorted(run.ranks[0].step_s)[n // 2]
    for i in range(n - n // 4, n):  # the last quarter: every step waits just under the bar
        below.ranks[0].data_wait_s[i] += (DRAIN_RISE - 0.005) * step
    for i in (n - 20, n - 5):  # two long stalls at the end, as issue 29's first wds at 256
        stalls.ranks[0].data_wait_s[i] += 0.4
        stalls.ranks[0].step_s[i] += 0.4
    assert drain(below) is None and drain(stalls) is None
