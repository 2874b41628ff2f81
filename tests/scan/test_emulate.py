"""The emulated step (issue 29): a profile's step at small batches is the host's, the step's
mode is recorded and said, a step the loader made longer counts against AU, and the GPU step
(marked gpu) launches real kernels of the step's length."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

from feedbench.scan.emulate import StepOnGpu
from feedbench.scan.profiles import get_profile
from feedbench.scan.tally import Tally, accelerator_utilisation, consumer_stats


def test_a_profile_step_is_the_host_s_at_small_batches_and_the_device_s_at_large():
    p = get_profile("resnet50-h200")
    assert p.step_s(256) == pytest.approx(256 / 4700.0)  # device-bound: the measured rate
    assert p.step_s(64) == pytest.approx(p.host_s) and p.host_s > 64 / 4700.0
    assert p.step_s(8) == p.step_s(64)  # no faster than the thread launching the step


def _tally(extra_s: float) -> Tally:
    tally = Tally((), warmup_batches=0)
    tally.start()
    for _ in range(10):
        tally.count_step(4, t_ready=0.0, wait_s=0.001, sync_wait_s=0.0, step_s=0.02 + extra_s,
                         extra_s=extra_s)  # fmt: skip
    tally.stop()
    return tally


def test_a_step_the_loader_made_longer_counts_against_au():
    alone = consumer_stats(_tally(0.0), rank=0, stages=(), copies=None, loader_name=None,
                           barrier_idle_s=None)  # fmt: skip
    slowed = consumer_stats(_tally(0.01), rank=0, stages=(), copies=None, loader_name=None,
                            barrier_idle_s=None)  # fmt: skip
    assert alone.au == pytest.approx(0.02 / 0.021)
    # 10 ms of the 31 ms step were the loader's: AU is the step's own 20 ms over all of it
    assert slowed.au == pytest.approx(0.02 / 0.031)
    assert slowed.step_extra_s == pytest.approx(0.1)
    assert accelerator_utilisation(0.2, 0.1 + 0.01, 0.0) == pytest.approx(slowed.au)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")
def test_emulate_gpu_without_a_gpu_is_one_line(cli, dataset, tmp_path):
    r = cli("scan", str(dataset / "images"), "-b", "4", "--emulate", "gpu", "--rate", "100",
            "--no-plots", "--json", str(tmp_path / "r.json"))  # fmt: skip
    assert r.code == 2, r.out + r.err
    assert r.err.startswith("error: --emulate gpu needs a GPU per consumer: 1 consumer, 0 GPUs")
    assert len(r.err.strip().splitlines()) == 1
    assert not (tmp_path / "r.json").exists()


def _auto_scan(cli, dataset, tmp_path) -> tuple[list[dict], str]:
    """A read scan with resnet50-h200's step, its mode left to auto: (the first measurement's
    consumers, the terminal's output on one line)."""
    out = tmp_path / "r.json"
    r = cli("scan", str(dataset / "images"), "-b", "4", "--profile", "resnet50-h200",
            "--stages", "read", "--no-plots", "--json", str(out))  # fmt: skip
    assert r.code == 0, r.err
    return json.loads(out.read_text())["measurements"][0]["per_consumer"], " ".join(r.out.split())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks auto's choice without a GPU")
def test_auto_sleeps_without_a_gpu_and_says_what_it_cannot_see(cli, dataset, tmp_path):
    consumers, out = _auto_scan(cli, dataset, tmp_path)
    assert [c["emulate"] for c in consumers] == ["sleep"]
    assert consumers[0]["step_extra_s"] == 0.0
    assert "emulated step: a sleep (sees waiting only, not a loader slowing the step" in out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_gpu_step_alone_lasts_the_profile_s_step():
    from feedbench.scan.emulate import GpuAccelerator, Timing

    p = get_profile("resnet50-h200")
    for batch in (64, 256):
        timing = Timing(host_s=p.host_s, device_s=p.device_s(batch))
        acc = GpuAccelerator(timing, torch.device("cuda", 0))
        # calibrated kernels: the step alone within 10% of the profile's (host- or device-bound)
        assert acc.idle_s == pytest.approx(p.step_s(batch), rel=0.10), (batch, acc.idle_s)
        assert acc.launches > 100  # many launches a step, as training's, not one long kernel


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_launches_kernels_on_a_gpu(cli, dataset, tmp_path):
    consumers, out = _auto_scan(cli, dataset, tmp_path)
    assert [c["emulate"] for c in consumers] == ["gpu"]
    # the profile names ResNet-50: its own training step, timed alone on this machine
    assert consumers[0]["step_model"] == "resnet50" and consumers[0]["step_alone_s"] > 0
    assert "emulated step: a real resnet50 training step on each consumer's GPU" in out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("delay_s", [0.005, 0.080])
