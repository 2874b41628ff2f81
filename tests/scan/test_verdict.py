"""The verdict: a pure function of a results object, on constructed cases (texts pinned)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from feedbench.core.envelope import DatasetInfo, HostInfo
from feedbench.core.stats import Percentiles
from feedbench.core.timeline import MonitorSample, Timeline
from feedbench.scan.results import (
    CacheState,
    ConsumerStats,
    CurvePoint,
    Measurement,
    ScanResult,
    StageStats,
)
from feedbench.scan.sizing import MIN_BATCHES_PER_WORKER, find_max_result, short_count
from feedbench.scan.sweep import find_max
from feedbench.scan.verdict import judge

READ_P = Percentiles(0.002, 0.004, 0.008, 0.010)


def stage(name, busy_s, share, rate=1000.0, latency=None, available=True):
    return StageStats(name, 100, busy_s, 0, rate, 0.0, share, latency, available)


def consumer(rank, wait_s=1.0, sync_s=0.0, idle_s=None, batches=11, data_wait=None):
    return ConsumerStats(
        rank=rank, samples=100, files=100, read_bytes=1000, errors=0, batches=batches,
        wall_s=10.0, first_batch_s=0.1, samples_per_s=10.0, steady_samples_per_s=10.0,
        stages=[], step_s=5.0, data_wait_s=wait_s, sync_wait_s=sync_s, barrier_idle_s=idle_s,
        data_wait=data_wait,
    )  # fmt: skip


def timeline(cpu_percent, gpu_percent=()):
    sample = MonitorSample(0.0, list(cpu_percent), 0, 50e6, 0.0, 0.0, list(gpu_percent))
    return Timeline("t", 0.5, [sample, replace(sample, t_s=0.5)])


def result(stages, per_consumer, *, au=None, accelerator=None, monitor=None, loader=None):
    m = Measurement(
        consumers=len(per_consumer), workers=2, pass_name="cold", repeat=1, samples=200,
        files=200, read_bytes=2000, errors=0, batches=20, wall_s=10.0, first_batch_s=0.1,
        samples_per_s=2000.0, steady_samples_per_s=2000.0, mb_per_s=0.2, files_per_s=20.0,
        stages=stages, cache=CacheState("cold", 0.0), per_consumer=per_consumer, au_mean=au,
        au_min=au, monitor=monitor,
    )  # fmt: skip
    point = CurvePoint(len(per_consumer), "cold", 1, 2500.0, 0.0, 2500.0, 2500.0, 0.0, 0.2, 1.0,
                       au, au)  # fmt: skip
    config = {"loader": loader} if loader else {}
    return ScanResult(
        kind="scan", created_utc="2025-01-01T00:00:00+00:00", command=["feedbench", "scan"],
        config=config, host=HostInfo("h", "Linux", "3.11", 4, 1 << 30, "2.5", []),
        dataset=DatasetInfo("/d", "tree", 200, 2000, 200), measurements=[m], curve=[point],
        accelerator=accelerator,
    )  # fmt: skip


PROFILE = {"kind": "profile", "name": "resnet50-h200", "accelerator": "H200",
           "samples_per_s": 1000.0}  # fmt: skip
STAGES = [stage("read", 2.0, 0.25, latency=READ_P), stage("decode", 6.0, 0.75)]


def test_accelerator_bound_names_the_au_and_what_the_data_feeds():
    v = judge(result(STAGES, [consumer(0), consumer(1)], au=0.95, accelerator=PROFILE))
    assert (v.bound, v.resource) == ("accelerator", "none")
    assert v.text == (
        "accelerator-bound: AU 95% (min 95%) at 2 consumers × 2 workers, cold pass: the data "
        "keeps up"
    )
    assert v.evidence[:2] == [
        "AU 95% ≥ the 90% that counts as fed",
        "2,500 samples/s = 2.5× the appetite of one H200 (resnet50-h200)",
    ]
    assert v.feeds_accelerators == 2.5 and v.supported_consumers == 2


def test_a_workloads_appetite_names_its_accelerator_and_workload():
    """scan --workload: one accelerator's appetite in words (not "one accelerators of ...")."""
    workload = {"kind": "workload", "name": "unet3d on NVIDIA H100", "workload": "unet3d",
                "accelerator": "NVIDIA H100", "samples_per_s": 1000.0}  # fmt: skip
    v = judge(result(STAGES, [consumer(0), consumer(1)], au=0.95, accelerator=workload))
    assert "2,500 samples/s = 2.5× the appetite of one NVIDIA H100 (unet3d)" in v.evidence


