#!/usr/bin/env python3
"""Check ``feedbench scan`` against independent references: fio for reads, plain Python for decode.

READ, cold page cache, both layouts (small-file JPEG tree and tar shards):

* fio, psync engine, buffered, sequential within each file, every file read once, no readahead
  hint (``--fadvise_hint=0``: fio's default ``FADV_SEQUENTIAL`` doubles the kernel's readahead
  and feedbench gives no hint), page cache invalidated (``--invalidate=1``; every file is also
  evicted with ``feedbench.scan.cache.evict`` before each run: fio and feedbench start equally
  cold);
* ``feedbench scan DIR --stages read --consumers 1 --workers 0 --passes cold`` (and ``--workers 1``
  for reference): ``measurements[0].mb_per_s`` (bytes over the consumer's wall time);
* three more references reading the same files in feedbench's order: a plain-Python loop doing
  exactly feedbench's syscalls (open, 1 MiB ``read()`` until EOF, close) without the framework;
  the same bytes read into one reused buffer (``readv``), which is what the fix for the page
  faults of fresh 1 MiB buffers would give; GNU ``cat`` (C, 128 KiB reads) via ``xargs``;
* the same with N jobs / consumers = cores: fio job k reads exactly the files feedbench's rank k
  reads (``feedbench.scan.consumer.consumer_units``), through a directory of hard links per job.

Runs are interleaved (fio, feedbench, references; repeat), so a drift of the storage hits every
tool alike. Before each run the script waits (``--quiet-wait``) for other processes to leave the
CPUs, and meters how many cores they used during the run ("other load"): on a shared VM this is
what makes a bad number explicable.

How fio reads the small-file tree (measured on fio 3.33, 2,000 files of 30-300 KB):
``--opendir=DIR --file_service_type=sequential`` makes one job walk every file once, start to
end. But fio never issues a short I/O at the end of a file: with ``--bs=1M`` (min bs == max bs)
a file smaller than 1 MiB does not fit one block and is skipped, so fio reads 0 bytes. With
``--bsrange=4k-1M`` fio draws a 4 KiB-aligned size up to 1 MiB and redraws until it fits the rest
of the file (``get_next_buflen`` in fio's io_u.c): every file is read in ~3.7 reads on average,
all but its last < 4 KiB (97.9 % of the bytes). ``--bs=4k`` reads the same bytes in ~24 reads per
file (12x feedbench's read calls). ``--bsrange=1-1M --bs_unaligned`` reads every byte but in ~12
random pieces per file and spends its time redrawing sizes (12 MB/s here). A job file with one
section per file would allow ``bs=<file size>``, but fio allows 4096 jobs by default and
``--filename`` lists of at most 4096 characters. So the tree uses ``--bsrange=4k-1M``: closest to
feedbench's 1 MiB ``read()`` calls (one request covers the file or a large part of it), and MB/s
is compared, which is bytes / time for both tools.
Tar shards (MBs each) use ``--bs=1M`` exactly; fio skips each shard's last partial MiB.

DECODE, warm cache: a plain-Python loop (read the file, ``PIL.Image.open(...).convert("RGB")``,
one process) vs ``feedbench scan IMAGES --stages decode --passes warm --workers 0 --consumers N``
for N = 1, 2, 4, …, cores (one invocation per N and repeat, interleaved), using each
measurement's ``steady_samples_per_s`` (the rate after the first batch, summed over consumers).
efficiency(N) = rate(N) / (N * rate(1)); the goal is >= 0.9 for N <= cores.
Right after each feedbench run, the parallel plain reference (skip: ``--no-parallel-reference``):
N spawned processes run the plain loop at once, process k over the files feedbench's consumer k
decodes, all released by one barrier once Pillow is imported. Its rate is measured the way
feedbench's is: each process's images after its first 64 (feedbench's batch) over its time after
them, summed over processes (images / barrier-to-last-finisher is kept too, as
``makespan_img_per_s``). plain-parallel(N) is what the host gives N independent decoders (shared
physical cores and all-core clocks included), so feedbench(N) / plain-parallel(N) >= 0.9 says
feedbench scales as well as the host allows, whatever the host's own efficiency.

Everything goes to ``--out`` (JSON, rewritten after every section) and a Markdown summary is
printed (and written beside it, ``.md``). Run ``--help`` for the options.
"""

from __future__ import annotations

import argparse
import json
import shlex
import socket
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchlib.common import log, save
from benchlib.data import LinkDirs, make_data
from benchlib.decodebench import decode_section
from benchlib.machine import find_fio, machine, usable_cores
from benchlib.markdown import markdown
from benchlib.readbench import read_layout
from benchlib.readrefs import FIO_BS, FIO_COMMON
from benchlib.runner import BenchEnv, Runner

