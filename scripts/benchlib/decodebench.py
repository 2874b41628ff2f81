"""Decode, warm cache: plain-Python decoding vs ``feedbench scan --stages decode`` at 1…N consumers.

One feedbench invocation per (repeat, count), interleaved, so that other load on the machine is
metered per point and a slow patch spreads over every count instead of sinking one. Unless
``--no-parallel-reference``, each feedbench run is followed by N plain-Python decoders run at once
(``plain_parallel_decode``), process k decoding the files feedbench's consumer k decodes: what the
host allows N independent decoders, so feedbench(N) / plain-parallel(N) separates feedbench's own
scaling from the host's (shared cores, all-core clocks).
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from feedbench.core.stats import spread

from .common import FEEDBENCH_BATCH, GOAL, log, paired, ratio
from .data import open_layout, rank_files, warm
from .runner import BenchEnv, Runner, run_feedbench, series, worst


def plain_decode(files: list[str]) -> dict[str, Any]:
    """Images per second: read the bytes, PIL open + convert("RGB"), one process."""
    from PIL import Image

    t0 = time.perf_counter()
    for p in files:
        with open(p, "rb") as f:
            data = f.read()
        with Image.open(io.BytesIO(data)) as im:
            im.convert("RGB")
    dt = time.perf_counter() - t0
    return {"img_per_s": len(files) / dt, "wall_s": dt}


def _plain_decoder(
    files: list[str], batch: int, barrier, results, rank: int
) -> None:  # pragma: no cover - runs in a spawned process
    """One of N independent plain-Python decoders: the plain loop over its own share.

    Pillow is imported and the file list unpickled before the start barrier, as feedbench's
    consumers open their source before theirs; the rate is feedbench's steady rate: images after
    the first ``batch`` over the time after them (``feedbench.scan.consumer.run_consumer`` with
    ``warmup_batches=1``).
    """
    from PIL import Image

    barrier.wait()
    t_start = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
    t_first_end = t_start if batch <= 0 else None
    for i, p in enumerate(files, 1):
        with open(p, "rb") as f:
            data = f.read()
        with Image.open(io.BytesIO(data)) as im:
            im.convert("RGB")
        if i == batch:
            t_first_end = time.perf_counter()
    t_end = time.perf_counter()
    steady = None
    if t_first_end is not None and len(files) > batch and t_end > t_first_end:
        steady = (len(files) - max(batch, 0)) / (t_end - t_first_end)
    results.put((rank, len(files), t_start, t_first_end, t_end, steady))


def plain_parallel_decode(shares: list[list[str]], batch: int) -> dict[str, Any]:
    """N plain-Python decoders at once, one spawned process per share, released by one barrier.

    ``img_per_s`` is the sum of the per-process steady rates (each over its own window after its
    first batch), which is how feedbench sums its consumers' steady rates
    (``feedbench.scan.merge.build_measurement``); ``makespan_img_per_s`` = all images / (barrier
    to the last finisher) is kept beside it.
    """
    got = _run_decoders(shares, batch)
    images = sum(g[1] for g in got)
    t0 = min(g[2] for g in got)
    t1 = max(g[4] for g in got)
    steady = [g[5] for g in got]
    have_steady = all(x is not None for x in steady)
    makespan = images / (t1 - t0) if t1 > t0 else None
    return {
        "img_per_s": float(sum(steady)) if have_steady else makespan,
        "rate_basis": "steady" if have_steady else "makespan",
        "makespan_img_per_s": makespan,
        "wall_s": t1 - t0,
        "per_process_img_per_s": steady,
        "start_spread_s": max(g[2] for g in got) - t0,
        "images": images,
    }


def _run_decoders(shares: list[list[str]], batch: int) -> list[tuple]:
    """Start one ``_plain_decoder`` per share; their reports, sorted by rank."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # fresh interpreters, like feedbench's consumer processes
    barrier = ctx.Barrier(len(shares))
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_plain_decoder, args=(share, batch, barrier, results, k), daemon=True)
        for k, share in enumerate(shares)
    ]
    for proc in procs:
        proc.start()
    got = []
    try:
        for _ in procs:
            got.append(results.get(timeout=3600))
    except Exception as e:  # queue.Empty: a decoder died
        raise RuntimeError(f"a plain-Python decoder failed: {e!r}") from e
    finally:
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.terminate()
                proc.join()
    bad = [proc.exitcode for proc in procs if proc.exitcode]
    if bad:
        raise RuntimeError(f"plain-Python decoders exited with {bad}")
    return sorted(got)