def test_sync_bound_counts_only_sync_wait_beyond_the_barriers_own_cost():
    slow = [consumer(0, wait_s=0.5, sync_s=3.0, idle_s=0.1), consumer(1, wait_s=0.5)]
    v = judge(result(STAGES, slow, au=0.5, accelerator=PROFILE))
    assert (v.bound, v.resource) == ("sync", "straggler")
    assert v.text == (  # 3.0 s - 0.1 s × 10 steps
        "sync-bound (straggler): consumers wait 2.00 s for each other, 1.00 s for their own "
        "data, at 2 consumers × 2 workers, cold pass"
    )
    assert "step barrier's own cost: 100.00 ms per step (counted in sync wait)" in v.evidence
    assert v.supported_consumers == 0
    # the barrier's cost alone is not a straggler: the limiting stage is named instead
    even = [consumer(0, wait_s=0.5, sync_s=1.0, idle_s=0.1), consumer(1, wait_s=0.5)]
    assert judge(result(STAGES, even, au=0.5, accelerator=PROFILE)).bound == "decode"


def test_one_consumer_is_never_sync_bound():
    """A lone consumer has nobody to wait for (seen on an H200: "sync-bound" at 1 consumer)."""
    alone = [consumer(0, wait_s=0.5, sync_s=3.0)]
    assert judge(result(STAGES, alone, au=0.5, accelerator=PROFILE)).bound != "sync"


def test_stage_bound_on_saturated_cpu():
    v = judge(result(STAGES, [consumer(0)], monitor=timeline([90.0] * 4)))
    assert (v.bound, v.resource) == ("decode", "cpu")
    assert v.text == "decode-bound (cpu): 2,500 samples/s at 1 consumer × 2 workers, cold pass"
    assert v.evidence == [
        "3.6/4 cores busy (90%)",
        "decode takes 75% of loader time; without it the rest would run 4.0× faster",
        "CPU: 3.6 of 4 cores busy on average",
        "disk reads: 50.0 MB/s (device counters)",
        "read latency p50 2.00 ms, p99 8.00 ms (all consumers' reads)",
    ]
    assert v.feeds_accelerators is None and v.supported_consumers is None


def test_the_cpu_is_read_over_the_window_the_consumers_measured_in():
    """The monitor runs from before the model is built to after the last batch: 10 s at 1 of
    4 cores busy, then the window (t 10-20 s) at 3.6. Its average over everything would be
    1.9 cores: the CPU would be called idle while the loader saturated it."""
    idle = [MonitorSample(float(t), [25.0] * 4, 0, 0.0, 0.0, 0.0, []) for t in range(0, 11)]
    busy = [MonitorSample(float(t), [90.0] * 4, 0, 0.0, 0.0, 0.0, []) for t in range(11, 21)]
    tail = [MonitorSample(float(t), [25.0] * 4, 0, 0.0, 0.0, 0.0, []) for t in range(21, 31)]
    monitor = Timeline("t", 1.0, idle + busy + tail, started_at=1000.0)
    consumers = [replace(consumer(0), window_start=1010.0, window_end=1020.0)]
    v = judge(result(STAGES, consumers, monitor=monitor))
    assert (v.bound, v.resource) == ("decode", "cpu")
    assert "CPU: 3.6 of 4 cores busy on average" in v.evidence
    # an older file (no start on the monitor's clock): the whole timeline, as before
    older = judge(result(STAGES, consumers, monitor=replace(monitor, started_at=None)))
    assert "CPU: 1.9 of 4 cores busy on average" in older.evidence
    assert older.resource == "cpu (too few workers)"


