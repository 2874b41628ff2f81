"""The consumer loop's steps, in this process: a scripted source of batches with known delays
stands in for the loader workers, a known emulated step for the accelerator, no process group."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from feedbench.scan.consumer import (
    Accelerator,
    StepOptions,
    consumer_units,
    emulate_step,
    run_consumer,
)
from feedbench.scan.sources import detect
from feedbench.scan.stream import KEEP_ERRORS, BatchTimes, worker_share
from feedbench.scan.tally import Tally


def scripted(delays_s, samples=4, tail_errors=0):
    """One batch of ``samples`` after each delay (the data wait), read_bytes = 100 a sample;
    then, with ``tail_errors``, a worker's errors-only tail."""
    for delay in delays_s:
        if delay:
            time.sleep(delay)
        yield None, BatchTimes(samples=samples, files=samples, read_bytes=100 * samples)
    if tail_errors:
        errs = [(f"bad{i}", "read", "gone") for i in range(tail_errors)]
        yield None, BatchTimes(files=tail_errors, errors=tail_errors, error_list=errs)


def consume(batches, step_s=0.0, warmup=1, **kw):
    return run_consumer(
        None, np.empty(0, np.int64), ("read",), rank=3, batch_size=4, workers=0,
        steps=StepOptions(step_s=step_s, warmup_batches=warmup), batches=batches, **kw,
    )  # fmt: skip


# --- Tally: one batch's measurements accounted ------------------------------------------------


def test_tally_accounts_counts_stage_time_and_latencies():
    tally = Tally(("read", "decode", "augment", "transfer"), warmup_batches=1)
    assert list(tally.clocks) == ["read", "decode", "augment"]  # transfer is the consumer's
    tally.account(
        BatchTimes(
            samples=3, files=4, read_bytes=400, errors=1,
            busy_s={"read": 0.4, "decode": 0.3}, in_bytes={"read": 400, "decode": 300},
            read_latencies=[0.1] * 4, error_list=[("k", "decode", "bad jpeg")],
        )
    )  # fmt: skip
    tally.account(BatchTimes(samples=2, files=2, read_bytes=200, busy_s={"read": 0.2},
                             in_bytes={"read": 200}, read_latencies=[0.1, 0.1]))  # fmt: skip
    assert (tally.samples, tally.files, tally.read_bytes, tally.errors) == (5, 6, 600, 1)
    read, decode, augment = tally.clocks.values()
    assert read.samples == 6  # every read, failed ones too
    assert read.busy_s == pytest.approx(0.6) and read.in_bytes == 600
    assert decode.samples == 3 and decode.busy_s == pytest.approx(0.3) and decode.in_bytes == 300
    assert augment.samples == 0 and augment.busy_s == 0  # the stage did not run in these batches
    assert tally.read_latencies == [0.1] * 6
    assert [(e.key, e.stage, e.message) for e in tally.kept_errors] == [("k", "decode", "bad jpeg")]
    assert tally.batches == 0  # accounting is not counting a step


def test_tally_keeps_the_first_errors_and_counts_all():
    tally = Tally(("read",), warmup_batches=0)
    for b in range(3):
        errs = [(f"{b}-{i}", "read", "gone") for i in range(15)]
        tally.account(BatchTimes(errors=15, error_list=errs))
    assert tally.errors == 45
    assert len(tally.kept_errors) == KEEP_ERRORS == 20
    assert [e.key for e in tally.kept_errors] == [f"0-{i}" for i in range(15)] + [
        f"1-{i}" for i in range(5)
    ]


def test_tally_measures_only_steps_after_the_warm_up():
    tally = Tally((), warmup_batches=2)
    tally.start()
    for i in range(5):
        tally.count_step(4, t_ready=tally.t_start + 0.5 + i, wait_s=10.0 * (i + 1), sync_wait_s=1.0,
                         step_s=0.25)  # fmt: skip
    tally.stop()
    assert tally.batches == 5 and tally.first_batch_s == pytest.approx(0.5)
    assert tally.waits == [30.0, 40.0, 50.0]  # batches 3 to 5
    assert tally.data_wait_s == 120.0 and tally.sync_wait_s == 3.0 and tally.step_s == 0.75
    assert tally.steady_samples == 12
    assert tally.t_start < tally.t_first_end < tally.t_end


def test_emulated_step_sleeps_its_time():
    assert emulate_step(0.0) == 0.0
    took = emulate_step(0.03)
    assert 0.03 <= took < 0.5


def test_a_late_wake_up_is_taken_off_the_next_steps():
    """A step that ran 0.05 s long (as on a busy host) is owed back: the next steps sleep less
    until it is paid, so the loader gets the nominal accelerator's time, no more."""
    acc = Accelerator(0.02)
    time.sleep(0.05)  # stands in for the late wake-up of the step before
    acc.owed_s = acc.late_s = 0.05
    t0 = time.perf_counter()
    took = [acc.step() for _ in range(6)]
    total = time.perf_counter() - t0
    assert took[0] < 0.01 and took[1] < 0.01  # 0.05 owed: two steps skipped, half of the third
    assert total == pytest.approx(6 * 0.02 - 0.05, abs=0.03)
    assert acc.owed_s < 0.01 and acc.late_s >= 0.05


