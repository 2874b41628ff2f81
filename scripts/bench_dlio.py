#!/usr/bin/env python3
"""feedbench against DLIO (MLPerf Storage's benchmark) on the same unet3d-shaped npz files.

Both tools read the very same files (symlinks to the npz files of ``--data``, e.g.
``feedbench sample DIR --workload unet3d``): feedbench ``WORK/dataset/train``, DLIO
``WORK/dlio-npN/train/img_K_of_M.npz`` (its layout), one tree per world size N, named so that
DLIO's rank r reads, step by step, the files feedbench's rank r reads (DLIO's torch sampler
takes a contiguous block per rank shuffled with seed 123, feedbench DistributedSampler's
interleaved permutation: with a few steps per epoch, AU depends on which batch is the largest,
so unaligned orders measure different epochs). Both take batch 7, 4 read threads and 0.323 s
per batch from feedbench's workload table (DLIO's ``unet3d_h100.yaml``; the script writes DLIO's
workload config from it); ``--read-threads`` sets both tools' threads where the cores are few.
For each cache state, world size (1 and 2 processes) and repeat, the runs are interleaved:

* ``dlio``: DLIO as shipped, ``mpirun -np N dlio_benchmark ...`` (its tracer on, its debug
  formatting per sample);
* ``dlio-lean``: the same with ``DFTRACER_ENABLE=0`` and ``benchlib/dlio_lean.py`` (DLIO's
  per-sample debug f-strings removed; its docstring says exactly what changes);
* ``feedbench``: ``feedbench scan WORK/dataset/train --workload unet3d --accelerator h100
  --consumers N``.

AU leaves out only the first step, so a start-up transient that reaches into the second step
weighs 1 / (steps − 1): with few steps per rank it decides the comparison. ``--copies K``
(warm runs) links every file K times, for K times the steps from the same page cache.

Cache: ``cold`` = one epoch (one pass) after every file was evicted and, as root,
``sync; echo 3 > /proc/sys/vm/drop_caches`` (feedbench also gets ``--drop-caches``);
``warm`` = ``--epochs`` epochs (default 1: after that DLIO and feedbench reshuffle differently)
after every file was read once; ``--epochs 1,3`` runs both counts, interleaved, and gives each
tool's CPU seconds per sample with start-up cancelled (AU and samples/s from the 1-epoch runs).
AU and samples/s are DLIO's definitions (``benchlib/dlio.py``); the load average before and
after every run and the CPU other processes used during it are kept, so a disturbed run can be
spotted. A run still going after ``--run-timeout`` seconds is hung: each of its Python
processes writes its stacks into the run's ``log.txt`` (faulthandler, on SIGABRT), it is
killed, recorded as hung and left out of the figures, and the next run starts. ``--cpu-check
N`` instead compares the CPU time per sample of DLIO's npz read and feedbench's read + decode
on N files (load-insensitive).

Results: ``--out`` (JSON, rewritten after every run) and a Markdown table beside it (``.md``).
``--pool A.json B.json --out P.json`` pools the results of separate calls (batches, e.g. one
per device call) into one, each run paired within its own batch.
``--write-config`` writes the link trees and DLIO's configs and exits (no DLIO needed).
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
from datetime import datetime, timezone
from itertools import product
from pathlib import Path
from typing import Any

from benchlib import dlio
from benchlib.common import log, paired, save
from benchlib.data import warm
from benchlib.machine import machine, wait_quiet

from feedbench.core.workloads import get_row


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, help="folder holding the npz files (required)")
    p.add_argument("--work", type=Path, help="link tree, configs, runs' outputs (required)")
    p.add_argument("--out", type=Path, help="results JSON (default WORK/dlio-vs-feedbench.json)")
    p.add_argument("--dlio-python", default="/work/dlio-venv/bin/python",
                   help="the Python of the venv DLIO is installed in")  # fmt: skip
    p.add_argument("--mpi", choices=("openmpi", "mpich"), default="openmpi",
                   help="openmpi: Debian's mpirun; mpich: the venv's mpiexec")  # fmt: skip
    p.add_argument("--consumers", default="1,2", help="world sizes (mpirun -np, --consumers)")
    p.add_argument("--caches", default="cold,warm", help="cold, warm or both")
    p.add_argument("--repeat", type=int, default=3, help="interleaved repeats of every run")
    p.add_argument("--epochs", default="1",
                   help="epochs per warm run (1: aligned); two counts: CPU/sample")  # fmt: skip
    p.add_argument("--files", type=int, help="use at most this many files")
    p.add_argument("--copies", type=int, default=1,
                   help="warm only: link every file K times (K× the steps per run)")  # fmt: skip
    p.add_argument("--read-threads", type=int,
                   help="both tools' read threads (default: the workload's, 4)")  # fmt: skip
    p.add_argument("--tools", default=",".join(dlio.TOOLS), help="dlio, dlio-lean, feedbench")
    p.add_argument("--quiet-load", type=float, default=0.3,
                   help="wait before a run until other load is below this (cores)")  # fmt: skip
    p.add_argument("--quiet-wait", type=float, default=120.0, help="but at most this long (s)")
    p.add_argument("--cpu-check", type=int, metavar="N",
                   help="only: CPU per sample of both readers, N files, warm")  # fmt: skip
    p.add_argument("--run-timeout", type=float, default=3600,
                   help="seconds until a run is hung: stacks logged, run left out")  # fmt: skip
    p.add_argument("--render", action="store_true", help="print --out's Markdown table and exit")
    p.add_argument("--pool", type=Path, nargs="+", metavar="JSON",
                   help="only: pool these results files (batches) into --out")  # fmt: skip
    p.add_argument("--write-config", action="store_true", help="write the tree and config only")
    args = p.parse_args(argv)
    args.consumers = [int(x) for x in args.consumers.split(",")]
    args.caches = args.caches.split(",")
    args.tools = args.tools.split(",")
    args.epochs = sorted({int(x) for x in args.epochs.split(",")})
    bad = [t for t in args.tools if t not in dlio.TOOLS] + [
        c for c in args.caches if c not in ("cold", "warm")
    ]
    counts = {"--repeat": args.repeat, "--epochs": min(args.epochs),
              "--consumers": min(args.consumers), "--copies": args.copies,
              "--read-threads": 1 if args.read_threads is None else args.read_threads}  # fmt: skip
    if bad:
        p.error(f"bad value {bad[0]}")
    if args.pool:
        missing = [str(f) for f in args.pool if not f.is_file()]
        if missing or not args.out:
            p.error(f"no such results file: {missing[0]}" if missing else "--pool needs --out")
        return args
    if args.data is None or args.work is None:
        p.error("--data and --work are required (unless --pool)")
    for flag, value in counts.items():
        if value < 1:
            p.error(f"{flag} must be at least 1, not {value}")
    if len(args.epochs) > 1 and "cold" in args.caches:
        p.error("several --epochs counts are for warm runs (a cold run is one epoch)")
    if args.copies > 1 and "cold" in args.caches:
        p.error("--copies is for warm runs (a cold run would read every copy after the first warm)")
    args.out = args.out or args.work / "dlio-vs-feedbench.json"
    return args


def prepare(args: argparse.Namespace) -> tuple[Path, Path, list[Path]]:
    """feedbench's link tree (the files in name order), and per world size DLIO's tree in its
    layout, aligned to feedbench's order, and its config; returns (feedbench's folder, config
    folder, files)."""
    from feedbench.scan.consumer import consumer_units  # torch: not for --pool or bad flags
    from feedbench.scan.sources import detect

    files = sorted(args.data.rglob("*.npz"))
    batch = get_row(dlio.WORKLOAD).batch_size
    files = dlio.files_to_use(files, batch, max(args.consumers), args.files) * args.copies
    train = dlio.link_tree(files, args.work / "dataset")
    source, _ = detect(str(train), "npz")
    links = [Path(p) for p in source.files()]
    config_dir = args.work / "dlio-config"
    for world in args.consumers:
        orders = [[int(i) for i in consumer_units(source, r, world, seed=0, epoch=0)]
                  for r in range(world)]  # fmt: skip
        root = args.work / f"dlio-np{world}"
        dlio.aligned_tree(links, orders, root)
        config_dir = dlio.write_config(args.work, root, len(files), world, args.read_threads)
    return train, config_dir, files


def set_cache(state: str, files: list[Path]) -> dict[str, Any]:
    """Cold: every file evicted (fadvise) and, as root, the kernel's caches dropped; warm: every
    file read once. Returns how, and the fraction of the files resident afterwards."""
    from feedbench.scan import cache

    paths = [str(f) for f in files]
    if state == "cold":
        cache.evict(paths)
        how = "evict+drop_caches" if cache.drop_all_caches() else "evict"
        return {"cache_prepared": how, "resident_before": cache.residency(paths).fraction}
    return {"cache_prepared": "read once", "resident_before": warm(paths)}


def one_run(
    args, tool: str, world: int, state: str, rep: int, epochs: int, env: dict
) -> dict[str, Any]:
    """One tool, one world size, one cache state, one epoch count: run it, read its metrics."""
    run_dir = args.work / "runs" / f"{state}-np{world}-e{epochs}-r{rep}-{tool}"
    run_dir.mkdir(parents=True, exist_ok=True)
    batch = get_row(dlio.WORKLOAD).batch_size
    waited_s, load = wait_quiet(args.quiet_load, args.quiet_wait)
    prepared = set_cache(state, env["files"])
    if tool == "feedbench":
        out = run_dir / "feedbench.json"
        cmd = dlio.feedbench_command(env["train"], world, state, epochs, out, args.read_threads)
        extra: dict[str, str] = {}
    else:
        cmd, extra = dlio.dlio_command(tool, args.dlio_python, world, env["config_dir"],
                                       run_dir, epochs, args.mpi)  # fmt: skip
    run = {"tool": tool, "world": world, "cache": state, "repeat": rep, "epochs": epochs}
    try:
        meta = dlio.timed(cmd, extra, run_dir, run_dir / "log.txt", args.run_timeout)
    except dlio.Hung as e:
        log(f"  hung: {e}")
        return run | {"hung": str(e), "command": shlex.join(cmd)}
    if tool == "feedbench":
        metrics = dlio.feedbench_metrics(json.loads((run_dir / "feedbench.json").read_text()))
    else:
        metrics = dlio.dlio_metrics(run_dir, batch)
    shown = " ".join(f"{k}={v}" for k, v in extra.items())
    command = (shown + " " if shown else "") + shlex.join(cmd)
    return run | {**prepared, "waited_s": waited_s, "other_cores_at_start": load,
                  "command": command, **meta, **metrics}  # fmt: skip


def comparisons(runs: list[dict[str, Any]], tools: list[str]) -> list[dict[str, Any]]:
    """Per cache state and world size: each tool's summary and feedbench ÷ each DLIO, paired
    repeat by repeat (interleaved runs: drift hits both sides of a pair; pooled runs are paired
    within their batch)."""
    out = []
    for state, world in sorted({(r["cache"], r["world"]) for r in runs}):
        group = {t: dlio.aligned_runs(runs, state, world, t) for t in tools}
        row: dict[str, Any] = {"cache": state, "world": world}
        row["tools"] = {t: dlio.summarise(rs) for t, rs in group.items() if rs}
        fb = dlio.by_repeat(group.get("feedbench") or [])
        for ref in ("dlio", "dlio-lean"):
            other = dlio.by_repeat(group.get(ref) or [])
            both = sorted(fb.keys() & other.keys())  # a hung or killed run leaves its pair out
            if both:
                row[f"feedbench_vs_{ref}"] = {
                    k: paired(
                        [dlio.mean(fb[i][k]) for i in both], [dlio.mean(other[i][k]) for i in both]
                    )
                    for k in ("au", "samples_per_s")
                }
        out.append(row)
    return out


def pooled(paths: list[Path], tools: list[str]) -> dict[str, Any]:
    """Several results files (batches of the same runs, e.g. one per device call) as one: every
    run keeps its batch (the file's position), pairs stay within a batch."""
    batches = []
    for p in paths:
        try:
            batches.append(json.loads(p.read_text()))
            batches[-1]["runs"][0]["tool"]  # noqa: B018 - a results file has runs with a tool
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise SystemExit(f"bench_dlio: {p} is not a bench_dlio results file ({e!r})") from None
    runs = [r | {"batch": k} for k, res in enumerate(batches, 1) for r in res["runs"]]
    seen = [t for t in dlio.TOOLS if any(r["tool"] == t for r in runs)]
    return {
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "pooled_from": [
            {"file": str(p), "command": b.get("command"), "created_utc": b.get("created_utc")}
            for p, b in zip(paths, batches, strict=True)
        ],
        "machine": batches[0].get("machine"),
        "runs": runs,
        "comparisons": comparisons(runs, [t for t in tools if t in seen]),
        "cpu_per_sample": dlio.cpu_per_sample(runs),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.pool:
        res = pooled(args.pool, args.tools)
        save(res, args.out)
        args.out.with_suffix(".md").write_text(dlio.render(res))
        log(f"{len(args.pool)} results pooled: {args.out}")
        return 0
    train, config_dir, files = prepare(args)
    log(f"{len(files)} files linked under {train}; DLIO config in {config_dir}")
    if args.write_config:
        return 0
    if args.cpu_check:
        picked = files[: args.cpu_check]
        warm([str(f) for f in picked])
        print(json.dumps(dlio.per_sample_cpu(picked, args.repeat), indent=2))
        return 0
    if args.render:
        print(dlio.render(json.loads(args.out.read_text())), end="")
        return 0
    env = {"train": train, "config_dir": config_dir, "files": files}
    res: dict[str, Any] = {
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python3", "scripts/bench_dlio.py", *argv]),
        "machine": machine(str(args.data), None) | {"python_impl": platform.python_version()},
        "files": len(files),  # links: each file --copies times
        "copies": args.copies,
        "bytes": sum(f.stat().st_size for f in files),
        "runs": [],
    }
    for state in args.caches:
        for world in args.consumers:
            for rep in range(1, args.repeat + 1):
                for epochs, tool in product(args.epochs if state == "warm" else [1], args.tools):
                    log(f"{state} np={world} repeat {rep}, {epochs} epoch(s): {tool}")
                    res["runs"].append(one_run(args, tool, world, state, rep, epochs, env))
                    res["comparisons"] = comparisons(res["runs"], args.tools)
                    res["cpu_per_sample"] = dlio.cpu_per_sample(res["runs"])
                    save(res, args.out)
                    args.out.with_suffix(".md").write_text(dlio.render(res))
    log(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
