"""The multi-consumer engine: real consumer processes over gloo, real files, real sleeps."""

import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pytest

from feedbench.core.errors import FeedbenchError
from feedbench.core.words import count
from feedbench.report.sut import system_facts
from feedbench.scan import results as scan_results
from feedbench.scan.config import ScanConfig
from feedbench.scan.consumer import consumer_units
from feedbench.scan.results import CacheState, ConsumerStats, Measurement
from feedbench.scan.run import scan
from feedbench.scan.sizing import MIN_BATCHES_PER_WORKER
from feedbench.scan.sources import detect
from feedbench.scan.sweep import curve, find_max
from feedbench.scan.tally import accelerator_utilisation
from tests.conftest import interruptible

# --- sharding across consumers ------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_tree_shards_are_disjoint_and_complete(dataset, world):
    source, _ = detect(str(dataset / "images"))
    parts = [consumer_units(source, r, world, seed=1, epoch=0) for r in range(world)]
    assert len({len(p) for p in parts}) == 1  # equal per consumer (DistributedSampler padding)
    together = np.concatenate(parts)
    assert set(together.tolist()) == set(range(24))
    assert len(together) - 24 == len(parts[0]) * world - 24  # only the documented padding


def test_tar_shards_go_whole_to_one_consumer_and_reshuffle_per_epoch(dataset):
    source, _ = detect(str(dataset / "shards"))
    e0 = [consumer_units(source, r, 2, seed=1, epoch=0).tolist() for r in range(2)]
    assert sorted(e0[0] + e0[1]) == [0, 1, 2, 3] and not set(e0[0]) & set(e0[1])
    orders = {tuple(consumer_units(source, 0, 2, seed=1, epoch=e)) for e in range(6)}
    assert len(orders) > 1


@pytest.mark.parametrize(
    ("layout", "n", "expected"), [("images", 3, 24), ("images", 5, 25), ("shards", 2, 24)]
)
def test_consumers_read_their_shards_in_real_processes(dataset, layout, n, expected):
    r = scan(
        ScanConfig(str(dataset / layout), stages=("read",), consumers=(n,), batch_size=4, workers=1)
    )
    (m,) = r.measurements
    assert m.consumers == n and len(m.per_consumer) == n
    assert sorted(c.rank for c in m.per_consumer) == list(range(n))
    assert m.samples == expected  # 25 = 24 + one padded sample for 5 consumers
    if expected == 24:  # every byte of the dataset exactly once
        assert m.read_bytes == r.dataset.bytes
    assert all(c.samples > 0 for c in m.per_consumer)


# --- AU and the emulated step --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "wait", "sync", "au"),
    [(1.0, 0.0, 0.0, 1.0), (1.0, 1.0, 0.0, 0.5), (3.0, 0.5, 0.5, 0.75), (0.0, 1.0, 0.0, None)],
)
def test_au_formula(step, wait, sync, au):
    assert accelerator_utilisation(step, wait, sync) == au


def test_au_on_a_source_with_known_delay(dataset):
    """Loading in the consumer (0 workers): each batch of 4 waits 4 × 20 ms; the step is 80 ms
    (long enough that one descheduling on 2 busy cores cannot decide the 5-step window)."""
    cfg = ScanConfig(
        str(dataset / "images"),
        stages=("read",),
        batch_size=4,
        workers=0,
        read_latency_s=0.020,
        step_s=0.080,
    )
    (m,) = scan(cfg).measurements
    c = m.per_consumer[0]
    assert c.batches == 6
    assert 0.3 <= c.au <= 0.52, c  # 80 / (80 + 80 + read time): about one half at most
    assert c.data_wait.p50_s >= 0.080
    # two workers prefetch while the step runs: 80 ms of loading per worker and batch, halved
    cfg.workers = 2
    (m2,) = scan(cfg).measurements
    assert m2.per_consumer[0].au > 0.75, m2.per_consumer[0]


def test_synchronous_steps_make_fast_consumers_wait(dataset):
    """DDP semantics: with one slow reader, the other consumers' AU drops too (sync wait)."""
    cfg = ScanConfig(
        str(dataset / "images"),
        stages=("read",),
        batch_size=2,
        workers=0,
        consumers=(2,),
        read_latency_s=0.005,
        step_s=0.010,
    )
    (m,) = scan(cfg).measurements
    assert m.au_mean is not None and m.au_min <= m.au_mean
    assert sum(c.batches for c in m.per_consumer) == 12
    assert {c.batches for c in m.per_consumer} == {6}  # equal steps per consumer
    # the barrier's own cost (part of every sync wait) is measured apart
    assert all(c.barrier_idle_s is not None and c.barrier_idle_s > 0 for c in m.per_consumer)