def test_the_queued_gpu_step_hides_a_next_shorter_than_itself(delay_s):
    """As in training, the host takes the next batch while the GPU runs the step: a next() of
    5 ms under a 40 ms step costs the GPU nothing; one of 80 ms makes it wait the difference."""
    import statistics

    from feedbench.scan.consumer import consume_batches
    from feedbench.scan.emulate import GpuAccelerator, Timing
    from feedbench.scan.stream import BatchTimes

    acc = GpuAccelerator(Timing(host_s=0.002, device_s=0.040), torch.device("cuda", 0))

    def batches():
        for _ in range(25):
            time.sleep(delay_s)
            yield None, BatchTimes(samples=4, files=4, read_bytes=400)

    tally = Tally((), warmup_batches=0)
    consume_batches(batches(), tally, acc)
    assert tally.batches == 25
    wait = statistics.fmean(s[2] for s in tally.steps[5:])
    if delay_s < acc.idle_s:
        assert wait < 0.003, wait  # hidden behind the step the GPU was running
    else:  # the GPU idles from the step's end until the batch: ≈ 80 + 2 − 40 ms
        assert 0.5 * (delay_s - acc.idle_s) < wait < delay_s, (wait, acc.idle_s)


def test_the_emulation_text_names_the_model_and_its_step_alone():
    from types import SimpleNamespace

    from feedbench.report.fmt import emulation_text

    def consumer(alone, model):
        return SimpleNamespace(emulate="gpu", batches=11, step_extra_s=0.02, step_alone_s=alone,
                               step_model=model)  # fmt: skip

    two = [
        SimpleNamespace(per_consumer=[consumer(0.0377, "resnet50"), consumer(0.0391, "resnet50")])
    ]
    text = emulation_text(two)
    assert text.startswith("a real resnet50 training step on each consumer's GPU (37.7–39.1 ms")
    assert "the loader made a step 2.0 ms longer than alone" in text  # 0.04 s over 20 steps
    kernels = emulation_text([SimpleNamespace(per_consumer=[consumer(0.0308, None)])])
    assert kernels.startswith("kernels on each consumer's GPU (30.8 ms alone here)")


def test_the_host_s_work_is_cpu_time_so_a_thread_holding_the_gil_makes_it_longer():
    import threading
    import time

    from feedbench.scan.emulate import host_work

    launched = []
    c0, t0 = time.thread_time(), time.perf_counter()
    host_work(lambda: launched.append(1), 40, 0.2)
    assert len(launched) == 40 and time.thread_time() - c0 >= 0.2  # its own CPU time
    alone = time.perf_counter() - t0
    for _ in range(2):  # the least of three: a run descheduled by other load is not "alone"
        t0 = time.perf_counter()
        host_work(lambda: None, 40, 0.2)
        alone = min(alone, time.perf_counter() - t0)

    stop = threading.Event()

    def spin() -> None:  # a loader's thread in the same process: pure Python, wants the GIL
        while not stop.is_set():
            pass

    rival = threading.Thread(target=spin)
    rival.start()
    try:
        t0 = time.perf_counter()
        host_work(lambda: None, 40, 0.2)
        shared = time.perf_counter() - t0
    finally:
        stop.set()
        rival.join()
    # the GIL shared with a busy thread: the same work takes about twice as long (paced by the
    # wall clock it would take 0.2 s whatever the rival did, and hide what the loader costs)
    assert shared >= 1.5 * 0.2 and shared >= 1.3 * alone, (alone, shared)


def test_a_step_s_own_jitter_is_not_counted_as_the_loader_s():
    """The loader's cost is the window's steps over the step alone, summed signed: steps 10 ms
    either side of the step alone cost nothing (clipped step by step: 5 ms each)."""
    from feedbench.scan.consumer import Accelerator, consume_batches
    from feedbench.scan.stream import BatchTimes

    class Jittery(Accelerator):  # real sleeps of 20 and 40 ms in turn; 30 ms alone
        idle_s = 0.030

        def step(self) -> float:
            t0 = time.perf_counter()
            time.sleep(0.020 if self.turn % 2 else 0.040)
            self.turn += 1
            return time.perf_counter() - t0

    acc = Jittery(0.030)
    acc.turn = 0
    tally = Tally((), warmup_batches=0)
    items = ((None, BatchTimes(samples=4, files=4, read_bytes=400)) for _ in range(20))
    consume_batches(items, tally, acc)
    assert tally.batches == 20
    # what is left is the sleeps' own overshoot on a busy host (a fraction of a ms each)
    assert tally.step_extra_s / 20 < 0.0025, tally.step_extra_s