def counts_up_to(cores: int) -> list[int]:
    counts, n = [], 1
    while n < cores:
        counts.append(n)
        n *= 2
    return [*counts, cores]


def decode_counts(consumers: str | None, cores: int) -> list[int]:
    """``--consumers`` (e.g. "1,2,4") or 1, 2, 4, …, cores; always with 1 (the efficiency base)."""
    counts = [int(x) for x in consumers.split(",")] if consumers else counts_up_to(cores)
    return counts if 1 in counts else [1, *counts]


@dataclass
class DecodeRuns:
    """Every decode run: the plain loop's, and per consumer count feedbench's and plain ×N's."""

    images: Path
    files: list[str]  # sorted: the plain loop's order
    counts: list[int]
    shares: dict[int, list[list[str]]] | None  # N → consumer k's files; None: no plain ×N
    plain: list[dict[str, Any]] = field(default_factory=list)
    feedbench: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    parallel: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    command: str = ""  # the last feedbench command

    def __post_init__(self) -> None:
        self.feedbench = {n: [] for n in self.counts}
        self.parallel = {n: [] for n in self.counts}


def decode_section(env: BenchEnv, images: Path) -> dict[str, Any]:
    """Plain-Python decode vs feedbench --stages decode --workers 0 at 1, 2, 4, … N consumers."""
    source = open_layout(images, "tree")
    files = sorted(str(f) for f in source.files())
    resident = warm(files)
    args, cores = env.args, env.cores
    counts = decode_counts(args.consumers, cores)
    parallel = not args.no_parallel_reference
    shares = {n: [rank_files(source, k, n) for k in range(n)] for n in counts} if parallel else None
    also = " and N plain-Python decoders at once" if parallel else ""
    log(f"  decode: {len(files)} files; plain Python, then feedbench with {counts} consumers{also}")
    plain_decode(files)  # warm-up: page cache, Pillow's plugins, the allocator
    runs = DecodeRuns(images, files, counts, shares)
    for r in range(1, args.decode_repeat + 1):
        _decode_repeat(runs, env.runner, env.runs_dir, r)
    plain = series(runs.plain, "img_per_s")
    one_rate = spread([x["img_per_s"] for x in runs.feedbench[1]])["mean"]
    curve = _curve(runs, one_rate, plain["img_per_s"]["mean"])
    within = [c for c in curve if 1 < c["consumers"] <= cores and c["efficiency"] is not None]
    return {
        "files": len(files),
        "resident_before": resident,
        "command": runs.command.replace("--consumers " + str(counts[-1]), "--consumers N"),
        "counts": counts,
        "plain_python": plain,
        "feedbench": curve,
        "ratio_feedbench1_to_plain": one_rate / plain["img_per_s"]["mean"] if one_rate else None,
        "min_efficiency_up_to_cores": min((c["efficiency"] for c in within), default=None),
        "goal_met": bool(within) and all(c["efficiency"] >= GOAL for c in within),
        "plain_parallel": (
            _reference(curve, cores) if parallel else {"skipped": "--no-parallel-reference"}
        ),
    }


def _decode_repeat(runs: DecodeRuns, runner: Runner, runs_dir: Path, r: int) -> None:
    """Repeat ``r``: the plain loop, then per count feedbench and (if asked) plain ×N."""
    runs.plain.append(runner.run(lambda: plain_decode(runs.files)))
    log(f"    repeat {r}: plain Python {runs.plain[-1]['img_per_s']:.1f} img/s")
    for n in runs.counts:
        target = runs_dir / f"feedbench-decode-c{n}-{r}.json"

        def one(target: Path = target, n: int = n) -> dict[str, Any]:
            run, runs.command = _feedbench_decode(runs.images, target, n)
            return run

        fb = runner.run(one)
        runs.feedbench[n].append(fb)
        log(f"    repeat {r}: feedbench {n} consumers {fb['img_per_s']:.1f} img/s")
        if runs.shares is not None:
            shares = runs.shares[n]
            run = runner.run(lambda shares=shares: plain_parallel_decode(shares, FEEDBENCH_BATCH))
            runs.parallel[n].append(run)
            log(f"    repeat {r}: plain Python x{n} at once {run['img_per_s']:.1f} img/s")