def test_the_hypervisors_steal_is_evidence_from_a_hundredth_of_the_cores():
    """A VM whose hypervisor kept its vCPUs waiting 0.2 of 4 cores' time (5%) in the window
    says so beside the CPU; 0.03 (under 1% of the machine) and an older file say nothing."""
    for steal, said in ((0.2, True), (0.03, False), (None, False)):
        monitor = timeline([90.0] * 4)
        for s in monitor.samples:
            s.steal_cores = steal
        v = judge(result(STAGES, [consumer(0)], monitor=monitor))
        line = "the hypervisor took 0.20 of 4 cores' time (steal): this VM shares its CPUs"
        assert any(e.startswith(line) for e in v.evidence) == said, steal
        assert said or not any("steal" in e for e in v.evidence)


def test_stage_bound_on_idle_cpu_asks_for_workers():
    v = judge(result(STAGES, [consumer(0)], monitor=timeline([20.0] * 4)))
    assert v.resource == "cpu (too few workers)"
    assert v.evidence[0] == (
        "CPU only 20% busy with 2 loading processes on 4 cores: more loader workers (--workers) "
        "would use the idle cores"
    )


def test_idle_cpu_with_a_worker_per_core_asks_for_no_more_workers():
    """2 consumers × 2 workers on 4 cores, 20% busy: the workers are there; they wait."""
    v = judge(result(STAGES, [consumer(0), consumer(1)], monitor=timeline([20.0] * 4)))
    assert v.resource == "cpu (cores idle)"
    assert "--workers" not in v.text + " ".join(v.evidence)
    assert v.evidence[0].startswith("CPU only 20% busy with 4 loading processes on 4 cores: ")


def test_read_bound_is_storage_with_its_p99():
    stages = [stage("read", 9.0, 0.9, latency=READ_P), stage("decode", 1.0, 0.1)]
    v = judge(result(stages, [consumer(0)]))
    assert (v.bound, v.resource) == ("read", "storage")
    assert v.text == "read-bound (storage): 2,500 samples/s at 1 consumer × 2 workers, cold pass"
    assert v.evidence[:2] == [
        "read takes 90% of loader time; without it the rest would run 10.0× faster",
        "read p99 8.0 ms",
    ]


def test_pageable_copies_and_unavailable_stages_are_not_the_bottleneck():
    stages = [
        stage("read", 1.0, 0.5),
        stage("transfer-pinned", 1.0, 0.5),
        stage("transfer-pageable", 50.0, 0.0),
    ]
    v = judge(result(stages, [consumer(0)]))
    assert (v.bound, v.resource) == ("read", "storage")  # the first of two equal ones
    assert not any("pageable" in e for e in v.evidence)


@pytest.mark.parametrize(
    ("cpu", "gpu", "resource", "why"),
    [
        ([95.0] * 4, [], "cpu", "3.8/4 cores busy (95%)"),
        ([10.0] * 4, [95.0], "gpu", "GPU 95% busy decoding"),
        ([10.0] * 4, [], "storage or loader settings", "CPU only 10% busy with 2 loading"),
    ],
)
def test_a_training_loader_names_the_resource_from_the_monitor(cpu, gpu, resource, why):
    wait = Percentiles(0.004, 0.006, 0.009, 0.01)
    per = [consumer(0, data_wait=wait)]
    stages = [stage("loader:dali", 10.0, 1.0)]
    v = judge(result(stages, per, loader="dali", monitor=timeline(cpu, gpu)))
    assert (v.bound, v.resource) == ("loader", resource)
    assert v.text == (
        f"data-bound with the dali loader ({resource}): 2,500 samples/s at 1 consumer × 2 "
        "workers, cold pass"
    )
    assert v.evidence[0].startswith(why)
    assert "data wait p50 4.0 ms, p99 9.0 ms" in v.evidence