LAYOUT_DIRS = (("tree", "images"), ("shards", "shards"))  # layout, its folder in the sample


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="feedbench scan vs fio (cold reads) and vs plain-Python decode.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--data", type=Path, help="a `feedbench sample` output (images/, shards/)")
    src.add_argument(
        "--make", type=int, default=2000, help="generate N images (default 2000; reused if there)"
    )
    p.add_argument(
        "--workdir",
        type=Path,
        default=Path("results/bench_scan"),
        help="generated data and per-run files (default results/bench_scan)",
    )
    p.add_argument("--out", type=Path, help="results JSON (default: WORKDIR/results.json)")
    p.add_argument("--fio", help="fio binary or wrapper (default: fio on PATH, .xfer/fio/run-fio)")
    p.add_argument("--repeat", type=int, default=5, help="read repeats, interleaved (default 5)")
    p.add_argument(
        "--decode-repeat", type=int, default=3, help="decode repeats, interleaved (default 3)"
    )
    p.add_argument("--parts", default="read,decode", help="read, decode or read,decode (default)")
    p.add_argument("--cores", type=int, help="cores to scale to (default: usable cores)")
    p.add_argument("--jobs", type=int, help="parallel read jobs = consumers (default: cores)")
    p.add_argument("--consumers", help="decode consumer counts (default 1,2,4,...,cores)")
    p.add_argument(
        "--no-parallel-reference",
        action="store_true",
        help="skip the N plain-Python decoders run at once beside each feedbench decode run",
    )
    p.add_argument(
        "--drop-caches",
        action="store_true",
        help="also write /proc/sys/vm/drop_caches before every cold run (root)",
    )
    p.add_argument(
        "--quiet-load",
        type=float,
        default=0.25,
        help="before each run, wait until other processes use fewer cores than this (0.25)",
    )
    p.add_argument(
        "--quiet-wait", type=float, default=10.0, help="...but at most this many seconds (10)"
    )
    p.add_argument(
        "--lean",
        action="store_true",
        help="one-job reads: only fio and feedbench --workers 0 (no w1, Python or cat references)",
    )
    p.add_argument("--layouts", default="tree,shards", help="read layouts (default tree,shards)")
    p.add_argument("--label", default=None, help="machine name for the report")
    p.add_argument("--render", type=Path, help="print the Markdown of a results JSON; run nothing")
    args = p.parse_args(argv)
    if args.repeat < 1 or args.decode_repeat < 1:
        p.error("--repeat and --decode-repeat must be at least 1")
    return args


def new_results(
    args: argparse.Namespace,
    argv: list[str] | None,
    data: Path,
    cores: int,
    fio: str | None,
    why: str | None,
) -> dict[str, Any]:
    """The results before any measurement: what was run, how, and on which machine."""
    shown = argv if argv is not None else sys.argv[1:]
    return {
        "kind": "bench_scan",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "label": args.label or socket.gethostname(),
        "command": shlex.join(["scripts/bench_scan.py", *shown]),
        "data": str(data),
        "config": {
            "repeat": args.repeat,
            "decode_repeat": args.decode_repeat,
            "cores": cores,
            "drop_caches": args.drop_caches,
            "quiet_load": args.quiet_load,
            "quiet_wait": args.quiet_wait,
            "parallel_reference": not args.no_parallel_reference,
            "lean": args.lean,
            "fio_common": FIO_COMMON,
            "fio_bs": FIO_BS,
            "fio_note": why,
        },
        "machine": machine(str(data), fio),
        "goals": {},
    }


def measure_read(res: dict[str, Any], env: BenchEnv, data: Path, out: Path) -> None:
    """Each layout asked for and present: its read section and goals, saved after each."""
    res["read"] = {}
    layouts = {x.strip() for x in env.args.layouts.split(",")}
    for layout, sub in LAYOUT_DIRS:
        if layout not in layouts:
            continue
        if not (data / sub).is_dir():
            log(f"no {data / sub}: skipping the {layout} read")
            continue
        log(f"read, {layout}: {data / sub}")
        s = read_layout(env, layout, data / sub)
        res["read"][layout] = s
        res["goals"][f"read_{layout}_w0_vs_fio"] = s.get("ratio_feedbench_w0_to_fio")
        res["goals"][f"read_{layout}_parallel_vs_fio"] = s["parallel"].get("ratio_feedbench_to_fio")
        res["quiet_waited_s"] = env.runner.waited_s
        save(res, out)


def measure_decode(res: dict[str, Any], env: BenchEnv, data: Path, out: Path) -> None:
    """The decode section and its goals, saved."""
    log("decode")
    dec = decode_section(env, data / "images")
    res["decode"] = dec
    res["goals"]["decode_efficiency_min"] = dec["min_efficiency_up_to_cores"]
    res["goals"]["decode_goal_met"] = dec["goal_met"]
    ref = dec["plain_parallel"]
    if not ref.get("skipped"):
        res["goals"]["decode_vs_plain_parallel_min"] = ref["min_ratio_feedbench_to_plain_parallel"]
        res["goals"]["decode_vs_plain_parallel_goal_met"] = ref["goal_met"]
    res["quiet_waited_s"] = env.runner.waited_s
    save(res, out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        print(markdown(json.loads(args.render.read_text())))
        return 0
    cores = args.cores or usable_cores()
    args.workdir.mkdir(parents=True, exist_ok=True)
    data = (args.data if args.data else make_data(args.make, args.workdir, cores)).resolve()
    out = args.out or args.workdir / "results.json"
    runs_dir = args.workdir / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    fio, why = find_fio(args.fio)
    if why:
        log(why)
    parts = {x.strip() for x in args.parts.split(",") if x.strip()}
    res = new_results(args, argv, data, cores, fio, why)
    save(res, out)
    links = LinkDirs(args.workdir.resolve(), data)
    env = BenchEnv(args, Runner(args), fio, links, runs_dir, cores)
    try:
        if "read" in parts:
            measure_read(res, env, data, out)
        if "decode" in parts:
            measure_decode(res, env, data, out)
    except RuntimeError as e:  # a tool failed: keep what was measured, say what broke
        res["error"] = str(e)
        save(res, out)
        log(f"error: {e}\npartial results: {out}")
        return 1
    finally:
        links.remove()
    text = markdown(res)
    res["markdown"] = text
    save(res, out)
    out.with_suffix(".md").write_text(text)
    print(text)
    log(f"results: {out} (and {out.with_suffix('.md')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