def test_a_window_faster_than_the_step_alone_costs_nothing_and_gains_nothing():
    tally = Tally((), warmup_batches=0)
    tally.start()
    for _ in range(4):
        tally.count_step(4, t_ready=0.0, wait_s=0.0, sync_wait_s=0.0, step_s=0.028, extra_s=-0.002)
    tally.stop()
    assert tally.step_extra_s == 0.0


class _DriftingStep(StepOnGpu):
    """A GPU step whose length is scripted (no GPU needed): ``alone`` gives the lengths of its
    measurements alone in turn, ``window`` every step of the pass; ``step()`` returns it as a
    step timed on the host would (not queued: no GPU clock to read)."""

    ahead = False

    def __init__(self, alone: list[float], window: float) -> None:
        self.alone, self.window, self.late_s, self.owed_s = list(alone), window, 0.0, 0.0
        self.measure_alone()

    def measure_alone(self) -> float:
        self.idle_s = self.alone.pop(0)
        return self.idle_s

    def step(self) -> float:
        return self.window


@pytest.mark.parametrize(
    ("alone", "window", "extra_ms"),
    [
        # the host slowed from 20 to 30 ms a step over the pass: its mean, 25, is no loader's
        ((0.020, 0.030), 0.025, 0.0),
        # the same host drift and 5 ms a step that are the loader's
        ((0.020, 0.030), 0.030, 5.0),
        # a steady host: the loader's 5 ms stay whole
        ((0.020, 0.020), 0.025, 5.0),
    ],
)
def test_the_step_alone_is_measured_before_and_after_the_pass(alone, window, extra_ms):
    """bracket_step_alone: the step's length alone is the mean of its measurements before and
    after the pass, and the loader's cost and the AU are taken over it."""
    from feedbench.scan.consumer import StepOptions, bracket_step_alone, run_consumer
    from feedbench.scan.stream import BatchTimes

    step = _DriftingStep(list(alone), window)
    items = [(None, BatchTimes(samples=4, files=4, read_bytes=400)) for _ in range(21)]
    stats, _, _ = run_consumer(
        None, np.empty(0, np.int64), (), rank=0, batch_size=4, workers=0,
        steps=StepOptions(step_s=0.02, warmup_batches=1), batches=iter(items), accelerator=step,
    )  # fmt: skip
    # the warm-up is found from the batches' ready times: one asked for, a second where the
    # scheduler delayed a batch (two busy cores); the window is what follows it
    assert stats.batches == 21 and 1 <= stats.warmup_batches <= 3
    n = stats.batches - stats.warmup_batches
    assert stats.emulate == "gpu" and stats.step_alone_s == alone[0]  # before the pass
    bracket_step_alone(stats, step)
    assert stats.step_alone_before_s == alone[0] and stats.step_alone_after_s == alone[1]
    assert stats.step_alone_s == pytest.approx(sum(alone) / 2)
    assert stats.step_extra_s / n == pytest.approx(extra_ms / 1e3, abs=1e-9)
    own = n * (window - extra_ms / 1e3)
    lost = stats.data_wait_s + stats.sync_wait_s + stats.step_extra_s
    assert stats.au == pytest.approx(own / (own + lost))


def test_a_consumer_keeps_its_gpu_step_and_measures_it_alone_before_each_pass():
    from types import SimpleNamespace

    from feedbench.scan.consumer import StepOptions
    from feedbench.scan.rank import gpu_step

    kept = _DriftingStep([0.020, 0.022, 0.024], 0.025)
    c = SimpleNamespace(steps=StepOptions(step_s=0.02, emulate="gpu"), accelerator=kept)
    assert gpu_step(c) is kept and kept.idle_s == 0.022  # measured again, not rebuilt
    assert gpu_step(c) is kept and kept.idle_s == 0.024
    asleep = SimpleNamespace(steps=StepOptions(step_s=0.02, emulate="sleep"), accelerator=None)
    assert gpu_step(asleep) is None  # a sleep is made per pass by run_consumer


def test_the_emulation_text_says_a_step_alone_that_moved_over_a_pass():
    from types import SimpleNamespace

    from feedbench.report.fmt import emulation_text

    def consumer(before, after):
        return SimpleNamespace(emulate="gpu", batches=11, step_extra_s=0.0, step_model=None,
                               step_alone_s=(before + after) / 2, step_alone_before_s=before,
                               step_alone_after_s=after)  # fmt: skip

    moved = emulation_text([SimpleNamespace(per_consumer=[consumer(0.030, 0.0331)])])
    assert "(31.5 ms alone here, up to 10% apart before and after a pass)" in moved
    still = emulation_text([SimpleNamespace(per_consumer=[consumer(0.030, 0.0305)])])
    assert "(30.2 ms alone here)" in still  # under 3%: not said
