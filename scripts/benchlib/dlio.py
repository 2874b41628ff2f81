"""The logic of scripts/bench_dlio.py: DLIO (MLPerf Storage's benchmark) and ``feedbench scan``
on the same files, with the same batch, read threads and step time, measured DLIO's way.

DLIO's definitions (dlio_benchmark 2.0.0, ``utils/statscounter.py``), per rank and epoch:

* AU = Σ computation_time of steps 2..n / (epoch time − step 1's time): the first step is left
  out, as feedbench's one warm-up batch;
* samples/s = n steps × batch / epoch time (the first step included), summed over ranks; both
  averaged over epochs. feedbench's per-consumer ``au`` and ``samples`` / ``wall_s`` are the same
  quantities (its wall time also starts before the loader workers are forked).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from feedbench.core.stats import spread
from feedbench.core.workloads import get_row, get_shape

from .common import paired
from .machine import CpuMeter

WORKLOAD = "unet3d"
CONFIG_NAME = "feedbench_unet3d_np{world}"  # DLIO's workload config, one per world size
DLIO_SEED = 123  # DLIO's default train.seed, written into the config so the order is pinned
LEAN = Path(__file__).resolve().parent / "dlio_lean.py"
# what DLIO's console entry (``dlio_benchmark`` beside a venv's python) runs, for a Python without
# one (scripts/device_dlio_env.sh's /tmp/dlio-python)
DLIO_MAIN = "import sys; from dlio_benchmark.main import main; sys.exit(main())"
TOOLS = ("dlio", "dlio-lean", "feedbench")
# feedbench's loader workers keep 2 batches each in flight (prefetch_factor 2); DLIO's torch
# loader takes prefetch_factor = ceil(prefetch_size / read_threads), prefetch_size 2 by default:
# 1 per worker at 4 threads. The config asks DLIO for feedbench's depth.
PREFETCH_PER_WORKER = 2


def files_to_use(files: list[Path], batch: int, max_world: int, limit: int | None) -> list[Path]:
    """The first files (by name) whose count every world size splits into whole batches: DLIO
    drops a rank's partial last batch (``drop_last``), so equal work needs no partial batch."""
    n = len(files) if limit is None else min(limit, len(files))
    whole = batch * max_world
    n -= n % whole
    if n == 0:
        raise SystemExit(f"error: need at least {whole} npz files (batch × largest world)")
    return files[:n]


def link_tree(files: list[Path], root: Path) -> Path:
    """``root/train/img_K_of_N.npz`` → each file: DLIO's layout over the very same files (DLIO
    lists ``data_folder/train`` sorted by name; feedbench scans the same folder)."""
    train = root / "train"
    train.mkdir(parents=True, exist_ok=True)
    (root / "valid").mkdir(exist_ok=True)  # DLIO lists it even without evaluation
    for old in train.iterdir():
        old.unlink()
    n = len(files)
    for k, f in enumerate(files):
        (train / f"img_{k:04d}_of_{n:04d}.npz").symlink_to(f.resolve())
    return train


def workload_config(
    data_folder: Path, n_files: int, accelerator: str = "h100", read_threads: int | None = None
) -> str:
    """DLIO's ``unet3d_<accelerator>.yaml`` with our folder and file count, checkpoints off (a
    checkpoint is a write and no part of feeding) and data generation off. Batch, read threads
    (unless ``read_threads``), step time and sizes come from feedbench's workload table, the
    one both tools follow."""
    row, shape = get_row(WORKLOAD, accelerator), get_shape(WORKLOAD)
    threads = row.read_threads if read_threads is None else read_threads
    return f"""# written by scripts/bench_dlio.py from feedbench.core.workloads ({row.source})
model: unet3d
framework: pytorch
workflow:
  generate_data: False
  train: True
  checkpoint: False
dataset:
  data_folder: {data_folder}
  format: npz
  num_files_train: {n_files}
  num_samples_per_file: 1
  record_length: {int(shape.sample_bytes)}
  record_length_stdev: {int(shape.sample_bytes_std)}
  record_length_resize: 2097152
  keep_files: True
reader:
  data_loader: pytorch
  batch_size: {row.batch_size}
  read_threads: {threads}
  prefetch_size: {PREFETCH_PER_WORKER * threads}
  file_shuffle: seed
  sample_shuffle: seed
train:
  epochs: 1
  computation_time: {row.step_s}
  seed: {DLIO_SEED}
metric:
  au: {row.target_au}
"""


