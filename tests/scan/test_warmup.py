"""The warm-up rule (scan/warmup.py): a loader's start-up is never inside a measured window.

The rule is a pure function of when each batch was ready, tested on arrival times written out;
the consumer loop on scripted batches in this process; and a real scan (consumer processes) of a
user loader whose first batches of every pass are slow."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from feedbench.scan.consumer import StepOptions, run_consumer
from feedbench.scan.results import CacheState, ConsumerStats, Measurement
from feedbench.scan.run import unsettled_warmup
from feedbench.scan.stream import BatchTimes
from feedbench.scan.warmup import warmup_end


def arrivals(gaps: list[float]) -> list[float]:
    """Ready times from the waits between batches (the first: from the start, at 0)."""
    return list(np.cumsum(gaps))


@pytest.mark.parametrize(
    ("gaps", "minimum", "ahead", "want"),
    [
        # steady from the first batch: the minimum
        ([0.1] + [0.01] * 20, 1, 1, (1, True)),
        # three slow batches (a loader starting up), then its pace: all three are warm-up
        ([0.3] * 3 + [0.01] * 30, 1, 1, (3, True)),
        # start-up slowing down gradually (0.08, 0.06, 0.04, 0.03) until the pace of 0.01
        ([0.5, 0.08, 0.06, 0.04, 0.03] + [0.01] * 30, 1, 1, (5, True)),
        # batches 0.2 ms apart (small reads from the page cache), the first ones at twice that:
        # noise, not start-up (under a millisecond a batch)
        ([0.05] + [0.0004] * 6 + [0.0002] * 30, 1, 1, (1, True)),
        # 4 workers: their first batches together after the start, then rounds of 4 every 0.04;
        # the first round is the minimum (one batch per worker) and the pace holds after it
        ([0.5, 0, 0, 0] + [0.04, 0, 0, 0] * 8, 1, 4, (4, True)),
        # DALI: the first batch after the pipeline's build, its prefetched second at once, then
        # three slow batches before its pace
        ([1.0, 0.0, 0.2, 0.2, 0.2] + [0.02] * 40, 1, 2, (5, True)),
        # a stall amid steady batches (a storage pause before batch 4): in the window, the
        # warm-up ends before it
        ([0.1, 0.01, 0.01, 2.5] + [0.01] * 30, 1, 1, (3, True)),
        # a stall right after slow start-up batches: the warm-up stops before it
        ([0.3, 0.3, 2.5] + [0.01] * 30, 1, 1, (2, True)),
        # never reaching its pace by half the pass (slower and slower to the middle): not
        # settled, the warm-up stops at half the pass
        (list(np.linspace(0.2, 0.05, 12)) + [0.01] * 8, 1, 1, (10, False)),
        # --warmup 0: every batch measured, start-up included
        ([0.3] * 3 + [0.01] * 30, 0, 1, (0, True)),
        # no more batches than --warmup: all warm-up (a scan refuses that before it starts)
        ([0.3, 0.01], 2, 1, (2, True)),
        # 3 batches and 4 workers' batches ready: the window opens at half the pass, not settled
        ([0.3, 0, 0], 1, 4, (1, False)),
        # 10 batches, 8 ready: at half the pass, not settled
        ([0.3] + [0.0] * 7 + [0.05] * 2, 1, 8, (5, False)),
        # --warmup larger than the start-up: the minimum rules
        ([0.3] + [0.01] * 30, 5, 1, (5, True)),
    ],
)
def test_the_warm_up_lasts_while_the_loader_starts_up(gaps, minimum, ahead, want):
    assert warmup_end(arrivals(gaps), 0.0, minimum, ahead) == want


def test_noise_on_the_pace_does_not_extend_the_warm_up():
    """A steady loader whose batches come ±20% around their pace: the minimum warm-up."""
    rng = np.random.default_rng(0)
    gaps = [0.2] + list(0.01 * rng.uniform(0.8, 1.2, 60))
    assert warmup_end(arrivals(gaps), 0.0, 1, 1) == (1, True)


def scripted(delays_s: list[float], samples: int = 4):
    for delay in delays_s:
        time.sleep(delay)
        yield None, BatchTimes(samples=samples, read_bytes=100 * samples)


def test_the_loop_measures_after_the_start_up():
    """Three batches of 0.2 s, then 20 at hand with a 0.01 s step: the window holds the 20
    only, at the step's pace, and no data wait."""
    stats, _, raw = run_consumer(
        None, np.empty(0, np.int64), ("read",), rank=0, batch_size=4, workers=0,
        steps=StepOptions(step_s=0.01, warmup_batches=1), batches=scripted([0.2] * 3 + [0] * 20),
    )  # fmt: skip
    assert stats.warmup_batches == 3 and stats.warmup_settled
    assert stats.batches == 23 and stats.steady_samples == 80
    # the start-up's 0.6 s of waits are not in it: one slow batch would add 0.2 s; the margin
    # is for a loaded 2-core CI host (0.055 s over the 20 batches seen there)
    assert stats.data_wait_s < 0.15
    assert stats.au > 0.8
    assert 80 / 0.2 * 0.75 < stats.steady_samples_per_s < 80 / 0.2 * 1.05
    assert len(raw["window_marks"]) == 20  # the items delivered in the window, no more
    assert raw["window_marks"][:, 0].min() > stats.window_start