# --- curve and find-max: pure functions ----------------------------------------------------------


def _m(n, rate, repeat=1, au=None, pass_name="cold"):
    return Measurement(
        consumers=n, workers=1, pass_name=pass_name, repeat=repeat, samples=100, files=100,
        read_bytes=1000, errors=0, batches=10, wall_s=1.0, first_batch_s=0.1, samples_per_s=rate,
        steady_samples_per_s=rate, mb_per_s=1.0, files_per_s=100.0, stages=[],
        cache=CacheState("cold", 0.0), au_mean=au, au_min=au,
    )  # fmt: skip


def test_curve_statistics_and_efficiency():
    pts = curve([_m(1, 100, 1), _m(1, 110, 2), _m(2, 180, 1), _m(2, 200, 2), _m(4, 210, 1)])
    one, two, four = pts
    assert one.samples_per_s_mean == 105 and one.repeats == 2
    assert one.samples_per_s_std == pytest.approx(np.std([100, 110], ddof=1))
    assert one.cv == pytest.approx(one.samples_per_s_std / 105)
    assert one.efficiency == pytest.approx(1.0)
    assert two.efficiency == pytest.approx(190 / (2 * 105))
    assert four.efficiency == pytest.approx(210 / (4 * 105)) and four.samples_per_s_std == 0


@pytest.mark.parametrize(
    ("max_ok", "limit", "best", "probes"),
    [
        (0, 16, 0, [1]),
        (1, 16, 1, [1, 2]),
        (5, 16, 5, [1, 2, 4, 8, 6, 5]),
        (16, 16, 16, [1, 2, 4, 8, 16]),
        (40, 12, 12, [1, 2, 4, 8, 12]),
        (9, 12, 9, [1, 2, 4, 8, 12, 10, 9]),
    ],
)
def test_find_max_grows_then_bisects(max_ok, limit, best, probes):
    seen = []

    def probe(n):
        seen.append(n)
        return n <= max_ok

    got, tried, undecided_at = find_max(probe, limit=limit)
    assert got == best and seen == probes and list(tried) == probes and undecided_at is None


def test_find_max_reuses_known_results():
    seen = []
    got, _, _ = find_max(lambda n: seen.append(n) or n <= 3, limit=8, known={1: True, 2: True})
    assert got == 3 and seen == [4, 3]


# --- verdicts on constructed cases ----------------------------------------------------------------


def test_throttled_read_is_read_bound(dataset):
    cfg = ScanConfig(
        str(dataset / "images"),
        stages=("read", "decode"),
        batch_size=4,
        workers=1,
        read_latency_s=0.03,
    )
    r = scan(cfg)
    v = r.verdict
    assert v.bound == "read" and v.text.startswith("read-bound"), v
    if v.resource == "cpu":  # right only when other work (another test run) saturated the cores
        assert "of them by other processes" in v.evidence[0], v
    else:
        assert v.resource == "storage", v


def test_heavy_cpu_work_with_spare_disk_is_cpu_bound(dataset):
    cfg = ScanConfig(
        str(dataset / "images"),
        stages=("read", "decode", "augment"),
        batch_size=4,
        consumers=(2,),
        workers=1,
        passes=("warm",),
    )
    r = scan(cfg)
    assert r.verdict.bound in ("decode", "augment"), r.verdict
    assert r.verdict.resource.startswith("cpu")
    assert r.measurements[0].monitor is not None and r.measurements[0].monitor.samples


def test_fast_data_is_accelerator_bound_and_find_max(dataset):
    cfg = ScanConfig(
        str(dataset / "images"),
        stages=("read",),
        batch_size=1,  # 12 batches per consumer at 2: enough to judge the AU by (sizing rules)
        workers=0,
        rate=25.0,
        find_max=True,
        max_consumers=2,
        passes=("warm",),
        # Reads take ~1 ms of a 40 ms step, so AU sits near 0.97; the default 0.9 target left
        # one 50 ms descheduling on 2 busy cores able to fail a 12-step window (CI, stop 20).
        target_au=0.6,
    )
    r = scan(cfg)
    assert r.accelerator["samples_per_s"] == 25.0 and r.accelerator["step_s"] == 1 / 25
    fm = r.config["find_max_result"]
    assert fm["tried"] == {"1": True, "2": True} and fm["supported_consumers"] == 2
    assert fm["undecided"] == {} and fm["undecided_at"] is None  # windows long enough
    assert r.verdict.bound == "accelerator" and r.verdict.supported_consumers == 2
    assert r.verdict.feeds_accelerators == pytest.approx(r.curve[-1].samples_per_s_mean / 25)


