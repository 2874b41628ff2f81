"""Cold reads of one layout: fio and plain references vs ``feedbench scan --stages read``.

One job: fio, feedbench ``--workers 0`` and ``1``, Python ``read()``, Python ``readinto``, cat,
interleaved per repeat so that a drift of the storage hits every tool alike. N jobs: fio job k
reads exactly what feedbench's consumer k of N reads, through a directory of hard links.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from feedbench.core.stats import spread

from .common import log, paired, ratio
from .data import fingerprint, open_layout, rank_files
from .readrefs import run_cat, run_fio, run_python_read, run_python_readinto
from .runner import BenchEnv, run_feedbench, series

ONE_JOB = ("fio", "feedbench_w0", "feedbench_w1", "python_read", "python_readinto", "cat")
PLAIN_REFS = ("python_read", "python_readinto", "cat")


@dataclass
class Layout:
    """One layout's files as feedbench lists them, and their order for one consumer."""

    name: str  # tree or shards: feedbench's --format and fio's block sizes
    path: Path
    source: Any
    files: list[str]
    order: list[str]  # feedbench's order with one consumer: every one-job reference uses it
    nbytes: int

    @classmethod
    def open(cls, name: str, path: Path) -> Layout:
        source = open_layout(path, name)
        files = [str(f) for f in source.files()]
        order = rank_files(source, 0, 1)
        return cls(name, path, source, files, order, source.total_bytes())


def feedbench_read_run(result: dict[str, Any]) -> dict[str, Any]:
    """One run of ``feedbench scan --stages read``, from its results file."""
    m = result["measurements"][0]
    read = next((s for s in m["stages"] if s["name"] == "read"), None)
    return {
        "mb_per_s": m["mb_per_s"],
        "read_stage_mb_per_s": read["mb_per_s"] if read else None,  # bytes / seconds in read()
        "read_stage_busy_s": read["busy_s"] if read else None,
        "wall_s": m["wall_s"],
        "read_bytes": m["read_bytes"],
        "files": m["files"],
        "errors": m["errors"],
        "resident_before": m["cache"]["resident_before"],
    }


def _feedbench_read(
    env: BenchEnv, lay: Layout, consumers: int, workers: int, target: str
) -> tuple[dict[str, Any], str]:
    """``feedbench scan --stages read --passes cold``: (the run, the command)."""
    opts = {"stages": "read", "consumers": consumers, "workers": workers, "passes": "cold"}
    res, command = run_feedbench(lay.path, lay.name, env.runs_dir / target, env.drop, **opts)
    return feedbench_read_run(res), command


def _fio_read(env: BenchEnv, lay: Layout, dirs: list[Path], target: str) -> tuple[dict, str]:
    """One fio run over ``dirs`` (one job each): (the run, the command)."""
    run = run_fio(env.fio, lay.name, dirs, env.runs_dir / target)
    return run, run.pop("command")


def read_layout(env: BenchEnv, name: str, path: Path) -> dict[str, Any]:
    """Both comparisons for one layout: one job (with every reference), then N jobs."""
    lay = Layout.open(name, path)
    before = fingerprint(lay.files)
    section: dict[str, Any] = {
        "path": str(path),
        "files": len(lay.files),
        "bytes": lay.nbytes,
        "repeats": env.args.repeat,
    }
    runs, commands = _one_job_runs(env, lay, _one_job_dirs(env, lay))
    section |= _one_job_summary(runs, commands)
    env.links.remove()
    section["parallel"] = read_parallel(env, lay)
    if fingerprint(lay.files) != before:
        raise SystemExit(f"the data under {path} changed while it was read: stop")
    return section


def _one_job_dirs(env: BenchEnv, lay: Layout) -> list[Path]:
    """Where one fio job reads: the data itself when it holds just the files, else links."""
    if not env.fio:
        return []
    on_disk = sorted(
        os.path.join(r, f) for r, _, fs in os.walk(lay.path) for f in fs if not f.startswith(".")
    )
    if on_disk == sorted(os.path.abspath(f) for f in lay.files):
        return [lay.path]  # fio walks the data itself
    return env.links.make([lay.order])