# --- the loop, driven by scripted batches ------------------------------------------------------


def test_samples_batches_and_first_batch():
    stats, errors, raw = consume(scripted([0.15, 0, 0, 0], tail_errors=3))
    assert stats.rank == 3
    assert stats.batches == 4  # the errors-only tail is not a batch
    assert (stats.samples, stats.files, stats.read_bytes) == (16, 19, 1600)
    assert stats.errors == 3 and [e.key for e in errors] == ["bad0", "bad1", "bad2"]
    assert 0.15 <= stats.first_batch_s <= stats.wall_s
    assert stats.samples_per_s == pytest.approx(16 / stats.wall_s)
    assert stats.au is None and stats.step_s == 0.0  # no emulated step
    assert len(raw["read"]) == 0  # a training loader's reads are not timed one by one


def test_warm_up_batches_are_left_out_of_the_steady_rate_and_au():
    """Two slow warm-up batches (0.3 s wait each), then four with 0.01 s wait and a 0.05 s step.
    Steady window: after the second step to the end, 4 × (0.01 + 0.05) s for 16 samples."""
    stats, _, _ = consume(scripted([0.3, 0.3, 0.01, 0.01, 0.01, 0.01]), step_s=0.05, warmup=2)
    assert stats.batches == 6 and stats.samples == 24
    assert 0.04 <= stats.data_wait_s < 0.3  # the warm-up's waits are not in it
    assert 0.2 <= stats.step_s < 0.3  # four measured steps, not six
    assert stats.data_wait.max_s < 0.3
    assert 16 / 0.24 * 0.6 < stats.steady_samples_per_s <= 16 / 0.24
    assert stats.steady_samples_per_s > 2 * stats.samples_per_s
    waited = stats.data_wait_s + stats.sync_wait_s
    assert stats.au == pytest.approx(stats.step_s / (stats.step_s + waited))
    assert 0.7 < stats.au < 0.84  # 0.05 / (0.05 + 0.01) = 0.83 at most


def test_au_is_step_over_step_and_data_wait():
    """Every batch waits 0.03 s for data and steps 0.03 s: AU one half."""
    stats, _, _ = consume(scripted([0.03] * 6), step_s=0.03)
    assert stats.batches == 6
    assert stats.data_wait_s >= 5 * 0.03 and stats.step_s >= 5 * 0.03
    assert stats.sync_wait_s < 0.01  # no process group: nothing to wait for
    assert stats.barrier_idle_s is None
    assert stats.au == pytest.approx(0.5, abs=0.08)


def test_data_wait_is_measured_per_batch():
    """One batch of five waits 0.08 s; the rest are at hand."""
    stats, _, _ = consume(scripted([0, 0, 0.08, 0, 0]))
    assert stats.data_wait_s >= 0.08
    assert stats.data_wait.max_s >= 0.08
    assert stats.data_wait.p50_s < 0.02


def test_without_warm_up_every_batch_is_measured():
    stats, _, _ = consume(scripted([0.05, 0.05, 0.05]), step_s=0.01, warmup=0)
    assert stats.batches == 3
    assert stats.data_wait_s >= 0.15  # the first batch's wait too
    assert stats.step_s >= 0.03
    assert stats.steady_samples_per_s is not None
    assert stats.steady_samples_per_s <= 12 / 0.18


def test_only_warm_up_batches_leave_no_steady_rate():
    stats, _, _ = consume(scripted([0, 0]), step_s=0.01, warmup=3)
    assert stats.batches == 2 and stats.samples == 8
    assert stats.steady_samples_per_s is None and stats.au is None and stats.data_wait is None


def test_errors_are_kept_up_to_the_limit_across_batches():
    def batches():
        for b in range(3):
            errs = [(f"{b}-{i}", "decode", "bad") for i in range(8)]
            yield None, BatchTimes(samples=2, files=10, errors=8, error_list=errs)

    stats, errors, _ = consume(batches())
    assert stats.errors == 24 and stats.samples == 6 and stats.batches == 3
    assert len(errors) == KEEP_ERRORS
    assert errors[0].key == "0-0" and errors[-1].key == "2-3"


def test_progress_gets_every_batchs_bytes():
    seen = []
    consume(scripted([0, 0], tail_errors=1), progress=seen.append)
    assert seen == [400, 400, 0]


def test_a_training_loader_is_one_end_to_end_stage():
    stats, _, _ = consume(scripted([0, 0.05, 0.05]), loader_name="torch")
    (stage,) = stats.stages
    assert stage.name == "loader:torch" and stage.share == 1.0
    assert stage.samples == 12 and stage.busy_s == stats.wall_s
    assert stage.samples_per_s == pytest.approx(12 / stats.wall_s)
    assert stage.latency == stats.data_wait  # the data wait per measured batch
    assert stage.latency.p50_s >= 0.05


# --- the stage loader, in this process (no workers) --------------------------------------------


