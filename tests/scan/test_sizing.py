"""The sizing rules and the accelerators a scan feeds, on results built to break each rule."""

from __future__ import annotations

import dataclasses
import math

import pytest

from feedbench.core.envelope import DatasetInfo, envelope
from feedbench.core.timeline import MonitorSample, Timeline
from feedbench.scan.results import CacheState, ConsumerStats, Measurement, ScanResult
from feedbench.scan.sizing import MAX_CV, MIN_BATCHES_PER_WORKER, assess, fed, rate_fed
from feedbench.scan.sweep import curve

GB = 10**9


def _idle(t_s: float = 0.5) -> MonitorSample:
    """A monitor reading of an idle host: nobody's cores busy, the scan's or others'."""
    return MonitorSample(t_s=t_s, cpu_percent=[0.0, 0.0], mem_used_bytes=0,
                         disk_read_bytes_per_s=0.0, disk_read_iops=0.0, net_recv_bytes_per_s=0.0,
                         own_busy_cores=0.0, other_busy_cores=0.0)  # fmt: skip


def _consumer(rank: int, batches: int) -> ConsumerStats:
    return ConsumerStats(rank=rank, samples=100, files=100, read_bytes=10**6, errors=0,
                         batches=batches, wall_s=1.0, first_batch_s=0.1, samples_per_s=100.0,
                         steady_samples_per_s=100.0, stages=[])  # fmt: skip


def _measurement(n: int, rate: float, au: float | None, pass_name="cold", resident=0.0):
    """One measurement with what every sizing rule reads: per-consumer batch counts (enough
    for one worker) and a monitor that watched the scan's own processes."""
    return Measurement(
        consumers=n, workers=1, pass_name=pass_name, repeat=0, samples=100 * n, files=100 * n,
        read_bytes=10**6 * n, errors=0, batches=10, wall_s=1.0, first_batch_s=0.1,
        samples_per_s=rate, steady_samples_per_s=rate, files_per_s=rate,
        mb_per_s=rate / 100, stages=[], cache=CacheState(pass_name, resident),
        per_consumer=[_consumer(r, 2 * MIN_BATCHES_PER_WORKER) for r in range(n)],
        au_mean=au, au_min=au, monitor=Timeline(label="", interval_s=0.5, samples=[_idle()]),
    )  # fmt: skip


def _result(measurements, dataset_bytes=200 * GB, accelerator=True) -> ScanResult:
    r = ScanResult(
        **envelope("scan", {"path": "/d"}, "/d"),
        dataset=DatasetInfo(path="/d", format="tree", files=10, bytes=dataset_bytes, samples=10),
        measurements=measurements,
        accelerator={"name": "h200", "samples_per_s": 100.0} if accelerator else None,
    )
    r.host = dataclasses.replace(r.host, memory_bytes=32 * GB, cpu_count=2, memory_limit_bytes=None)
    r.curve = curve(measurements)
    return r


def _repeats(n, rates, au, **kw):
    return [dataclasses.replace(_measurement(n, x, au, **kw), repeat=i) for i, x in
            enumerate(rates)]  # fmt: skip


def test_fed_is_the_accelerator_time_given_capped_at_the_consumers():
    assert fed(8, 0.6, 0.9) == pytest.approx(8 * 0.6 / 0.9)  # 5.3 kept at 0.9
    assert fed(4, 0.95, 0.9) == 4.0  # above the target: no more than the consumers


def test_a_run_by_the_rules_is_valid_and_feeds_a_fraction():
    ms = _repeats(1, [100, 101, 99], 0.97) + _repeats(4, [300, 303, 297], 0.72)
    z = assess(_result(ms), 0.9)
    assert z.valid and z.broken == [] and z.label() == "valid for sizing"
    assert z.at_consumers == 4 and z.accelerators_fed == pytest.approx(4 * 0.72 / 0.9)
    assert z.accelerators_fed_std == pytest.approx(0.0)  # the same AU in every repeat


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        ({"dataset_bytes": 100 * GB}, "under 5× this client's RAM (32 GB)"),
        ({"rates": [100, 101]}, "2 repeats per point (needs ≥ 3)"),
        ({"rates": [100, 150, 60]}, f"(needs ≤ {MAX_CV:.0%})"),
        ({"pass_name": "warm"}, "no cold first pass"),
        ({"resident": 0.4}, "the page cache was not emptied"),
        ({"partial": True}, "the scan did not complete"),
    ],
)
def test_each_broken_rule_makes_the_run_not_valid(change, rule):
    kw = {k: change[k] for k in ("pass_name", "resident") if k in change}
    result = _result(_repeats(2, change.get("rates", [100, 100, 100]), 0.9, **kw),
                     dataset_bytes=change.get("dataset_bytes", 200 * GB))  # fmt: skip
    result.partial = change.get("partial", False)
    z = assess(result, 0.9)
    assert not z.valid and len(z.broken) == 1 and rule in z.broken[0], z.broken
    assert z.label().startswith("not valid for sizing: ")