def _one_job_runs(
    env: BenchEnv, lay: Layout, fio_dirs: list[Path]
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]:
    """Every tool once per repeat, interleaved: (runs per tool, command per tool)."""
    args, run = env.args, env.runner.run
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in ONE_JOB}
    commands: dict[str, str] = {}

    def feedbench(w: int, r: int) -> dict[str, Any]:
        target = f"feedbench-read-{lay.name}-w{w}-{r}.json"
        out, commands[f"feedbench_w{w}"] = _feedbench_read(env, lay, 1, w, target)
        return out

    def fio(r: int) -> dict[str, Any]:
        out, commands["fio"] = _fio_read(env, lay, fio_dirs, f"fio-{lay.name}-1-{r}.json")
        return out

    have_cat = bool(shutil.which("xargs") and shutil.which("cat"))
    for r in range(1, args.repeat + 1):  # interleaved: a drift of the storage hits every tool
        log(f"  read {lay.name}, 1 job, repeat {r}/{args.repeat}")
        if env.fio:
            runs["fio"].append(run(lambda r=r: fio(r), lay.files))
        for w in (0,) if args.lean else (0, 1):
            runs[f"feedbench_w{w}"].append(run(lambda w=w, r=r: feedbench(w, r)))
        if args.lean:
            continue
        runs["python_read"].append(run(lambda: run_python_read(lay.order), lay.files))
        runs["python_readinto"].append(run(lambda: run_python_readinto(lay.order), lay.files))
        if have_cat:
            runs["cat"].append(run(lambda: run_cat(lay.order, lay.nbytes), lay.files))
    return runs, commands


def _one_job_summary(
    runs: dict[str, list[dict[str, Any]]], commands: dict[str, str]
) -> dict[str, Any]:
    """Mean ± std per tool, feedbench's read stage alone, the commands, the ratios."""
    section: dict[str, Any] = {name: series(rs, "mb_per_s") for name, rs in runs.items() if rs}
    fb = section["feedbench_w0"]
    fb["read_stage_mb_per_s"] = spread([x["read_stage_mb_per_s"] for x in fb["runs"]])
    section["commands"] = commands
    if "fio" in section:
        fio = section["fio"]
        section["ratio_feedbench_w0_to_fio"] = ratio(fb["mb_per_s"], fio["mb_per_s"])
        if section.get("feedbench_w1"):
            w1 = section["feedbench_w1"]
            section["ratio_feedbench_w1_to_fio"] = ratio(w1["mb_per_s"], fio["mb_per_s"])
        section["ratio_paired_w0"] = paired(
            [x["mb_per_s"] for x in fb["runs"]], [x["mb_per_s"] for x in fio["runs"]]
        )
    for ref in PLAIN_REFS:
        if section.get(ref):
            section[f"ratio_feedbench_w0_to_{ref}"] = ratio(
                fb["mb_per_s"], section[ref]["mb_per_s"]
            )
    return section


def read_parallel(env: BenchEnv, lay: Layout) -> dict[str, Any]:
    """fio with N jobs (job k = rank k's files) vs feedbench --consumers N --workers 0."""
    n = env.args.jobs or env.cores
    out: dict[str, Any] = {"jobs": n}
    if n < 2:
        return out | {"skipped": "one core: nothing to run in parallel"}
    if lay.name == "shards" and lay.source.units() < n:
        return out | {"skipped": f"{lay.source.units()} shards < {n} consumers"}
    dirs: list[Path] = []
    if env.fio:
        try:
            dirs = env.links.make([rank_files(lay.source, k, n) for k in range(n)])
        except OSError as e:
            out["fio_skipped"] = str(e)
    fio_runs, fb_runs = _parallel_runs(env, lay, n, dirs, out)
    env.links.remove()
    out["feedbench"] = series(fb_runs, "mb_per_s")
    if fio_runs:
        out["fio"] = series(fio_runs, "mb_per_s")
        out["ratio_feedbench_to_fio"] = ratio(out["feedbench"]["mb_per_s"], out["fio"]["mb_per_s"])
        out["ratio_paired"] = paired(
            [x["mb_per_s"] for x in fb_runs], [x["mb_per_s"] for x in fio_runs]
        )
    return out


def _parallel_runs(
    env: BenchEnv, lay: Layout, n: int, dirs: list[Path], out: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """fio (when ``dirs``) and feedbench with N jobs, interleaved; the commands go into ``out``."""

    def fio(r: int) -> dict[str, Any]:
        run, out["fio_command"] = _fio_read(env, lay, dirs, f"fio-{lay.name}-{n}-{r}.json")
        return run

    def feedbench(r: int) -> dict[str, Any]:
        target = f"feedbench-read-{lay.name}-c{n}-{r}.json"
        run, out["feedbench_command"] = _feedbench_read(env, lay, n, 0, target)
        return run

    fio_runs: list[dict[str, Any]] = []
    fb_runs: list[dict[str, Any]] = []
    for r in range(1, env.args.repeat + 1):
        log(f"  read {lay.name}, {n} jobs, repeat {r}/{env.args.repeat}")
        if dirs:
            fio_runs.append(env.runner.run(lambda r=r: fio(r), lay.files))
        fb_runs.append(env.runner.run(lambda r=r: feedbench(r)))
    return fio_runs, fb_runs