def test_no_verdict_without_a_complete_measurement():
    r = result(STAGES, [consumer(0)])
    r.measurements[0].partial = True
    assert judge(r) is None


READ_ONLY = [stage("read", 9.0, 1.0, latency=READ_P)]


def _with_warm(r, ratio):
    """``r`` with a warm pass at ``ratio`` × the cold rate, at the same consumers."""
    cold = r.curve[0]
    r.curve.append(
        replace(cold, pass_name="warm", samples_per_s_mean=cold.samples_per_s_mean * ratio)
    )
    return r


def test_a_read_scan_on_saturated_cores_is_cpu_bound_not_storage():
    v = judge(result(READ_ONLY, [consumer(0)], monitor=timeline([95.0] * 4)))
    assert (v.bound, v.resource) == ("read", "cpu")
    assert v.evidence[0].startswith(
        "3.8/4 cores busy (95%) while reading: the client's CPU limits before "
        "the storage can be judged (--passes cold,warm tells them apart)"
    )


def test_a_warm_pass_no_faster_than_the_cold_one_on_saturated_cores_is_cpu():
    r = _with_warm(result(STAGES[:1] + [stage("decode", 1.0, 0.1)], [consumer(0)],
                          monitor=timeline([95.0] * 4)), 1.05)  # fmt: skip
    v = judge(r)
    assert (v.bound, v.resource) == ("read", "cpu")
    assert "warm pass (page cache) no faster than the cold one (1.05×)" in v.evidence[0]


def test_a_warm_pass_much_faster_is_the_storage_even_on_busy_cores():
    r = _with_warm(result(READ_ONLY, [consumer(0)], monitor=timeline([95.0] * 4)), 3.0)
    v = judge(r)
    assert (v.bound, v.resource) == ("read", "storage")
    assert v.evidence[0] == "the warm pass (page cache) ran 3.0× faster than the cold one"


def test_a_failed_measurement_is_not_the_reference():
    r = result(READ_ONLY, [consumer(0)])
    r.measurements[0].failed = "stalled"
    assert judge(r) is None


def _searched(r: ScanResult, passes: set[int], limit: int = 8) -> None:
    """find-max over ``r``'s measured counts as a scan runs it: a count whose window is too
    short is undecided, the others pass when in ``passes``."""
    found = find_max(lambda n: None if short_count(r, n) else n in passes, limit=limit)
    r.config["find_max_result"] = find_max_result(r, found, limit)


def test_find_max_names_its_undecided_count_and_its_answer_is_a_lower_bound():
    r = result(STAGES, [consumer(0), consumer(1)], au=0.95, accelerator=PROFILE)
    (two,) = r.measurements
    need = MIN_BATCHES_PER_WORKER * two.workers
    # need batches, one of them warm-up: one short of what 4 consumers' AU is judged by
    four = [consumer(i, batches=need) for i in range(4)]
    r.measurements.append(replace(two, consumers=4, per_consumer=four))
    r.curve.append(replace(r.curve[0], consumers=4))
    _searched(r, passes={1, 2, 4})
    fm = r.config["find_max_result"]
    assert fm["tried"] == {"1": True, "2": True, "4": None} and fm["undecided_at"] == 4
    assert fm["undecided"] == {"4": {"measured_batches": need - 1, "batches_needed": need}}
    v = judge(r)
    assert v.supported_consumers == fm["supported_consumers"] == 2
    assert v.evidence[0] == (
        f"find-max: 4 consumers undecided ({need - 1} measured batches per consumer, needs ≥ "
        f"{need}: prefetched batches would decide its AU); the search stopped at 4, supported "
        "consumers at least 2"
    )