def write_config(
    work: Path, data_folder: Path, n_files: int, world: int, read_threads: int | None = None
) -> Path:
    """World ``world``'s config in the folder DLIO is pointed at with hydra's ``--config-dir``."""
    folder = work / "dlio-config"
    (folder / "workload").mkdir(parents=True, exist_ok=True)
    path = folder / "workload" / f"{CONFIG_NAME.format(world=world)}.yaml"
    path.write_text(workload_config(data_folder, n_files, read_threads=read_threads))
    return folder


def dlio_order(n: int, rank: int, world: int, seed: int = DLIO_SEED) -> list[int]:
    """The sample indices DLIO 2.0.0's torch sampler gives ``rank`` (``dlio_sampler``): a
    contiguous block of ceil(n / world), shuffled after ``np.random.seed(seed)``, the same
    every epoch; sample i is file i of the sorted list (one sample per file)."""
    import numpy as np

    per = math.ceil(n / world)
    indices = list(range(rank * per, (rank + 1) * per))
    np.random.seed(seed)
    np.random.shuffle(indices)
    return indices


def aligned_tree(fb_files: list[Path], orders: list[list[int]], root: Path) -> Path:
    """DLIO's link tree for one world size, named so that DLIO's rank r reads, step by step,
    the files feedbench's rank r reads (``orders[r]``: indices into ``fb_files``): both tools
    then form the same batches from the same files in the same order."""
    names: list[Path | None] = [None] * len(fb_files)
    for rank, order in enumerate(orders):
        for pos, k in zip(dlio_order(len(fb_files), rank, len(orders)), order, strict=True):
            names[pos] = fb_files[k]
    if any(f is None for f in names):
        raise SystemExit("error: the ranks' orders do not cover every file once")
    return link_tree([f for f in names if f is not None], root)


def mpi_launcher(mpi: str, dlio_python: str, world: int, env: dict[str, str]) -> list[str]:
    """Open MPI's mpirun (Debian's openmpi-bin; ``-x`` passes each variable), or MPICH's mpiexec
    from the DLIO venv (the ``mpich`` wheel; it passes the whole environment)."""
    if mpi == "mpich":
        return [str(Path(dlio_python).parent / "mpiexec"), "-n", str(world)]
    cmd = ["mpirun", "--allow-run-as-root", "--bind-to", "none", "-np", str(world)]
    for key in env:
        cmd += ["-x", key]
    return cmd


def dlio_command(
    tool: str, dlio_python: str, world: int, config_dir: Path, out: Path, epochs: int,
    mpi: str = "openmpi",
) -> tuple[list[str], dict[str, str]]:  # fmt: skip
    """DLIO under MPI, as shipped (its console entry, tracer on), or lean (dlio_lean.py: the
    per-sample debug f-strings gone, ``DFTRACER_ENABLE=0``); returns (argv, extra environment)."""
    env = {"PYTHONFAULTHANDLER": "1"}  # a hung run's ranks print their stacks (:func:`timed`)
    if tool != "dlio":
        env["DFTRACER_ENABLE"] = "0"
    entry = [str(Path(dlio_python).parent / "dlio_benchmark")]
    if not Path(entry[0]).is_file():  # no venv (/tmp/dlio-python): what that console entry runs
        entry = [dlio_python, "-c", DLIO_MAIN]
    if tool == "dlio-lean":
        entry = [dlio_python, str(LEAN)]
    hydra = [
        "--config-dir", str(config_dir), f"workload={CONFIG_NAME.format(world=world)}",
        f"++workload.train.epochs={epochs}", f"++workload.output.folder={out}",
        f"hydra.run.dir={out}/hydra",
    ]  # fmt: skip
    return [*mpi_launcher(mpi, dlio_python, world, env), *entry, *hydra], env


