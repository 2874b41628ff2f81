"""verify on a loader's workers: waits once per round of their turns, and each worker's time a
batch against what keeping up allows (recorded series, and run 14's recorded wds run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from feedbench.verify import analysis as vr
from feedbench.verify import results as verify_results
from feedbench.verify.results import StepSeries, VerifyRun
from tests.verify.test_verify import _result

ROOT = Path(__file__).resolve().parents[2]
MS = 1e-3


def _series(waits: list[float], workers: int, step_s: float = 60 * MS, **kw) -> StepSeries:
    n = len(waits)
    return StepSeries(rank=0, step=list(range(n)), epoch=[0] * n, images=[256] * n,
                      data_wait_s=waits, forward_backward_s=[step_s] * n, allreduce_s=[0.0] * n,
                      optimizer_s=[0.0] * n, other_s=[0.0] * n,
                      step_s=[step_s + w for w in waits], allreduce_busy_s=[0.0] * n,
                      host_wait_s=waits, buckets=[1] * n, workers=workers,
                      window_s=sum(waits) + n * step_s, **kw)  # fmt: skip


def _loader_run(name: str, s: StepSeries) -> VerifyRun:
    return vr.summarize_run(VerifyRun(name, 1, 256, 256, ranks=[s]))


def test_a_wait_at_one_turn_of_every_round_is_found():
    waits = [0.0] * 200
    for i in range(15, 200, 16):
        waits[i] = 0.1 + 0.01 * (i % 3)
    waits[40] = 0.2  # one stall elsewhere: not a turn's
    t = vr.turn_waits(_loader_run("wds", _series(waits, 16)))
    assert t is not None and (t.workers, t.turns, t.stalls, t.visits) == (16, 1, 12, 12)
    assert t.stall_min_s == pytest.approx(0.1) and t.stall_max_s == pytest.approx(0.12)
    assert t.wait_share == pytest.approx((sum(waits) - 0.2) / sum(waits))
    assert vr.turn_waits_text(t).startswith(
        "one step in every 16 waited (12 of 12 such steps, 100–120 ms; 87% of its data wait)"
    )


@pytest.mark.parametrize(
    "waits,why",
    [
        ([0.1 if i in (3, 50, 77, 120) else 0.0 for i in range(200)], "scattered stalls"),
        ([0.1 if i % 16 == 5 and i < 40 else 0.0 for i in range(200)], "two, then none"),
        ([0.1] * 200, "every step waits: a slow loader, no turn of its own"),
        ([0.001 if i % 16 == 5 else 0.0 for i in range(200)], "waits too short to count"),
    ],
)
def test_waits_without_a_turn_are_not_said_to_have_one(waits, why):
    assert vr.turn_waits(_loader_run("torch", _series(waits, 16))) is None, why


def test_dali_threads_take_no_turns_and_one_worker_has_no_round():
    waits = [0.1 if i % 4 == 1 else 0.0 for i in range(100)]
    result = vr.compare(_result([_loader_run("dali", _series(waits, 4))]))
    assert result.runs[0].turn_waits is None
    assert vr.turn_waits(_loader_run("torch", _series(waits, 1))) is None


def test_the_workers_times_against_what_keeping_up_allows():
    waits = [0.0] * 60
    for i in range(3, 60, 4):
        waits[i] = 0.05
    s = _series(waits, 4, worker_batches=[15, 15, 15, 16], worker_make_s=[3.0, 3.3, 3.0, 4.8],
                worker_slot_wait_s=[0.0, 0.0, 0.0, 0.06])  # fmt: skip
    w = vr.worker_times(_loader_run("torch", s))
    assert (w.workers, w.batches, w.slowest) == (4, 61, 3)
    assert w.make_min_s == pytest.approx(0.2) and w.make_max_s == pytest.approx(0.3)
    assert w.make_median_s == pytest.approx((0.2 + 0.22) / 2)
    assert w.allowed_s == pytest.approx(4 * 60 * MS)  # 4 steps of work, the waits left out
    assert w.slot_wait_share == pytest.approx(0.06 / 14.1)
    text = vr.worker_times_text(w)
    assert text == ("its 4 workers took 200 ms to 300 ms a batch (median 210 ms; worker 3 the "
                    "slowest), where keeping up allows each 240 ms (4 of its steps, less their "
                    "data wait)")  # fmt: skip
    # said in the verdict: the loader waited 3% of its steps or more, once a round
    result = vr.compare(_result([_loader_run("torch", s)]))
    (verdict,) = result.verdicts
    assert "one step in every 4 waited (15 of 15 such steps" in verdict.text
    assert text in verdict.text


def test_a_fed_loader_s_workers_are_not_said():
    s = _series([0.0] * 40, 2, worker_batches=[20, 20], worker_make_s=[1.0, 1.0],
                worker_slot_wait_s=[0.0, 0.0])  # fmt: skip
    result = vr.compare(_result([_loader_run("wds", s)]))
    assert result.runs[0].worker_times is not None
    assert "workers took" not in result.verdicts[0].text


def test_a_worker_that_made_nothing_leaves_no_times():
    s = _series([0.0] * 40, 2, worker_batches=[20, 0], worker_make_s=[1.0, 0.0],
                worker_slot_wait_s=[0.0, 0.0])  # fmt: skip
    assert vr.worker_times(_loader_run("wds", s)) is None


def test_run_14s_wds_at_256_waited_once_a_round():
    path = ROOT / "benchmarks" / "2026-12-05-h200-run14" / "call8-v256-r3.json.gz"
    result = vr.compare(verify_results.load(path))
    wds = next(r for r in result.runs if r.loader == "wds")
    t = wds.turn_waits
    assert t is not None and (t.workers, t.turns, t.stalls, t.visits) == (16, 1, 12, 12)
    assert wds.worker_times is None  # recorded before the workers' clock
    verdict = next(v for v in result.verdicts if v.loader == "wds")
    assert "one step in every 16 waited (12 of 12 such steps, 98–224 ms" in verdict.text