def test_find_max_undecided_at_one_consumer_supports_no_count():
    need = MIN_BATCHES_PER_WORKER * 2  # the measurement's 2 workers
    r = result(STAGES, [consumer(0, batches=2)], au=0.95, accelerator=PROFILE)
    _searched(r, passes={1})
    v = judge(r)
    assert r.config["find_max_result"]["supported_consumers"] is None
    assert v.supported_consumers is None  # not 0: no count failed either
    assert v.evidence[0] == (
        f"find-max: 1 consumer undecided (1 measured batch per consumer, needs ≥ {need}: "
        "prefetched batches would decide its AU); the search stopped at 1, before any count "
        "passed"
    )


# --- on real scans: cores kept busy by other processes ----------------------------------------


def _burn(seconds: float) -> None:
    __import__("os").nice(19)  # busy, but yielding to the scan's own processes
    end = __import__("time").monotonic() + seconds
    while __import__("time").monotonic() < end:
        pass


@pytest.fixture
def busy_cores():
    """Every core kept busy by a spinning process while the test runs."""
    import multiprocessing
    import os

    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_burn, args=(120,), daemon=True) for _ in range(os.cpu_count())]
    for p in procs:
        p.start()
    yield
    for p in procs:
        p.kill()
        p.join()


@pytest.mark.slow
@pytest.mark.parametrize("stages", [("read",), ("read", "decode", "augment")])
def test_real_scans_on_saturated_cores_get_a_cpu_verdict(dataset, busy_cores, stages):
    from feedbench.scan.config import ScanConfig
    from feedbench.scan.run import scan

    config = ScanConfig(str(dataset / "images"), stages=stages, batch_size=4,
                        passes=("cold", "warm"), read_latency_s=0.02)  # fmt: skip
    v = scan(config).verdict
    if v.resource == "storage":  # only on direct evidence: the page cache removed the limit
        assert v.evidence[0].startswith("the warm pass (page cache) ran")
        return
    assert v.resource == "cpu", v.text
    assert "cores busy" in v.evidence[0]


# --- wording, over a table of cases ------------------------------------------------------------

WORDING_CASES = [
    # consumers, workers, cores busy (of 4), stages, accelerator, AU, loader
    (1, 0, 20.0, STAGES, None, None, None),
    (1, 1, 20.0, STAGES, None, None, None),
    (2, 2, 20.0, STAGES, None, None, None),
    (8, 0, 20.0, STAGES, None, None, None),
    (1, 1, 95.0, STAGES, None, None, None),
    (1, 1, 95.0, READ_ONLY, None, None, None),
    (1, 1, 20.0, READ_ONLY, PROFILE, 0.5, None),
    (2, 1, 20.0, STAGES, PROFILE, 0.95, None),
    (1, 4, 20.0, [stage("loader:torch", 10.0, 1.0)], None, None, "torch"),
    (1, 1, 20.0, [stage("loader:torch", 10.0, 1.0)], PROFILE, 0.5, "torch"),
]


@pytest.mark.parametrize(("n", "workers", "cpu", "stages", "acc", "au", "loader"), WORDING_CASES)
def test_a_verdict_is_one_line_with_its_number_then_evidence(
    n, workers, cpu, stages, acc, au, loader
):
    r = result(stages, [consumer(i) for i in range(n)], au=au, accelerator=acc, loader=loader,
               monitor=timeline([cpu] * 4))  # fmt: skip
    for m in r.measurements:
        m.workers = workers
    v = judge(r)
    head = v.text.split(":", 1)[0]
    assert head.startswith(("read-", "decode-", "accelerator-", "sync-", "data-bound")), v.text
    # the bound, then the number that shows it
    assert re.search(r"\d[\d,.]* samples/s at |AU \d+%", v.text), v.text
    assert "\n" not in v.text and len(v.text) < 120 and v.evidence, v
    words = " ".join([v.text, *v.evidence])
    # counts in words: never "1 consumers", "1 batches", "× 0 workers"
    assert not re.search(r"\b1 (consumers|workers|batches|cores|loading processes)\b", words)
    assert "× 0 worker" not in words
    assert f"{n} consumer{'s' if n != 1 else ''}" in v.text
    if workers == 0:
        assert "loading in" in v.text
    # advice the run already followed is not given: workers when they match the cores
    if n * max(1, workers) >= 4:
        assert "--workers" not in words, words
    if acc is not None:  # what the rate feeds: evidence, never in the headline
        assert any("the appetite of one H200" in e for e in v.evidence)
        assert "appetite" not in v.text