def dlio_metrics(out: Path, batch: int) -> dict[str, Any]:
    """DLIO's own summary (AU, samples/s per epoch) and, from its per-rank outputs, the rate
    after the first step (feedbench's steady rate) and the steps taken."""
    summary = json.loads((out / "summary.json").read_text())["metric"]
    au = [x / 100 for x in summary["train_au_percentage"]]
    rate = summary["train_throughput_samples_per_second"]
    steady, steps = [], []
    per_rank = [json.loads(p.read_text()) for p in sorted(out.glob("*_output.json"))]
    for epoch in sorted({k for r in per_rank for k in r if k.isdigit()}, key=int):
        blocks = [(r[epoch]["au"]["block1"], r[epoch]["compute"]["block1"]) for r in per_rank]
        # after step 1 a rank's time is Σ compute / AU (DLIO's AU): its rate, AU × batch / step
        steady.append(sum(a / 100 * len(c[1:]) * batch / sum(c[1:]) for a, c in blocks if c[1:]))
        steps.append(sum(len(c) for _, c in blocks))
    return {"au": au, "samples_per_s": rate, "steady_samples_per_s": steady, "steps": steps,
            "samples": sum(steps) * batch}  # fmt: skip


def feedbench_metrics(result: dict[str, Any]) -> dict[str, Any]:
    """The same quantities from a ``feedbench scan`` results file, one value per repeat: AU
    (mean over consumers) and samples/s (Σ over consumers of samples / wall time)."""
    au, rate, steady, steps, samples = [], [], [], [], 0
    for m in result["measurements"]:
        cons = m["per_consumer"]
        au.append(m["au_mean"])
        rate.append(sum(c["samples"] / c["wall_s"] for c in cons))
        steady.append(m["steady_samples_per_s"])
        steps.append(sum(c["batches"] for c in cons))
        samples += sum(c["samples"] for c in cons)
    return {"au": au, "samples_per_s": rate, "steady_samples_per_s": steady, "steps": steps,
            "samples": samples}  # fmt: skip


def feedbench_command(
    train: Path, world: int, cache: str, epochs: int, out: Path, read_threads: int | None = None
) -> list[str]:
    cmd = [sys.executable, "-m", "feedbench.cli", "scan", str(train), "--workload", WORKLOAD,
           "--accelerator", "h100", "--consumers", str(world), "--passes", cache,
           "--repeat", str(epochs), "--no-plots", "--json", str(out)]  # fmt: skip
    if read_threads is not None:  # DLIO's read threads are loader workers, as in the table
        cmd += ["--workers", str(read_threads)]
    return cmd + (["--drop-caches"] if cache == "cold" else [])


class Hung(RuntimeError):
    """A run that outlived its time: its processes' Python stacks are in its log."""


def timed(
    cmd: list[str], env: dict[str, str], cwd: Path, log_path: Path, timeout_s: float = 3600
) -> dict[str, Any]:
    """Run ``cmd``; its wall time, the load average around it, the CPU seconds its processes
    used and other processes' CPU use (cores). A run still going after ``timeout_s`` is
    :class:`Hung`: every Python process in it is sent SIGABRT first, on which faulthandler
    (``PYTHONFAULTHANDLER=1``) writes each thread's stack into the log, then all are killed."""
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    full = {**os.environ, "PYTHONFAULTHANDLER": "1", **env}
    with CpuMeter() as meter, open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=full, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            dumped = _dump_and_kill(proc)
            raise Hung(f"{cmd[0]} still running after {timeout_s:.0f} s; stacks of {dumped} "
                       f"Python processes in {log_path}") from None  # fmt: skip
    if proc.returncode != 0:
        tail = log_path.read_text()[-800:]
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}), {log_path}:\n{tail}")
    return {
        "wall_s": time.perf_counter() - t0,
        "loadavg_before": load0[0],
        "loadavg_after": os.getloadavg()[0],
        "other_cores": meter.other_cores,
        "own_cpu_s": meter.own_cpu_s,
    }