def test_a_rule_whose_figures_the_results_lack_is_not_checkable_and_not_valid():
    """Results from before per-consumer batch counts and the scan's own CPU were recorded: the
    two rules that read them are named not checkable, never passed silently."""
    ms = _repeats(2, [100, 100, 100], 0.9)
    for m in ms:
        m.per_consumer, m.monitor = [], None
    z = assess(_result(ms), 0.9)
    assert not z.valid and len(z.broken) == 2, z.broken
    assert z.broken[0].startswith("the measured-window rule") and "3 of 3" in z.broken[0]
    assert z.broken[1].startswith("the idle-host rule") and "not checkable" in z.broken[1]
    ms[0].monitor = Timeline(label="", interval_s=0.5, samples=[_idle()])  # one watched: checked
    assert not any("idle-host" in b for b in assess(_result(ms), 0.9).broken)


def test_without_an_emulated_step_nothing_is_fed():
    z = assess(_result(_repeats(1, [100, 100, 100], None), accelerator=False), 0.9)
    assert z.accelerators_fed is None and z.target_au is None and z.valid


def test_other_processes_busy_during_a_measurement_make_it_not_valid():
    def sample(t, own):
        return MonitorSample(t_s=t, cpu_percent=[100.0, 100.0], mem_used_bytes=0,
                             disk_read_bytes_per_s=0.0, disk_read_iops=0.0,
                             net_recv_bytes_per_s=0.0, own_busy_cores=own,
                             other_busy_cores=2.0 - own)  # fmt: skip

    ms = _repeats(1, [100, 100, 100], 0.95)
    ms[1].monitor = Timeline(label="", interval_s=0.5, samples=[sample(0.5, 0.3), sample(1, 0.5)])
    z = assess(_result(ms), 0.9)
    assert not z.valid and z.broken == [
        "other processes kept 1.6 of 2 cores busy during 1 consumer, cold pass: the host was not "
        "idle"
    ]
    ms[1].monitor.samples = [sample(0.5, 1.9), sample(1, 2.0)]  # the scan's own: no rule broken
    assert assess(_result(ms), 0.9).valid


def test_accelerators_fed_never_exceeds_what_the_rate_feeds_and_says_so():
    from feedbench.report.doc_scan import answer

    # AU 0.97 at 4 consumers would say 4 fed; 100 samples/s feed 100 / (0.9 × 100) of them
    ms = _repeats(4, [100, 100, 100], 0.97)
    result = _result(ms)
    z = assess(result, 0.9)
    assert z.accelerators_fed_by_au == 4.0
    assert (
        z.accelerators_fed == z.accelerators_fed_by_rate == pytest.approx(rate_fed(100, 100, 0.9))
    )
    result.sizing = z
    assert "bounded by the measured samples/s; the AU alone said 4.0" in answer(result)[0]


def test_a_rate_that_agrees_with_the_au_is_not_called_a_bound():
    from feedbench.report.doc_scan import answer

    ms = _repeats(4, [300, 303, 297], 0.72)  # 300 samples/s = 4 × 0.75 × 100: AU's figure lower
    result = _result(ms)
    result.sizing = assess(result, 0.9)
    assert result.sizing.accelerators_fed == pytest.approx(4 * 0.72 / 0.9)
    assert "bounded" not in answer(result)[0]


# --- real scans: too few measured batches per consumer break a rule ----------------------------


def _scan(dataset, batch_size):
    from feedbench.scan.config import ScanConfig
    from feedbench.scan.run import scan

    config = ScanConfig(str(dataset / "images"), stages=("read",), batch_size=batch_size,
                        workers=1, profile="resnet50-h200")  # fmt: skip
    return config, scan(config)


