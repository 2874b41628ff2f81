"""The analysis scripts in scripts/ that the benchmarks' figures come from."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def test_trace_streams_sums_kernel_time_per_stream_and_overlap(tmp_path):
    """Two streams: 7 runs [0, 10] and [20, 30] ms, 13 runs [5, 25] ms; a copy on 7."""

    def kernel(stream, start_ms, end_ms, name):
        return {
            "ph": "X", "cat": "kernel", "name": name, "ts": start_ms * 1e3,
            "dur": (end_ms - start_ms) * 1e3, "args": {"stream": stream},
        }  # fmt: skip

    events = [
        kernel(7, 0, 10, "conv_fwd"),
        kernel(7, 20, 30, "conv_bwd"),
        kernel(13, 5, 25, "dali::resize"),
        {
            "ph": "X",
            "cat": "gpu_memcpy",
            "name": "HtoD",
            "ts": 1e3,
            "dur": 2e3,
            "args": {"stream": 7},
        },
        {"ph": "M", "name": "process_name", "args": {"name": "python"}},
    ]
    path = tmp_path / "trace-rank0.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    r = subprocess.run(
        [sys.executable, str(SCRIPTS / "trace_streams.py"), str(path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    out = " ".join(r.stdout.split())
    assert re.search(r"window 30\.0 ms, some kernel running 30\.0 ms \(100\.0%\)", out), out
    assert "stream 7: 2 kernels, 20.0 ms of kernels, 20.0 ms busy, 10.0 ms of it beside" in out
    assert "stream 13: 1 kernels, 20.0 ms of kernels, 20.0 ms busy, 10.0 ms of it beside" in out
    assert "20.00 ms dali::resize" in out and "10.00 ms conv_fwd" in out
    assert "stream 7: 1 copies/sets, 2.0 ms" in out


def test_trace_streams_gaps_of_the_busiest_stream(tmp_path):
    """Stream 7: kernels [0, 10], [10.01, 20], a copy [25, 26], a kernel [26.02, 40] ms: idle
    10 µs + 20 µs (short) and 5 ms (long, between 'b' and the copy)."""
    events = [
        {"ph": "X", "cat": cat, "name": name, "ts": a * 1e3, "dur": (b - a) * 1e3,
         "args": {"stream": 7}}
        for cat, name, a, b in [("kernel", "a", 0, 10), ("kernel", "b", 10.01, 20),
                                ("gpu_memcpy", "HtoD", 25, 26), ("kernel", "c", 26.02, 40)]
    ]  # fmt: skip
    events.append({"ph": "X", "cat": "kernel", "name": "d", "ts": 0, "dur": 1e3,
                   "args": {"stream": 9}})  # fmt: skip
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    r = subprocess.run(
        [sys.executable, str(SCRIPTS / "trace_streams.py"), str(path), "--gaps", "1"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    out = " ".join(r.stdout.split())
    want = "idle between its operations: 5.03 ms; in 2 gaps < 30 µs: 0.03 ms, in 1 longer: 5.00 ms"
    assert want in out, out
    assert "at 20.00 ms: 5.00 ms idle after 'b' before 'HtoD'" in out, out
    assert out.count("idle between") == 1  # only the busiest stream


def test_trace_streams_bad_input_is_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    for path, why in ((tmp_path / "missing.json.gz", "No such file"), (bad, "not a Chrome trace")):
        r = subprocess.run(
            [sys.executable, str(SCRIPTS / "trace_streams.py"), str(path)],
            capture_output=True, text=True,
        )  # fmt: skip
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith(f"error: {path}: {why}"), r.stderr


def _spread(mean: float, std: float, n: int) -> dict:
    return {"n": n, "mean": mean, "std": std, "min": mean - std, "max": mean + std, "cv": None}


def _bench_scan_results() -> dict:
    """A bench_scan results dict: shards read (fio, feedbench w0, N jobs), decode with plain ×N."""
    machine = {
        "cpu_model": "Test CPU", "usable_cores": 2, "logical_cpus": 4, "memory_bytes": 8 * 2**30,
        "kernel": "6.1", "fio": "fio-3.33", "python": "3.11.7", "pillow": "11.0.0",
        "libjpeg_turbo": "3.0.0", "gpus": [],
        "data_filesystem": {"fstype": "ext4", "device": "/dev/vda"},
    }  # fmt: skip
    shards = {
        "files": 16, "bytes": 200e6, "repeats": 3,
        "fio": {"mb_per_s": _spread(1000, 10, 3), "other_cores_max": 0.05,
                "runs": [{"mb_per_s": 1000, "resident_before": 0.025}]},
        "feedbench_w0": {"mb_per_s": _spread(900, 20, 3), "other_cores_max": 0.01,
                         "read_stage_mb_per_s": _spread(1100, 30, 3), "runs": []},
        "ratio_feedbench_w0_to_fio": 0.9,
        "ratio_paired_w0": _spread(0.9, 0.02, 3),
        "parallel": {
            "jobs": 2, "fio": {"mb_per_s": _spread(1500, 0, 3), "other_cores_max": 0.1},
            "feedbench": {"mb_per_s": _spread(1200, 0, 3), "other_cores_max": 0.02},
            "ratio_feedbench_to_fio": 0.8, "ratio_paired": _spread(0.8, 0, 3),
        },
    }  # fmt: skip
    point2 = {
        "consumers": 2, "img_per_s": _spread(171, 3, 2), "per_consumer": 85.5, "efficiency": 0.85,
        "other_cores_max": 0.2,
        "plain_parallel": {"img_per_s": _spread(190, 4, 2), "efficiency": 0.95,
                           "other_cores_max": 0.1},
        "ratio_to_plain_parallel": 0.9, "ratio_to_plain_parallel_paired": _spread(0.9, 0.01, 2),
    }  # fmt: skip
    decode = {
        "files": 1200,
        "plain_python": {"img_per_s": _spread(100, 2, 2), "other_cores_max": 0.03},
        "feedbench": [point2],
        "ratio_feedbench1_to_plain": 0.95,
        "min_efficiency_up_to_cores": 0.85,
        "plain_parallel": {"batch": 64, "min_ratio_feedbench_to_plain_parallel": 0.9,
                           "min_ratio_at_consumers": 2, "goal_met": True},
    }  # fmt: skip
    return {
        "kind": "bench_scan", "label": "testbox", "date": "2026-12-01",
        "command": "scripts/bench_scan.py --make 200", "config": {"cores": 2},
        "machine": machine, "read": {"shards": shards}, "decode": decode, "quiet_waited_s": 4.0,
    }  # fmt: skip


def test_bench_scan_renders_its_markdown_from_results(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_bench_scan_results()))
    r = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_scan.py"), "--render", str(path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    lines = r.stdout.splitlines()
    assert lines[0].startswith("Machine: testbox — Test CPU, 2 usable cores (4 logical), 8 GiB")
    assert "fio-3.33; Python 3.11.7, Pillow 11.0.0 (libjpeg-turbo 3.0.0); 2026-12-01." in lines[0]
    assert lines[2] == "Command: `scripts/bench_scan.py --make 200`"
    read_head = (
        "| layout | files, MB | fio | feedbench w0 | w0 / fio (paired) | ≥ 0.9 | feedbench w1 "
        "| Python read() | Python readinto | cat | other load |"
    )
    at = lines.index(read_head)
    assert lines[at + 1] == "|---|---|---|---|---|---|---|---|---|---|---|"
    assert lines[at + 2] == (
        "| shards | 16, 200 | 1,000 ± 10 | 900 ± 20 | 0.900 (0.90 ± 0.02) | yes | – | – | – | – "
        "| 0.05 |"
    )
    assert "| shards | 2 | 1,500 ± 0 | 1,200 ± 0 | 0.800 (0.80 ± 0.00) | **no** | 0.10 |" in lines
    assert "seconds waiting for it), MB/s: shards 1,100 ± 30." in r.stdout
    assert "| plain Python (read + PIL convert) | 1 | 100.0 ± 2.0 | | | | | | | | 0.03 |" in lines
    assert (
        "| feedbench --workers 0 | 2 | 171.0 ± 3.0 | 85.5 | 0.850 | **no** | 190.0 ± 4.0 | 0.950 "
        "| 0.900 (0.90 ± 0.01) | yes | 0.20 |"
    ) in lines
    assert (
        "feedbench (1 consumer) / plain Python = 0.950; lowest efficiency for 2 ≤ N ≤ 2 = 0.850."
        in r.stdout
    )
    assert "≥ 0.9 for N ≤ 2: lowest 0.900 (N = 2): met." in r.stdout
    assert "Cold check: at most 2.5% of the data was in the page cache" in r.stdout
    assert r.stdout.rstrip().endswith("\n\n(Waited 4 s in all for other load to pass.)")


def test_verify_table_ceiling_of_the_same_repeat_and_variant_spread(tmp_path):
    """Repeat K's loader run is divided by repeat K's synthetic run; variants get mean ± std."""

    def results(name: str, runs: list[dict]) -> str:
        cfg = {"stream_priority": "high", "ddp_options": {"broadcast_buffers": False}}
        path = tmp_path / f"{name}.json.gz"
        path.write_bytes(gzip.compress(json.dumps({"config": cfg, "runs": runs}).encode()))
        return str(path)

    def run(loader: str, ips: float, status: str = "ok", **extra) -> dict:
        return {"loader": loader, "gpus": 2, "images_per_s": ips, "status": status, **extra}

    dali = {"workers": 6, "data_wait_fraction": 0.02, "breakdown": {"forward_backward_s": 0.05}}
    paired = {"ceiling_fraction": 0.93, "ceiling_fraction_lo": 0.9, "ceiling_fraction_hi": 0.96,
              "slowdown_s": 0.0021}  # fmt: skip
    paths = [
        results("tune-synthetic-r1", [run("synthetic", 1000)]),
        results("tune-synthetic-r2", [run("synthetic", 800)]),
        results("tune-x-r1", [run("dali", 900, **dali)]),
        results(
            "tune-x-r2",
            [run("dali", 720, **dali, paired=paired), run("torch", 0, "error", error="boom")],
        ),  # fmt: skip
    ]
    r = subprocess.run(
        [sys.executable, str(SCRIPTS / "verify_table.py"), *paths],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    lines = r.stdout.splitlines()
    assert lines[0].startswith("| file | loader | options | stream | CPUs | workers | GPUs | img/s")
    opts = "ddp:broadcast_buffers=False | high | inherit"
    assert f"| tune-x-r1 | dali | {opts} | 6 | 2 | 900 | 1,000 | 0.900 | 2.0% | 50.0 |" in r.stdout
    assert f"| tune-x-r2 | dali | {opts} | 6 | 2 | 720 | 800 | 0.900 | 2.0% | 50.0 |" in r.stdout
    assert lines[4].endswith("| – | – |")  # repeat 1: not paired
    assert lines[5].endswith("| 0.930 (0.90–0.96) | +2.1 |")
    assert lines[6].startswith("| tune-x-r2 | torch |") and lines[6].endswith(" error: boom")
    assert lines[8] == (
        "| variant | loader | GPUs | runs | img/s | of ceiling | data wait % | fwd+bwd ms "
        "| paired: of ceiling |"
    )
    assert (
        "| tune-x | dali | 2 | 2 | 810 ± 127 | 0.900 ± 0.000 | 2.0 ± 0.0 | 50.0 ± 0.0 "
        "| 0.930 (1 run) |"
    ) in lines
    assert "| tune-synthetic | synthetic | 2 | 2 | 900 ± 141 | 1.000 ± 0.000 | – | – | – |" in lines
    assert not any("torch" in line for line in lines[8:])  # failed runs stay out of the spread


def test_verify_table_help_and_no_arguments():
    script = str(SCRIPTS / "verify_table.py")
    r = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "python scripts/verify_table.py results/tune-*.json" in r.stdout
    r = subprocess.run([sys.executable, script], capture_output=True, text=True)
    assert r.returncode == 2 and "verify_table.py" in r.stderr and r.stdout == ""
    r = subprocess.run([sys.executable, script, "/no/such.json"], capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        "error: /no/such.json: not a readable verify results file ([Errno 2] No such file or "
        "directory: '/no/such.json')"
    ]


@pytest.mark.slow  # two script runs that import torch (feedbench.scan), 4-7 s
def test_bench_dlio_writes_dlio_layout_and_config_over_the_same_files(tmp_path, monkeypatch):
    """--write-config: feedbench's link tree, and per world size DLIO's (its train/ layout,
    whole batches for 1 and 2 ranks) in which DLIO's rank r reads feedbench's rank r's files in
    feedbench's order; DLIO's configs from feedbench's unet3d row; too few files: one error."""
    from feedbench.sample_workload import make_workload
    from feedbench.scan.consumer import consumer_units
    from feedbench.scan.sources import detect

    monkeypatch.syspath_prepend(str(SCRIPTS))
    from benchlib import dlio

    make_workload(tmp_path / "u3d", "unet3d", 0.0005)  # 32 small npz files
    script, work = str(SCRIPTS / "bench_dlio.py"), tmp_path / "work"
    r = subprocess.run(
        [sys.executable, script, "--data", str(tmp_path / "u3d"), "--work", str(work),
         "--write-config"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    sources = sorted((tmp_path / "u3d" / "data").glob("*.npz"))[:28]  # 28 = 2 ranks × 2 × 7
    source, _ = detect(str(work / "dataset" / "train"), "npz")
    assert [Path(p).resolve() for p in source.files()] == [p.resolve() for p in sources]
    for world in (1, 2):
        links = sorted((work / f"dlio-np{world}" / "train").iterdir())
        assert [p.name for p in links[:2]] == ["img_0000_of_0028.npz", "img_0001_of_0028.npz"]
        assert (work / f"dlio-np{world}" / "valid").is_dir()
        for rank in range(world):
            dlio_reads = [links[i].resolve() for i in dlio.dlio_order(28, rank, world)]
            fb_reads = [sources[i].resolve() for i in consumer_units(source, rank, world, seed=0,
                                                                     epoch=0)]  # fmt: skip
            assert dlio_reads == fb_reads
        config = work / "dlio-config" / "workload" / f"feedbench_unet3d_np{world}.yaml"
        text = config.read_text()
        for line in ("batch_size: 7", "read_threads: 4", "computation_time: 0.323",
                     "num_files_train: 28", f"data_folder: {work / f'dlio-np{world}'}",
                     "checkpoint: False", "keep_files: True", "seed: 123"):  # fmt: skip
            assert f"  {line}\n" in text, line
    r = subprocess.run(
        [sys.executable, script, "--data", str(tmp_path / "u3d"), "--work", str(work),
         "--files", "13", "--write-config"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        "error: need at least 14 npz files (batch × largest world)"
    ], r.stderr


def test_bench_dlio_copies_link_every_file_k_times_for_warm_runs_only(tmp_path):
    """--copies K: K links to every file (K× the steps from the same page cache); refused for
    cold runs, where every copy after the first would be read warm."""
    from feedbench.sample_workload import make_workload

    make_workload(tmp_path / "u3d", "unet3d", 0.0005)  # 32 small npz files → 28 used
    script, work = str(SCRIPTS / "bench_dlio.py"), tmp_path / "work"
    base = [sys.executable, script, "--data", str(tmp_path / "u3d"), "--work", str(work)]
    r = subprocess.run([*base, "--copies", "3", "--caches", "warm", "--write-config"],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    links = sorted((work / "dataset" / "train").iterdir())
    assert len(links) == 84 and links[-1].name == "img_0083_of_0084.npz"
    assert links[28].resolve() == links[0].resolve() == links[56].resolve()
    assert len({p.resolve() for p in links}) == 28
    assert len(list((work / "dlio-np2" / "train").iterdir())) == 84
    r = subprocess.run([*base, "--copies", "3", "--write-config"], capture_output=True, text=True)
    assert r.returncode == 2 and "--copies is for warm runs" in r.stderr


def test_bench_dlio_reads_both_tools_metrics_the_dlio_way(tmp_path, monkeypatch):
    """DLIO 2.0.0's outputs (summary, per-rank steps) and a feedbench results file → the same
    quantities: AU, samples/s over the whole epoch, samples/s after the first step."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    from benchlib import dlio

    (tmp_path / "summary.json").write_text(json.dumps({"metric": {
        "train_au_percentage": [50.0], "train_throughput_samples_per_second": [4.0]}}))  # fmt: skip
    for rank, au in ((0, 50.0), (1, 25.0)):
        epoch = {"1": {"au": {"block1": au}, "compute": {"block1": [0.5, 0.5, 0.5]}}}
        (tmp_path / f"{rank}_output.json").write_text(json.dumps(epoch | {"hostname": "h"}))
    got = dlio.dlio_metrics(tmp_path, batch=7)
    # after step 1 a rank's rate is AU × batch / step: 0.5 × 14 + 0.25 × 14
    assert got == {"au": [0.5], "samples_per_s": [4.0], "steady_samples_per_s": [10.5],
                   "steps": [6], "samples": 42}  # fmt: skip
    consumer = {"samples": 21, "wall_s": 3.0, "batches": 3}
    two = [consumer, consumer | {"wall_s": 7.0}]
    result = {"measurements": [{"au_mean": 0.4, "steady_samples_per_s": 9.0, "per_consumer": two}]}
    assert dlio.feedbench_metrics(result) == {
        "au": [0.4], "samples_per_s": [10.0], "steady_samples_per_s": [9.0], "steps": [6],
        "samples": 42,
    }  # fmt: skip


def test_bench_dlio_cpu_per_sample_cancels_start_up(tmp_path, monkeypatch):
    """Runs of 1 and 3 epochs: CPU per sample all-in (start-up spread over the samples) and
    marginal, paired by repeat, where a start-up the same in both runs cancels."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    from benchlib import dlio

    def run(rep: int, epochs: int, start_s: float) -> dict:
        samples = 42 * epochs  # 0.2 CPU-s per sample after start_s of imports
        return {"cache": "warm", "world": 2, "tool": "dlio", "repeat": rep, "epochs": epochs,
                "samples": samples, "own_cpu_s": start_s + 0.2 * samples}  # fmt: skip

    runs = [run(1, 1, 6.0), run(1, 3, 6.0), run(2, 1, 8.0), run(2, 3, 8.0)]
    # AU and samples/s are compared on the 1-epoch runs only, where the orders are aligned
    assert [r["epochs"] for r in dlio.aligned_runs(runs, "warm", 2, "dlio")] == [1, 1]
    (row,) = dlio.cpu_per_sample(runs)
    assert row["marginal"]["mean"] == pytest.approx(0.2) and row["marginal"]["n"] == 2
    assert row["all_in"][1]["mean"] == pytest.approx(0.2 + 7.0 / 42)  # start-up included
    assert row["all_in"][3]["mean"] == pytest.approx(0.2 + 7.0 / 126)
    assert "| warm | 2 | dlio | 1: 0.3667 ± 0.0337, 3: 0.2556 ± 0.0112 | 0.2000 ± 0.0000 |" in (
        dlio.render({"cpu_per_sample": [row]})
    )


def test_bench_dlio_pools_batches_and_pairs_runs_by_repeat(tmp_path):
    """--pool: results files of separate calls as one; a tool's run pairs with the other tool's
    run of the same batch and repeat, so a run killed in one batch leaves only its pair out."""

    def run(tool: str, rep: int, au: float, rate: float) -> dict:
        return {"tool": tool, "world": 2, "cache": "warm", "repeat": rep, "epochs": 1,
                "au": [au], "samples_per_s": [rate], "steady_samples_per_s": [rate],
                "loadavg_before": 1.0, "loadavg_after": 1.0, "other_cores": 0.0}  # fmt: skip

    # batch 1: feedbench's repeat 2 was killed (a call's time limit); its repeat 1 is 0.9 × DLIO's
    b1 = [run("dlio-lean", 1, 1.0, 40.0), run("feedbench", 1, 0.9, 36.0),
          run("dlio-lean", 2, 0.5, 20.0)]  # fmt: skip
    b2 = [run("feedbench", 1, 1.0, 40.0), run("dlio-lean", 1, 1.0, 40.0)]
    files = []
    for k, runs in enumerate((b1, b2), 1):
        files.append(tmp_path / f"b{k}.json")
        files[-1].write_text(json.dumps({"command": f"call {k}", "runs": runs}))
    out = tmp_path / "pooled.json"
    script = [sys.executable, str(SCRIPTS / "bench_dlio.py")]
    r = subprocess.run([*script, "--pool", *map(str, files), "--out", str(out)],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert [p["command"] for p in res["pooled_from"]] == ["call 1", "call 2"]
    (row,) = res["comparisons"]
    # pairs (1, 1) and (2, 1): 0.9 and 1.0; DLIO's unpaired 0.5 is left out of the ratio
    assert row["feedbench_vs_dlio-lean"]["au"]["mean"] == pytest.approx(0.95)
    assert row["feedbench_vs_dlio-lean"]["au"]["n"] == 2
    assert row["tools"]["dlio-lean"]["au"]["n"] == 3  # but in DLIO's own summary
    assert "| warm | 2 | dlio-lean | 0.950 ± 0.071 |" in out.with_suffix(".md").read_text()
    r = subprocess.run([*script, "--pool", str(tmp_path / "none.json"), "--out", str(out)],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 2 and "no such results file" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([*script, "--consumers", "1"], capture_output=True, text=True)
    assert r.returncode == 2 and "--data and --work are required" in r.stderr
    (tmp_path / "other.json").write_text(json.dumps({"kind": "scan"}))
    r = subprocess.run([*script, "--pool", str(files[0]), str(tmp_path / "other.json"),
                        "--out", str(out)], capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 1 and "other.json is not a bench_dlio results file" in r.stderr
    assert "Traceback" not in r.stderr


def test_bench_dlio_a_hung_run_leaves_its_stacks_and_no_process(tmp_path, monkeypatch):
    """A run whose processes never end (a parent waiting on a child, as mpirun on its ranks):
    after the timeout each Python process writes its stack into the log and all are gone."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    from benchlib import dlio

    child = "import time\ndef rank_waits_here():\n    time.sleep(600)\nrank_waits_here()\n"
    parent = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {child!r}])\n"
    log = tmp_path / "log.txt"
    with pytest.raises(dlio.Hung, match="stacks of 2 Python processes"):
        # the environment DLIO's command carries (mpirun passes it on to the ranks)
        dlio.timed([sys.executable, "-c", parent], {"PYTHONFAULTHANDLER": "1"}, tmp_path, log,
                   timeout_s=2)  # fmt: skip
    text = log.read_text()
    assert text.count("Fatal Python error: Aborted") == 2, text
    assert "in rank_waits_here" in text and "in run" in text, text  # the child's, the parent's
    mine = {p.pid for p in psutil.Process().children(recursive=True)}
    assert not any("rank_waits_here" in " ".join(p.cmdline()) for p in map(psutil.Process, mine))


def test_bench_dlio_read_threads_reach_both_tools(tmp_path, monkeypatch):
    """--read-threads N: DLIO's config reads with N threads and feedbench with N workers;
    without it both take the workload table's 4; DLIO prefetches as deep as feedbench."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    from benchlib import dlio

    four = dlio.workload_config(tmp_path, 14)
    one = dlio.workload_config(tmp_path, 14, read_threads=1)
    # and DLIO's prefetch_size gives its DataLoader feedbench's 2 batches in flight per worker
    assert "  read_threads: 4\n  prefetch_size: 8\n" in four
    assert "  read_threads: 1\n  prefetch_size: 2\n" in one
    cmd = dlio.feedbench_command(tmp_path, 2, "cold", 1, tmp_path / "o.json")
    assert "--workers" not in cmd and cmd[-1] == "--drop-caches"
    cmd = dlio.feedbench_command(tmp_path, 2, "warm", 1, tmp_path / "o.json", read_threads=1)
    assert cmd[cmd.index("--workers") + 1] == "1" and "--drop-caches" not in cmd
    r = subprocess.run([sys.executable, str(SCRIPTS / "bench_dlio.py"), "--data", str(tmp_path),
                        "--work", str(tmp_path), "--read-threads", "0"],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 2 and "--read-threads must be at least 1, not 0" in r.stderr, r.stderr


def test_cpu_meter_counts_a_run_s_orphaned_processes_as_its_own():
    """A run whose process leaves a child behind (as a multiprocessing fork server outlives the
    feedbench process that started it): the child is adopted and reaped, so its CPU time is the
    run's own, not other load. In a process of its own: a subreaper stays one."""
    orphan = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    time.sleep(0.2); t = time.process_time()\n"
        "    while time.process_time() - t < 0.6: pass\n"
        "    os._exit(0)\n"
    )
    meter = (
        "import subprocess, sys\n"
        "from benchlib import machine\n"
        "before = machine._own_cpu_s()\n"
        "with machine.CpuMeter() as m:\n"
        f"    subprocess.run([sys.executable, '-c', {orphan!r}], check=True)\n"
        "print(m.adopting, machine._own_cpu_s() - before)\n"
    )
    r = subprocess.run([sys.executable, "-c", meter], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(SCRIPTS)}, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    adopting, own = r.stdout.split()
    if adopting != "True":
        pytest.skip("prctl(PR_SET_CHILD_SUBREAPER) is Linux only")
    assert float(own) >= 0.6


def test_bench_8gpu_table_pairs_every_loader_s_scans_with_the_verify_runs(tmp_path):
    """The 8-GPU runbook's last phase, on the 1-H200 results of run 7 laid out as its calls
    write them: one prediction file per loader, each pairing the scan with both verify repeats;
    a phase without its arguments gives its usage and exit 2."""
    run7 = SCRIPTS.parent / "benchmarks" / "2026-12-01-h200-run7"
    out = tmp_path / "out"
    (out / "scan-g1").mkdir(parents=True)
    for f in (run7 / "scan").glob("scan-*.json.gz"):  # stored gzipped; the calls write plain JSON
        (out / "scan-g1" / f.name.removesuffix(".gz")).write_bytes(gzip.decompress(f.read_bytes()))
    for rep in (1, 2):
        src = run7 / "verify" / f"verify-1gpu-r{rep}.json.gz"
        (out / f"verify-g1-r{rep}.json").write_bytes(gzip.decompress(src.read_bytes()))
    bin_dir = tmp_path / "bin"  # the runbook calls python3: this test's interpreter
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    env = os.environ | {"OUT": str(out), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    script = str(SCRIPTS / "bench_8gpu.sh")
    r = subprocess.run(["bash", script, "table"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # run 7's second repeat left the stock DataLoader (baseline) out
    expected = [("torch", "torch", (1, 2)), ("dali", "dali", (1, 2)), ("wds", "wds", (1, 2)),
                ("stock_loader", "baseline", (1,))]  # fmt: skip
    for name, loader, reps in expected:
        pairs = json.loads((out / f"prediction-{name}.json").read_text())["pairs"]
        got = {(p["loader"], p["gpus"], p["verify_label"]) for p in pairs}
        assert got == {(loader, 1, f"verify-g1-r{k}") for k in reps}
    r = subprocess.run(["bash", script, "verify", "8"], env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "usage:" in r.stderr


def test_device_dlio_env_without_its_bundle_says_so_and_fails(tmp_path):
    """Sourced where .xfer/dlio.tar was not carried: one line, and a status the next command
    (or `&&`) sees."""
    env_sh = SCRIPTS / "device_dlio_env.sh"
    r = subprocess.run(["bash", "-c", f". {env_sh} && echo went-on"], cwd=tmp_path,
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode != 0 and "went-on" not in r.stdout
    assert r.stderr.strip().splitlines() == [
        "device_dlio_env: no .xfer/dlio.tar (run scripts/dlio_bundle.sh, carry .xfer/dlio.tar)"
    ]


def test_every_test_file_the_scripts_and_readme_name_exists():
    root = SCRIPTS.parent
    named = {
        (doc.name, path)
        for doc in [root / "README.md", *(root / "docs").glob("*.md"), *SCRIPTS.iterdir()]
        if doc.is_file()
        for path in re.findall(r"\btests/[\w/]+\.py\b", doc.read_text(errors="replace"))
    }
    assert named, "no test file named: the pattern is wrong"
    assert [(doc, path) for doc, path in sorted(named) if not (root / path).is_file()] == []


@pytest.mark.slow  # imports torch and torch._dynamo
def test_gloo_teardown_probe_early_import_leaves_no_gloo_thread():
    """The order examples/imagenet_ddp.py uses: torch._dynamo imported before the group."""
    proc = subprocess.run([sys.executable, str(SCRIPTS / "gloo_teardown_probe.py"), "early"],
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    counts = [int(n) for n in re.findall(r"refcount [\w ]+ (\d+)", proc.stdout)]
    assert len(counts) == 3 and counts[0] == counts[2]  # the model gave back what it took
    (left,) = re.findall(r"threads after destroy_process_group and del: (.*)", proc.stdout)
    assert "python" in left and "gloo" not in left


def test_verify_table_ceiling_of_its_own_batch_and_both_synthetic_runs(tmp_path):
    """check-b64-r1 and check-b256-r1 are both repeat 1: each loader run takes the synthetic run
    of its own variant and per-GPU batch, and with --ceiling-twice the mean of its two runs."""
    paths = []
    for batch, synth, after, torch_ips in ((64, 2000, 1800, 1710), (256, 4500, None, 4455)):
        runs = [
            {"loader": "synthetic", "gpus": 1, "per_gpu_batch": batch, "images_per_s": synth,
             "status": "ok", "ceiling_after_images_per_s": after},
            {"loader": "torch", "gpus": 1, "per_gpu_batch": batch, "images_per_s": torch_ips,
             "status": "ok"},
        ]  # fmt: skip
        path = tmp_path / f"check-b{batch}-r1.json"
        path.write_text(json.dumps({"config": {}, "runs": runs}))
        paths.append(str(path))
    r = subprocess.run(
        [sys.executable, str(SCRIPTS / "verify_table.py"), *paths],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    rows = {line.split("|")[1].strip() + line.split("|")[2].strip(): line for line in
            r.stdout.splitlines() if line.startswith("| check")}  # fmt: skip
    assert "| 1,710 | 1,900 | 0.900 |" in rows["check-b64-r1torch"]
    assert "| 4,455 | 4,500 | 0.990 |" in rows["check-b256-r1torch"]


def test_diag_step_summary_pairs_by_round_and_over_the_mean_of_synthetic():
    """Two rounds: synthetic 100 then 200 img/s; the loader 90 then 150. Paired: 0.90 and 0.75;
    over the synthetic blocks' mean (150): 120 / 150 = 0.80."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("diag_step", SCRIPTS / "diag_step.py")
    diag = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(diag)  # type: ignore[union-attr]
    rows = [
        {"condition": "synthetic", "round": 0, "img_s": 100.0, "step_ms": 10.0},
        {"condition": "torch", "round": 0, "img_s": 90.0, "step_ms": 11.0, "next_ms": 1.0},
        {"condition": "synthetic", "round": 1, "img_s": 200.0, "step_ms": 5.0},
        {"condition": "torch", "round": 1, "img_s": 150.0, "step_ms": 6.0, "next_ms": 1.0},
    ]
    s = diag.summarise(rows, ["synthetic", "torch"])["torch"]
    assert s["ratio"] == pytest.approx(0.825) and (s["ratio_min"], s["ratio_max"]) == (0.75, 0.9)
    assert s["of_mean"] == pytest.approx(0.8)
    assert s["tlb"] == 0 and s["canary"] is None  # blocks without those counters