def _consumer(rank: int, warmup: int, settled: bool) -> ConsumerStats:
    return ConsumerStats(rank, 40, 40, 0, 0, 10, 1.0, 0.1, 40.0, 50.0, [],
                         warmup_batches=warmup, warmup_settled=settled)  # fmt: skip


def test_a_loader_still_starting_up_at_half_the_pass_is_warned_of():
    m = Measurement(2, 1, "warm", 2, 80, 80, 0, 0, 20, 1.0, 0.1, 80.0, 100.0, 0.0, 0.0, [],
                    CacheState("warm", 1.0),
                    per_consumer=[_consumer(0, 3, True), _consumer(1, 5, False)])  # fmt: skip
    said = unsettled_warmup(m)
    assert said is not None and said.startswith(
        "the loader's start-up may be in the window (2 consumers, warm pass): the warm-up stops "
        "at half of the pass"
    )
    m.per_consumer[1].warmup_settled = True
    assert unsettled_warmup(m) is None


SLOW_START = '''
import time

import torch


class SlowStart:
    """``batches`` batches a pass; the first ``slow`` of every pass take ``delay_s`` each (a
    loader starting up), the rest are at hand."""

    def __init__(self, batch_size, batches, slow, delay_s):
        self.batch_size, self.batches, self.slow, self.delay_s = batch_size, batches, slow, delay_s

    def __iter__(self):
        for i in range(self.batches):
            if i < self.slow:
                time.sleep(self.delay_s)
            yield torch.zeros(self.batch_size, 3)


def make_loader(batch_size, batches=40, slow=3, delay_s=0.3):
    return SlowStart(batch_size, batches, slow, delay_s)
'''


@pytest.mark.slow  # a real scan: its consumer process starts and runs two passes
def test_no_repeat_measures_the_loaders_start_up(dataset, cli, tmp_path):
    """A user loader whose first 3 batches of every pass take 0.3 s, then 37 at hand, at a
    0.02 s step (4 samples a batch: 200 samples/s when fed): every repeat's rate is the step's,
    its AU near 1, and the repeats agree. A one-batch warm-up measured 2 slow batches: 0.6 s in
    a window of 1.3 s, about 110 samples/s."""
    src = tmp_path / "slow_start.py"
    src.write_text(SLOW_START)
    out = tmp_path / "r.json"
    r = cli("scan", str(dataset / "images"), "--loader", f"{src}:make_loader", "--consumers",
            "1", "--repeat", "2", "--passes", "warm", "--step-time", "0.02", "-b", "4",
            "--workers", "0", "--json", str(out), "--no-plots")  # fmt: skip
    assert r.code == 0, r.err
    ms = json.loads(out.read_text())["measurements"]
    assert [m["repeat"] for m in ms] == [1, 2]
    fed = 4 / 0.02
    for m in ms:
        (c,) = m["per_consumer"]
        assert c["batches"] == 40 and c["warmup_batches"] == 3 and c["warmup_settled"]
        # the test itself: no slow batch's 0.3 s wait in the window (a loaded 2-core CI host
        # stretched the 20 ms steps to 26 ms: rates and windows are no sharper test than this)
        assert c["data_wait"]["max_s"] < 0.2, c["data_wait"]
        # (the AU is no sharper test: one slow batch inside gives 0.71, and a 2-core host running
        # another suite beside this one gave 0.75 with none inside)
        assert 0.6 * fed < m["steady_samples_per_s"] <= 1.05 * fed, m["steady_samples_per_s"]
    rates = [m["steady_samples_per_s"] for m in ms]
    assert max(rates) / min(rates) < 1.25  # one repeat with a slow batch inside: 1.4