def _feedbench_decode(images: Path, target: Path, n: int) -> tuple[dict[str, Any], str]:
    """``feedbench scan --stages decode --passes warm`` with N consumers: (the run, the command)."""
    opts = {"stages": "decode", "consumers": n, "workers": 0, "passes": "warm"}
    res, command = run_feedbench(images, "tree", target, **opts)
    m = res["measurements"][0]
    steady = m["steady_samples_per_s"]
    run = {
        "img_per_s": steady if steady is not None else m["samples_per_s"],
        "rate_basis": "steady" if steady is not None else "pass",
        "pass_img_per_s": m["samples_per_s"],
        "samples": m["samples"],
        "wall_s": m["wall_s"],
        "resident_before": m["cache"]["resident_before"],
    }
    return run, command


def _curve(runs: DecodeRuns, one_rate: float | None, plain_rate: float) -> list[dict[str, Any]]:
    """One point per consumer count: feedbench's rate and efficiency, beside plain ×N if run."""
    par_one = None
    if runs.shares is not None:
        par_one = spread([x["img_per_s"] for x in runs.parallel[1]])["mean"]
    curve = []
    for n in runs.counts:
        fb = runs.feedbench[n]
        s = spread([x["img_per_s"] for x in fb])
        point: dict[str, Any] = {
            "consumers": n,
            "img_per_s": s,
            "per_consumer": s["mean"] / n,
            "efficiency": s["mean"] / (n * one_rate) if one_rate else None,
            "other_cores_max": worst(fb),
            "runs": fb,
        }
        if runs.shares is not None:
            point |= _vs_parallel(point, runs.parallel[n], par_one, plain_rate)
        curve.append(point)
    return curve


def _vs_parallel(
    point: dict[str, Any], par: list[dict[str, Any]], par_one: float | None, plain_rate: float
) -> dict[str, Any]:
    """Plain ×N at one point, and feedbench's rate and efficiency relative to it."""
    n, s = point["consumers"], point["img_per_s"]
    ps = spread([x["img_per_s"] for x in par])
    eff = ps["mean"] / (n * par_one) if par_one else None
    fe = point["efficiency"]
    return {
        "plain_parallel": {
            "img_per_s": ps,
            "makespan_img_per_s": spread([x["makespan_img_per_s"] for x in par]),
            "efficiency": eff,  # vs plain-parallel(1): the same method with one process
            "efficiency_vs_plain_loop": ps["mean"] / (n * plain_rate),
            "other_cores_max": worst(par),
            "runs": par,
        },
        "ratio_to_plain_parallel": ratio(s, ps),
        "ratio_to_plain_parallel_paired": paired(
            [x["img_per_s"] for x in point["runs"]], [x["img_per_s"] for x in par]
        ),
        # feedbench's efficiency / the host's: 1 = feedbench scales exactly as the host allows
        "relative_efficiency": fe / eff if fe is not None and eff else None,
    }


def _reference(curve: list[dict[str, Any]], cores: int) -> dict[str, Any]:
    """How plain ×N was run, and the lowest feedbench / plain ×N for N ≤ cores against the goal."""
    vs_par = [
        c for c in curve if c["consumers"] <= cores and c.get("ratio_to_plain_parallel") is not None
    ]
    low = min(vs_par, key=lambda c: c["ratio_to_plain_parallel"], default=None)
    return {
        "processes": "one spawned process per share, released together by a barrier",
        "shares": "process k of N decodes the files of feedbench's consumer k of N (warm pass)",
        "rate": (
            "sum of per-process steady rates: images after the first "
            f"{FEEDBENCH_BATCH} over the time after them (feedbench's steady rate, summed "
            "over consumers); makespan_img_per_s = all images / barrier to last finisher"
        ),
        "batch": FEEDBENCH_BATCH,
        "efficiency_basis": "plain-parallel(1)",
        "min_ratio_feedbench_to_plain_parallel": low["ratio_to_plain_parallel"] if low else None,
        "min_ratio_at_consumers": low["consumers"] if low else None,
        "goal_met": bool(vs_par) and all(c["ratio_to_plain_parallel"] >= GOAL for c in vs_par),
    }