def test_find_max_stops_at_a_count_whose_window_is_too_short(cli, dataset, tmp_path):
    """Prefetched batches would decide a short window's AU: find-max neither passes nor fails
    such a count, stops there, and says so in the terminal, the JSON and the verdict."""
    images = sum(1 for _ in (dataset / "images").rglob("*.jpg"))
    batch, warmup = 2, 1

    def measured(n: int) -> int:  # per consumer, after the warm-up (DistributedSampler shards)
        return math.ceil(math.ceil(images / n) / batch) - warmup

    need = MIN_BATCHES_PER_WORKER  # no loader workers: one batch ready ahead
    assert measured(2) >= need > measured(4)  # the data this test is built on
    out = tmp_path / "r.json"
    # a slow accelerator and a low target: 1 and 2 consumers pass, whatever else runs here
    r = cli("scan", str(dataset / "images"), "--stages", "read", "-b", str(batch), "--workers",
            "0", "--rate", "20", "--target-au", "0.5", "--find-max", "--max-consumers", "8",
            "--passes", "warm", "--json", str(out), "--no-plots")  # fmt: skip
    assert r.code == 0, r.err  # measured and written, marked not valid for sizing
    result = scan_results.load(out)
    fm = result.config["find_max_result"]
    assert fm["tried"] == {"1": True, "2": True, "4": None} and fm["undecided_at"] == 4
    # the batches inside the window all 4 consumers shared: at most each one's own after the
    # warm-up, fewer when one started late or warmed up longer (a busy host: 1 of 2, once)
    (k,) = [u["measured_batches"] for u in fm["undecided"].values()]
    assert list(fm["undecided"]) == ["4"] and fm["undecided"]["4"]["batches_needed"] == need
    assert 0 <= k <= measured(4) < need
    assert fm["supported_consumers"] == result.verdict.supported_consumers == 2
    note = (
        f"find-max: 4 consumers undecided ({count(k, 'measured batch')} per consumer, needs ≥ "
        f"{need}: prefetched batches would decide its AU); the search stopped at 4, supported "
        "consumers at least 2"
    )
    assert note in result.verdict.evidence and not result.sizing.valid
    flat = " ".join(r.out.split())
    assert "tried 1✓, 2✓, 4?" in flat and f"{note} (not valid for sizing)" in flat
    assert flat.count(note) == 1  # said once, under find-max, not again under the verdict


# --- bad input with several consumers ------------------------------------------------------------


def test_more_consumers_than_shards_is_one_clear_error(dataset, cli):
    r = cli("scan", str(dataset / "shards"), "--consumers", "1,8")
    assert r.code == 2 and r.err.startswith("error: 4 tar shards cannot feed 8 consumers")


def test_bad_files_with_several_consumers(dataset_copy, tmp_path):
    tree = dataset_copy / "images"
    (tree / "class_000" / "zero.jpg").write_bytes(b"")
    (tree / "class_001" / "junk.jpg").write_bytes(os.urandom(500))
    r = scan(ScanConfig(str(tree), consumers=(2,), batch_size=4, workers=1))
    (m,) = r.measurements
    assert m.errors == 2 and m.samples == 24
    assert {e.stage for e in r.errors} == {"read", "decode"}


def test_option_conflicts(dataset):
    with pytest.raises(FeedbenchError, match="one of"):
        scan(ScanConfig(str(dataset), rate=10, step_s=1))
    with pytest.raises(FeedbenchError, match="needs an accelerator"):
        scan(ScanConfig(str(dataset), find_max=True))
    with pytest.raises(FeedbenchError, match="unknown profile"):
        scan(ScanConfig(str(dataset), profile="tpu-v9"))


# --- interrupt and torchrun ----------------------------------------------------------------------