def test_a_window_of_too_few_batches_is_not_valid_and_names_them(cli, dataset, tmp_path):
    from feedbench.scan import results

    images = sum(1 for p in (dataset / "images").rglob("*.jpg"))
    batch = 8
    need = MIN_BATCHES_PER_WORKER  # one worker
    assert math.ceil(images / batch) - 1 < need  # the data this test is built on
    out = tmp_path / "r.json"
    r = cli("scan", str(dataset / "images"), "--stages", "read", "-b", str(batch), "--workers",
            "1", "--profile", "resnet50-h200", "--json", str(out), "--no-plots")  # fmt: skip
    assert r.code == 0, r.err
    result = results.load(out)
    # the count the window held: at least one warm-up batch, more where the loader had not
    # settled (scan/warmup.py; a busy host takes more)
    (c,) = result.measurements[0].per_consumer
    measured = c.common_batches
    assert measured is not None and measured < need
    rule = (f"{measured} measured batches per consumer at 1 consumer × 1 worker, cold pass "
            f"(needs ≥ {need}")  # fmt: skip
    z = result.sizing
    assert not z.valid and any(b.startswith(rule) for b in z.broken), z.broken
    assert f"smaller --batch-size (now {batch})" in next(b for b in z.broken if rule in b)
    flat = " ".join(r.out.split())
    assert rule in flat and "not valid for sizing" in flat
    assert f"· AU not judged: {measured} measured batches per consumer, needs ≥ {need}" in flat
    # no count was judged: no figure of accelerators fed, and the terminal says why
    assert z.accelerators_fed is None and z.at_consumers is None
    assert z.not_judged == [
        {
            "consumers": 1,
            "pass": "cold",
            "why": (
                f"{measured} measured batches per consumer in the common window (needs ≥ {need})"
            ),
        }
    ]
    assert (
        "accelerators fed: not judged (no consumer count held a window to judge by: 1 "
        f"consumer, cold: {measured} measured batches" in flat
    )
    # nor does the page's headline, or its table, give one
    from feedbench.report.doc_scan import answer, point_rows

    result = results.load(out)
    assert answer(result)[0].startswith("Accelerators fed: not judged")
    ((mean, _),) = point_rows(result)
    assert mean["fed"] is None and mean["not_judged"].startswith(f"{measured} measured")
    from feedbench.report import scan_plots

    ax = scan_plots.scaling_figure(result).axes[0]  # the point is crossed out
    (marks,) = [c for c in ax.collections if c.get_label() == scan_plots.NOT_JUDGED_LABEL]
    assert marks.get_offsets().tolist() == [[1, result.curve[0].samples_per_s_mean]]


def test_a_window_of_enough_batches_breaks_no_batch_rule(dataset):
    images = sum(1 for p in (dataset / "images").rglob("*.jpg"))
    config, result = _scan(dataset, 2)
    assert math.ceil(images / 2) - 1 >= MIN_BATCHES_PER_WORKER  # the data this test is built on
    z = result.sizing
    assert not any("measured batch" in b for b in z.broken), z.broken
    m = result.measurements[0]
    appetite = result.accelerator["samples_per_s"]
    assert z.accelerators_fed_by_rate == pytest.approx(
        min(1.0, rate_fed(m.steady_samples_per_s, appetite, config.target_au))
    )
    assert z.accelerators_fed <= z.accelerators_fed_by_rate + 1e-12
    assert not any("AU not judged" in e for e in result.verdict.evidence)


def test_batches_ready_ahead_are_one_per_worker_but_dalis_prefetch_queue():
    """DALI's threads build one batch together and queue ``prefetch`` of them: 16 threads are
    not 16 batches ready, as 16 DataLoader workers are."""
    from feedbench.scan.sizing import batches_ahead

    m = dataclasses.replace(_measurement(1, 100.0, 0.9), workers=16)
    assert batches_ahead(m, {"loader": "torch"}) == 16
    assert batches_ahead(m, {}) == 16
    assert batches_ahead(m, {"loader": "dali", "loader_options": {}}) == 2
    assert batches_ahead(m, {"loader": "dali", "loader_options": {"prefetch": 3}}) == 3
    assert batches_ahead(dataclasses.replace(m, workers=0), {}) == 1


def test_the_ram_rule_reads_the_client_cgroups_memory_limit_where_there_is_one():
    """A client in a container caches no more than its control group may use: 20 GB of data is
    5× a 4 GB limit on a 32 GB host (valid), and under 5× a 5 GB one (named as the cgroup's)."""
    ms = _repeats(2, [100, 100, 100], 0.9)
    limited = _result(ms, dataset_bytes=20 * GB)
    limited.host = dataclasses.replace(limited.host, memory_limit_bytes=4 * GB)
    assert assess(limited, 0.9).broken == []
    limited.host = dataclasses.replace(limited.host, memory_limit_bytes=5 * GB)
    (rule,) = assess(limited, 0.9).broken
    assert "under 5× this client's memory (its cgroup's limit) (5.0 GB)" in rule