def _dump_and_kill(proc: subprocess.Popen, settle_s: float = 3.0) -> int:
    """Every Python process of ``proc``'s tree writes its stacks (SIGABRT: faulthandler), then
    the session is killed; returns how many wrote. All are stopped first, so the stacks are
    those of the hang (a parent waiting on a child does not move on when the child goes), then
    resumed one at a time, so that the stacks in the shared log do not interleave."""
    import signal

    import psutil

    pythons = []
    with contextlib.suppress(psutil.Error):
        top = psutil.Process(proc.pid)
        for p in [top, *top.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                if "python" in p.name().lower():
                    p.suspend()
                    pythons.append(p)
    for p in pythons:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGABRT)
            p.resume()
            psutil.wait_procs([p], timeout=settle_s)  # it writes its stacks, then exits
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return len(pythons)


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One tool at one world size and cache state: mean ± std over its runs of the per-run means."""

    def per_run(key: str) -> list[float | None]:
        return [mean(r[key]) for r in runs]

    return {k: spread(per_run(k)) for k in ("au", "samples_per_s", "steady_samples_per_s")}


def cpu_per_sample(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """CPU seconds per sample of each tool's processes, per cache state and world size. ``all_in``:
    a run's CPU / its samples, start-up (imports, process starts) included; ``marginal``: between
    runs of fewer and more epochs, paired repeat by repeat, (CPU_more − CPU_fewer) / (samples_more
    − samples_fewer): the work per sample alone, start-up cancelled. Unlike AU and samples/s,
    CPU time hardly moves with other load, and on saturated cores it sets the rate. Not quite
    alike: feedbench's further epochs are further repeats, each forking its consumers and
    workers again, where DLIO's workers persist across epochs; feedbench's marginal figure
    carries that, an upper bound on its work per sample."""
    out = []
    for state, world, tool in sorted({(r["cache"], r["world"], r["tool"]) for r in runs
                                      if r.get("own_cpu_s") and r.get("samples")}):  # fmt: skip
        group = [r for r in runs_of(runs, state, world, tool) if r.get("own_cpu_s")]
        by_epochs = sorted({r["epochs"] for r in group})
        row: dict[str, Any] = {"cache": state, "world": world, "tool": tool}
        row["all_in"] = {e: spread([r["own_cpu_s"] / r["samples"] for r in group
                                    if r["epochs"] == e]) for e in by_epochs}  # fmt: skip
        if len(by_epochs) > 1:
            lo = by_repeat([r for r in group if r["epochs"] == by_epochs[0]])
            hi = by_repeat([r for r in group if r["epochs"] == by_epochs[-1]])
            row["marginal"] = spread([
                (hi[k]["own_cpu_s"] - lo[k]["own_cpu_s"]) / (hi[k]["samples"] - lo[k]["samples"])
                for k in sorted(lo.keys() & hi.keys())
            ])  # fmt: skip
        out.append(row)
    return out


def mean(values: list[float]) -> float | None:
    return spread(values)["mean"]


def runs_of(
    runs: list[dict[str, Any]], state: str, world: int, tool: str | None = None
) -> list[dict[str, Any]]:
    """The measured runs (not hung) of one cache state and world size (and tool, unless None)."""
    return [r for r in runs if (r["cache"], r["world"]) == (state, world)
            and tool in (None, r["tool"]) and not r.get("hung")]  # fmt: skip


def aligned_runs(runs: list[dict[str, Any]], state: str, world: int, tool: str) -> list[dict]:
    """The runs AU and samples/s are compared on: those of the fewest epochs (one, unless asked
    otherwise), where both tools read the same files in the same order."""
    fewest = min((r.get("epochs", 1) for r in runs_of(runs, state, world)), default=1)
    return [r for r in runs_of(runs, state, world, tool) if r.get("epochs", 1) == fewest]


def by_repeat(runs: list[dict[str, Any]]) -> dict[tuple[int, int], dict[str, Any]]:
    """Runs keyed by (batch, repeat): what pairs one tool's run with another's."""
    return {(r.get("batch", 0), r["repeat"]): r for r in runs}


def _pm(s: dict[str, Any], digits: int) -> str:
    if not s or s.get("mean") is None:
        return "–"
    return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"


def _loads(runs: list[dict[str, Any]]) -> str:
    """The load average before → after each run, and the most CPU other processes took."""
    pairs = ", ".join(f"{r['loadavg_before']:.1f}→{r['loadavg_after']:.1f}" for r in runs)
    other = max((r["other_cores"] or 0.0) for r in runs)
    return f"{pairs} ({other:.2f})"


def render(res: dict[str, Any]) -> str:
    """The results as Markdown: one row per cache state, ranks and tool, then feedbench ÷ DLIO."""
    lines = [
        "| cache | ranks | tool | AU | samples/s | samples/s after step 1 | runs "
        "| load avg before→after (other cores, max) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ratios = []
    for row in res.get("comparisons", []):
        for tool, s in row["tools"].items():
            runs = aligned_runs(res["runs"], row["cache"], row["world"], tool)
            lines.append(
                f"| {row['cache']} | {row['world']} | {tool} | {_pm(s['au'], 3)} "
                f"| {_pm(s['samples_per_s'], 2)} | {_pm(s['steady_samples_per_s'], 2)} "
                f"| {len(runs)} | {_loads(runs)} |"
            )
        for ref in ("dlio", "dlio-lean"):
            vs = row.get(f"feedbench_vs_{ref}")
            if vs:
                ratios.append(
                    f"| {row['cache']} | {row['world']} | {ref} | {_pm(vs['au'], 3)} "
                    f"| {_pm(vs['samples_per_s'], 3)} |"
                )
    head = [
        "",
        "feedbench ÷ DLIO, paired repeat by repeat (mean ± std of the ratios):",
        "",
        "| cache | ranks | DLIO | AU ratio | samples/s ratio |",
        "|---|---|---|---|---|",
    ]
    hung = [f"- {r['cache']}, {r['world']} rank(s), repeat {r['repeat']}, {r['tool']}: {r['hung']}"
            for r in res.get("runs", []) if r.get("hung")]  # fmt: skip
    if hung:
        hung = ["", "Runs that hung (left out of every figure above):", "", *hung]
    tables = lines + (head + ratios if ratios else []) + _cpu_lines(res)
    return "\n".join(tables + hung) + "\n"


def _cpu_lines(res: dict[str, Any]) -> list[str]:
    """The CPU-per-sample table (:func:`cpu_per_sample`), when the runs measured it."""
    rows = res.get("cpu_per_sample") or []
    if not rows:
        return []
    lines = ["", "CPU seconds per sample of each tool's processes (mean ± std over repeats):", "",
             "| cache | ranks | tool | all-in, by epochs per run | marginal (start-up cancelled) |",
             "|---|---|---|---|---|"]  # fmt: skip
    for row in rows:
        all_in = ", ".join(f"{e}: {_pm(s, 4)}" for e, s in row["all_in"].items())
        lines.append(f"| {row['cache']} | {row['world']} | {row['tool']} | {all_in} "
                     f"| {_pm(row.get('marginal') or {}, 4)} |")  # fmt: skip
    return lines


def per_sample_cpu(files: list[Path], repeats: int) -> dict[str, Any]:
    """CPU seconds per sample (warm cache, this process, interleaved) of DLIO's npz read,
    ``np.load(path)["x"]`` (its NPZReader.open), and of feedbench's read and decode of the same
    file: the work per sample, which other processes' load hardly changes (CPU time, not wall)."""
    import resource

    import numpy as np

    from loaders.data.records import decode, read_range

    def cpu_s() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def dlio_read(p: Path) -> None:
        np.load(p, allow_pickle=True)["x"]

    def feedbench_read(p: Path) -> None:
        data, _ = read_range(str(p), 0, p.stat().st_size)
        decode("npz", data, p.name)

    out: dict[str, list[float]] = {"dlio": [], "feedbench": []}
    for _ in range(repeats):
        for name, fn in (("dlio", dlio_read), ("feedbench", feedbench_read)):
            t0 = cpu_s()
            for p in files:
                fn(p)
            out[name].append((cpu_s() - t0) / len(files))
    res = {k: spread(v) for k, v in out.items()}
    res["ratio_paired"] = paired(out["feedbench"], out["dlio"])
    res["files"], res["bytes"] = len(files), sum(p.stat().st_size for p in files)
    return res