@pytest.mark.parametrize(
    ("kind", "n", "batch", "workers", "want"),
    [
        # samples by whole batches, batch k to worker k mod W: no partial batch but the last
        ("records", 21, 7, 4, [range(0, 7), range(7, 14), range(14, 21), []]),
        ("tree", 10, 3, 2, [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9]]),
        ("records", 3, 7, 2, [[0, 1, 2], []]),
        # shards every W-th: a shard's samples are one worker's
        ("shards", 5, 3, 2, [[0, 2, 4], [1, 3]]),
    ],
)
def test_worker_share_hands_out_whole_batches(kind, n, batch, workers, want):
    units = np.arange(100, 100 + n)
    shares = [worker_share(units, kind, batch, w, workers) for w in range(workers)]
    assert [[int(u) - 100 for u in s] for s in shares] == [list(w) for w in want]


def test_stage_stream_in_the_consumer_process(dataset):
    source, _ = detect(str(dataset / "images"))
    units = consumer_units(source, 0, 1, seed=0, epoch=0)
    stats, errors, raw = run_consumer(
        source, units, ("read", "decode", "transfer"), rank=0, batch_size=5, workers=0,
        steps=StepOptions(step_s=0.0),
    )  # fmt: skip
    assert errors == [] and stats.errors == 0
    assert stats.samples == 24 and stats.files == 24 and stats.batches == 5  # 5+5+5+5+4
    read, decode, transfer = stats.stages
    assert (read.name, decode.name) == ("read", "decode")
    assert read.samples == decode.samples == 24
    assert read.in_bytes == stats.read_bytes > 0 and len(raw["read"]) == 24
    assert read.latency is not None and decode.latency is None
    assert read.share + decode.share == pytest.approx(1.0)
    assert transfer.name == "transfer" and not transfer.available  # no device given


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_copies_to_the_gpu_pinned_in_the_loop_pageable_apart(dataset):
    source, _ = detect(str(dataset / "images"))
    units = consumer_units(source, 0, 1, seed=0, epoch=0)
    stats, _, _ = run_consumer(
        source, units, ("read", "decode", "augment", "collate", "transfer"), rank=0,
        batch_size=5, workers=0, image_size=32, device=torch.device("cuda", 0),
    )  # fmt: skip
    by_name = {s.name: s for s in stats.stages}
    pinned, pageable = by_name["transfer-pinned"], by_name["transfer-pageable"]
    assert pinned.samples == 24 and pinned.in_bytes == 24 * 3 * 32 * 32
    assert pageable.samples == 3 * 4  # the last batch (4 samples) copied three times
    assert pinned.busy_s > 0 and pageable.busy_s > 0 and pageable.share == 0.0


# --- StepTimer: steps queued ahead, read on the step's clock later ------------------------------


class ScriptedClock:
    """A GPU-like clock in this process: a mark is a time the test sets (the GPU's), readable
    only once waited on (``wait``, ``sync``), as a CUDA event; ``lag`` as the CUDA clock's."""

    lag = 2

    def __init__(self):
        self.now, self.marks, self.done = 0.0, [], set()

    def mark(self, t=None):
        m = [self.now if t is None else t]
        self.marks.append(m)
        return m

    def seconds(self, a, b):
        assert id(a) in self.done and id(b) in self.done, "read before the GPU got there"
        return b[0] - a[0]

    def wait(self, m):  # in stream order: every mark queued before m has happened too
        i = next(i for i, x in enumerate(self.marks) if x is m)
        self.done.update(id(x) for x in self.marks[: i + 1])

    def sync(self):
        self.done.update(id(m) for m in self.marks)


def test_step_timer_reads_each_step_lag_steps_later_on_its_clock():
    from feedbench.scan.consumer import QueuedStep, StepTimer

    clock, tally = ScriptedClock(), Tally(("read",), warmup_batches=0)
    clock.now = 5.0  # the reference event, on the GPU's clock
    timer = StepTimer(clock, tally, idle_s=0.050)
    tally.start()
    for i in range(5):  # step i: waits 10 ms for data from 100 i ms on, syncs 1 ms, runs 60 ms
        t = 5.0 + 0.1 * i
        q = QueuedStep(4, t_ready=0.0, pre=clock.mark(t), data=clock.mark(t + 0.010),
                       synced=clock.mark(t + 0.011), start=clock.mark(t + 0.012),
                       end=clock.mark(t + 0.072), took=None)  # fmt: skip
        timer.add(q)
        assert tally.batches == max(0, i + 1 - clock.lag)  # read lag steps later
    timer.flush()
    assert tally.batches == 5
    for i, (_, ended, wait, sync, step, extra, samples) in enumerate(tally.steps):
        assert (wait, sync, step) == pytest.approx((0.010, 0.001, 0.060))
        assert extra == pytest.approx(0.010)  # beyond the step alone: the loader's cost
        # its end in host time: the reference's host time + the GPU's time since it
        assert ended == pytest.approx(timer.t_ref + 0.1 * i + 0.072)
        assert samples == 4