def test_ctrl_c_writes_partial_results(dataset, tmp_path):
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "feedbench.cli", "scan", str(dataset / "images"), "--stages",
           "read", "--consumers", "1,2", "--workers", "0", "-b", "2", "--read-latency", "0.05",
           "--passes", "cold,warm", "--json", str(out), "--no-plots"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=interruptible)  # fmt: skip
    deadline = time.time() + 120
    while not out.exists() and time.time() < deadline:  # written after the first count
        time.sleep(0.2)
    assert out.exists(), proc.communicate()
    # inside the second count: its two consumers are running (a fixed sleep lost the race on a
    # loaded machine, where the count could end before the signal came)
    import psutil

    def consumers() -> int:  # forked by the scan's fork server: that server's children
        n = 0
        for kid in psutil.Process(proc.pid).children():
            with contextlib.suppress(psutil.Error):
                if "forkserver" in " ".join(kid.cmdline()):
                    n += len(kid.children())
        return n

    while consumers() < 2 and time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "partial results written" in stderr and "Traceback" not in stderr
    r = scan_results.load(out)
    assert r.partial and len(r.measurements) >= 2
    assert r.measurements[0].consumers == 1


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.usefixtures("torchrun_logs")
def test_two_torchrun_agents_on_localhost(dataset, tmp_path):
    port = _free_port()
    out = tmp_path / "tr.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = []
    for node in range(2):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node",
               "1", "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port",
               str(port), "-m", "feedbench", "consumer", str(dataset / "images"), "--stages",
               "read,decode", "-b", "4", "--workers", "1", "--json", str(out),
               "--no-plots"]  # fmt: skip
        procs.append(
            subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=tmp_path,
            )
        )
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    r = json.loads(out.read_text())
    (m,) = r["measurements"]
    assert m["consumers"] == 2 and m["samples"] == 24
    assert sorted(c["rank"] for c in m["per_consumer"]) == [0, 1]
    assert r["config"]["torchrun"]["world_size"] == 2
    assert "results:" in outs[0][0] and "results:" not in outs[1][0]  # rank 0 alone reports
    # each node once, with its ranks: both agents run on this machine, and are two nodes
    host = socket.gethostname()
    assert [(h["node"], h["ranks"], h["host"]["hostname"]) for h in r["hosts"]] == [
        (0, [0], host),
        (1, [1], host),
    ]
    assert r["hosts"][0]["host"]["cpu_count"] == os.cpu_count()
    shown = scan_results.load(out)
    facts = dict(system_facts(shown)[0])
    assert facts["node 0"].startswith(f"{host} (rank 0): ")
    assert facts["node 1"].startswith(f"{host} (rank 1): ")


# --- scan --loader: the training loaders measured end to end ------------------------------------


@pytest.mark.parametrize(
    ("backend", "layout", "n"),
    [("torch", "images", 2), ("wds", "shards", 2), ("dali", "images", 1), ("auto", "shards", 1)],
)
def test_scan_measures_a_training_loader(dataset, backend, layout, n):
    cfg = ScanConfig(str(dataset / layout), consumers=(n,), batch_size=4, workers=1,
                     loader=backend, step_s=0.01)  # fmt: skip
    r = scan(cfg)
    (m,) = r.measurements
    assert m.samples == 24 and m.errors == 0
    assert len({c.batches for c in m.per_consumer}) == 1  # equal steps on every rank
    (stage,) = m.stages
    # auto names the backend it picked: no GPU here, shards: wds
    name = "auto (wds)" if backend == "auto" else backend
    assert stage.name == f"loader:{name}" and stage.latency is not None
    assert all(c.au is not None for c in m.per_consumer)
    assert r.verdict.bound in ("loader", "accelerator", "sync")
    assert r.config["loader"] == backend
    # what the loader chose is kept for each consumer (no GPU here: the CPU decodes) and said
    from feedbench.report.scan_console import ran_with

    made = "resize on the CPU, 1 thread" if backend == "dali" else "1 worker"
    library = "" if backend == "dali" else " (simplejpeg)"
    chosen = [c.loader_settings for c in m.per_consumer]
    assert all(c.startswith(f"decode on the CPU{library}, {made}, on ") for c in chosen), chosen
    assert ran_with(r) == [chosen[0]]  # one consumer count: said once, the first consumer's


def test_unknown_loader_is_one_clear_error(dataset, cli):
    r = cli("scan", str(dataset / "images"), "--loader", "ffcv")
    assert r.code == 2 and r.err.startswith("error: unknown loader 'ffcv'")