def _gpu_stepped(extra_s, wait_s, before=0.030, after=0.030):
    c = consumer(0, wait_s=wait_s, batches=101)
    alone = (before + after) / 2
    return replace(c, emulate="gpu", step_extra_s=extra_s, step_alone_s=alone,
                   step_alone_before_s=before, step_alone_after_s=after, warmup_batches=1,
                   step_model="resnet50")  # fmt: skip


def test_a_step_the_loader_made_longer_than_it_waited_is_contention_bound():
    """Run 20's wds scan on an H100 host at 64 a batch: AU 0.79, of it 4.7 ms a step of a model
    step made longer beside the loader and 2.2 ms of waiting. The loader is not what is slow:
    the verdict says so, and that storage would not help; where the step alone moved as much
    over the pass, it says the host's drift could make it."""
    v = judge(result(STAGES, [_gpu_stepped(0.47, 0.22)], au=0.79, accelerator=PROFILE,
                     loader="wds"))  # fmt: skip
    assert (v.bound, v.resource) == ("contention", "host")
    assert v.text == (
        "contention-bound (host): the model's step ran 4.7 ms longer beside the loader than "
        "alone (16%), against 2.2 ms a step waiting for data, at 1 consumer × 2 workers, cold pass"
    )
    assert "faster storage would not" in v.evidence[0]
    assert not any("drift" in e for e in v.evidence)
    drifted = [_gpu_stepped(0.47, 0.22, before=0.025, after=0.035)]  # ±5 ms ≥ 4.7
    v = judge(result(STAGES, drifted, au=0.79, accelerator=PROFILE, loader="wds"))
    assert v.bound == "contention" and "the step alone moved by ±5.0 ms" in v.evidence[1]
    # waiting more than the step was made longer: the loader's own verdict, as before
    waited = judge(result(STAGES, [_gpu_stepped(0.10, 0.22)], au=0.79, accelerator=PROFILE,
                          loader="wds"))  # fmt: skip
    assert waited.bound == "loader"
    # kernels of the step's length, no model: said as the emulated step
    kernels = [replace(_gpu_stepped(0.47, 0.22), step_model=None)]
    v = judge(result(STAGES, kernels, au=0.79, accelerator=PROFILE, loader="wds"))
    assert v.text.startswith("contention-bound (host): the emulated step ran 4.7 ms longer")


def test_contention_is_judged_over_the_points_repeats_as_its_au_is():
    """The AU that decided the point was not fed is its repeats' mean: so are the step made
    longer and the wait (one repeat alone would contradict the emulation line's figure)."""
    one = result(STAGES, [_gpu_stepped(0.47, 0.22)], au=0.79, accelerator=PROFILE, loader="wds")
    m = one.measurements[0]
    other = replace(m, repeat=2, per_consumer=[_gpu_stepped(0.0, 0.22)])
    both = replace(one, measurements=[m, other])  # 2.35 (shown 2.3) ms longer, 2.2 waiting
    v = judge(both)
    assert v.bound == "contention" and "ran 2.3 ms longer" in v.text, v.text
    assert "against 2.2 ms a step waiting" in v.text
    failed = replace(other, per_consumer=[_gpu_stepped(0.0, 0.9)], failed="killed")
    assert judge(replace(one, measurements=[m, failed])).bound == "contention"  # not counted