def test_merged_read_latency_is_over_every_read_of_every_consumer():
    """Pooled percentiles, not the worst consumer's: a fast and a slow consumer's reads."""
    import numpy as np

    from feedbench.core.stats import percentiles
    from feedbench.scan.merge import merge_stages
    from feedbench.scan.results import StageStats

    fast = np.full(900, 0.001, np.float32)
    slow = np.full(100, 0.050, np.float32)

    def stage(lat):
        return [StageStats("read", len(lat), float(lat.sum()), 0, 0.0, 0.0, 0.0, percentiles(lat))]

    merged = merge_stages([stage(fast), stage(slow)], {"read": np.concatenate([fast, slow])})
    got = merged[0].latency
    assert got.p50_s == pytest.approx(0.001) and got.max_s == pytest.approx(0.050)
    assert got.p95_s == pytest.approx(0.050)  # 10% of all reads are slow: p95 is slow, p50 not
    worst = merge_stages([stage(fast), stage(slow)])[0].latency  # no raw values: upper bound
    assert worst.p50_s == pytest.approx(0.050) and worst.p50_s > got.p50_s


@pytest.mark.usefixtures("torchrun_logs")
def test_torchrun_rank_with_nothing_usable_writes_results_then_fails(tmp_path):
    """As a local scan: results written, one error line, a non-zero exit (here: torchrun's)."""
    bad = tmp_path / "bad" / "cls"
    bad.mkdir(parents=True)
    for i in range(3):
        (bad / f"{i}.jpg").write_bytes(os.urandom(1000))
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
           "-m", "feedbench", "consumer", str(tmp_path / "bad"), "--workers", "0", "-b", "2",
           "--json", str(out), "--no-plots"]  # fmt: skip
    r = subprocess.run(
        cmd, capture_output=True, text=True, timeout=180, cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert r.returncode != 0, r.stdout + r.stderr
    assert re.search(r"^error: no sample of .* could be read", r.stderr, re.M), r.stderr
    assert json.loads(out.read_text())["measurements"][0]["errors"] == 3


@pytest.mark.usefixtures("torchrun_logs")
def test_torchrun_scan_interrupted_keeps_what_was_measured(dataset, tmp_path):
    """Ctrl-C under torchrun (SIGINT to the whole process group, as a terminal sends it): rank 0
    writes the measurements finished so far, marked partial, says so in one line, exits 130."""
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
           "-m", "feedbench", "consumer", str(dataset / "images"), "--stages", "read",
           "--workers", "0", "-b", "4", "--passes", "cold,warm", "--repeat", "3",
           "--read-latency", "0.1", "--json", str(out), "--no-plots"]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1"), start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not out.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)  # the first of 6 measurements (24 reads × 0.1 s) has been saved
    assert out.exists(), proc.communicate(timeout=60)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "interrupted: partial results written" in stderr, stderr[-2000:]
    assert "Traceback" not in stdout
    r = json.loads(out.read_text())
    assert r["partial"] is True and 1 <= len(r["measurements"]) < 6


def test_what_the_loader_chose_is_said_per_consumer_count_where_it_differs():
    """scan's loader line: the loader's settings once, or per consumer count where they differ
    (its workers are split among the consumers); a user's loader (none kept) says nothing."""
    from types import SimpleNamespace

    from feedbench.report.scan_console import ran_with

    def m(n: int, settings: str | None) -> Measurement:
        c = ConsumerStats(
            rank=0,
            samples=0,
            files=0,
            read_bytes=0,
            errors=0,
            batches=0,
            wall_s=1.0,
            first_batch_s=None,
            samples_per_s=0.0,
            steady_samples_per_s=None,
            stages=[],
            loader_settings=settings,
        )
        return replace(_m(n, 100.0), per_consumer=[c] * n)  # fmt: skip

    two = "decode on the CPU, 2 workers, on every core"
    one = "decode on the CPU, 1 worker, on every core"
    runs = SimpleNamespace(measurements=[m(1, two), m(1, two), m(2, one)])
    assert ran_with(runs) == [f"{two} (at 1 consumer)", f"{one} (at 2 consumers)"]
    assert ran_with(SimpleNamespace(measurements=[m(1, two), m(2, two)])) == [two]
    assert ran_with(SimpleNamespace(measurements=[m(1, None)])) == []
