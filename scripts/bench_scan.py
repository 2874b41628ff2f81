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
import contextlib
import io
import json
import math
import os
import platform
import resource
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from feedbench.core.stats import spread

READ_CHUNK = 1 << 20  # loaders.data.readers.READ_CHUNK: feedbench reads with 1 MiB read() calls
FEEDBENCH_BATCH = 64  # feedbench scan's batch without a profile; its steady rate skips one batch
GOAL = 0.9
CLK_TCK = os.sysconf("SC_CLK_TCK")

FIO_COMMON = [
    "--ioengine=psync",
    "--direct=0",
    "--invalidate=1",
    "--rw=read",
    "--file_service_type=sequential",
    "--fadvise_hint=0",  # fio's default posix_fadvise(SEQUENTIAL) doubles readahead; feedbench
    "--readonly",  # gives no hint. --readonly: fio refuses to write (it never lays out files here)
    "--thread",
]
FIO_BS = {"tree": ["--bsrange=4k-1M"], "shards": ["--bs=1M"]}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- statistics --------------------------------------------------------------------------------


def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    if not a or not b or not a.get("mean") or not b.get("mean"):
        return None
    return a["mean"] / b["mean"]


def paired(xs: list[float], ys: list[float]) -> dict[str, Any]:
    """Per-repeat ratios x_i / y_i of interleaved runs (drift of the storage cancels out)."""
    return spread([x / y for x, y in zip(xs, ys, strict=False) if x and y])


# --- the machine -------------------------------------------------------------------------------


def usable_cores() -> int:
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, math.ceil(int(quota) / int(period))))
    return n


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def mount_of(path: str) -> dict[str, Any]:
    """The mount holding ``path`` (longest mount point prefix) and its block device, if any."""
    real = os.path.realpath(path)
    best: dict[str, Any] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            dev, mnt, fstype, opts = line.split()[:4]
            mnt = mnt.replace("\\040", " ")
            inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
            if inside and len(mnt) >= len(best.get("mount", "")):
                best = {"device": dev, "mount": mnt, "fstype": fstype, "options": opts}
    dev = best.get("device", "")
    if dev.startswith("/dev/"):
        name = os.path.basename(os.path.realpath(dev))
        sys_dir = Path("/sys/class/block") / name
        if (sys_dir / "partition").exists():
            name = sys_dir.resolve().parent.name
        block = Path("/sys/block") / name
        best["block"] = {
            "name": name,
            "model": _read(block / "device" / "model"),
            "rotational": _read(block / "queue" / "rotational"),
            "read_ahead_kb": _read(block / "queue" / "read_ahead_kb"),
            "scheduler": _read(block / "queue" / "scheduler"),
            "size_bytes": int(_read(block / "size") or 0) * 512,
        }
    with contextlib.suppress(OSError):
        st = os.statvfs(real)
        best["free_bytes"] = st.f_bavail * st.f_frsize
    return best


def machine(data_dir: str, fio: str | None) -> dict[str, Any]:
    import PIL
    import psutil
    from PIL import features

    import feedbench

    model = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    fio_version = None
    if fio:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            fio_version = subprocess.run(
                [fio, "--version"], capture_output=True, text=True, timeout=30
            ).stdout.strip()
    gpus: list[str] = []
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        gpus = [x.strip() for x in out.stdout.splitlines() if x.strip()]
    return {
        "hostname": socket.gethostname(),
        "cpu_model": model,
        "logical_cpus": os.cpu_count(),
        "usable_cores": usable_cores(),
        "memory_bytes": psutil.virtual_memory().total,
        "kernel": platform.release(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "feedbench": feedbench.__version__,
        "pillow": PIL.__version__,
        "libjpeg_turbo": features.version("libjpeg_turbo"),
        "fio": fio_version,
        "gpus": gpus,
        "data_filesystem": mount_of(data_dir),
    }


# --- data --------------------------------------------------------------------------------------


def make_data(n: int, workdir: Path, cores: int) -> Path:
    out = workdir / f"data-{n}"
    manifest = out / "feedbench-sample.json"
    if manifest.exists():
        spec = json.loads(manifest.read_text()).get("spec", {})
        if spec.get("images") == n and spec.get("fmt") == "both":
            log(f"reusing {out}")
            return out
        raise SystemExit(f"{out} exists and holds another sample: remove it or use --data")
    log(f"generating {n} images into {out} ({cores} jobs)…")
    cmd = [sys.executable, "-m", "feedbench.cli", "sample", str(out), "--images", str(n)]
    subprocess.run([*cmd, "--jobs", str(cores)], check=True, stdout=subprocess.DEVNULL)
    return out


def open_layout(path: Path, fmt: str):
    from feedbench.scan.sources import detect

    source, _ = detect(str(path), fmt)
    return source


def rank_files(source, rank: int, world: int) -> list[str]:
    """The files (tree) or shards feedbench's consumer ``rank`` of ``world`` reads, in its order.

    ``feedbench scan --passes cold`` with one repeat is epoch 0 with seed 0.
    """
    from feedbench.scan.consumer import consumer_units

    files = source.files()
    return [str(files[i]) for i in consumer_units(source, rank, world, seed=0, epoch=0)]


def evict(files: list[str], drop_caches: bool) -> float:
    """Drop ``files`` from the page cache; return the fraction still resident."""
    from feedbench.scan import cache

    cache.evict(files)
    if drop_caches:
        cache.drop_all_caches()
    return cache.residency(files).fraction


def warm(files: list[str]) -> float:
    from feedbench.scan import cache

    for p in files:
        with open(p, "rb") as f:
            while f.read(READ_CHUNK):
                pass
    return cache.residency(files).fraction


def fingerprint(files: list[str]) -> tuple[int, int]:
    """(total bytes, newest mtime): the data must be the same after every tool has read it."""
    sts = [os.stat(p) for p in files]
    return sum(s.st_size for s in sts), max(s.st_mtime_ns for s in sts)


class LinkDirs:
    """One directory of hard links per fio job, holding exactly the files of feedbench's rank k.

    fio's ``--opendir`` skips symlinks (it lstat()s), ``--filename`` lists stop at 4096
    characters and job files at 8192 per line, so hard links (same inode, same page cache) are
    the way to give fio job k an arbitrary file list. They are made next to the work dir, or
    beside the data when the work dir is on another filesystem, and removed afterwards.
    """

    def __init__(self, workdir: Path, data_root: Path) -> None:
        self.candidates = [workdir, data_root]
        self.base: Path | None = None

    def make(self, groups: list[list[str]]) -> list[Path]:
        last: OSError | None = None
        for parent in self.candidates:
            base = Path(tempfile.mkdtemp(prefix=".bench-scan-links-", dir=parent))
            try:
                dirs = []
                for k, files in enumerate(groups):
                    d = base / f"job{k:03d}"
                    d.mkdir()
                    for j, src in enumerate(files):
                        os.link(src, d / f"{j:06d}{os.path.splitext(src)[1]}")
                    dirs.append(d)
                self.base = base
                return dirs
            except OSError as e:
                last = e
                shutil.rmtree(base, ignore_errors=True)
        raise OSError(f"cannot hard-link the data for fio jobs: {last}")

    def remove(self) -> None:
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None


# --- other load on the machine ------------------------------------------------------------------


def _cpu_busy_s() -> float | None:
    """Busy CPU seconds so far of the CPUs this process may run on (/proc/stat, per CPU)."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    mine = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    ticks = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        if mine is not None and int(name[3:]) not in mine:
            continue
        v = [int(x) for x in rest.split()[:8]]  # user nice system idle iowait irq softirq steal
        ticks += sum(v) - v[3] - v[4]
    return ticks / CLK_TCK


def _own_cpu_s() -> float:
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class CpuMeter:
    """CPU used on our CPUs during a run by anything but this process and its (reaped) children.

    A shared or noisy machine shows up here: ``other_cores`` is that CPU time / wall time. Kernel
    work for our own I/O (readahead, interrupts) counts as other, a few hundredths of a core.
    """

    def __enter__(self) -> CpuMeter:
        self.b0, self.o0, self.t0 = _cpu_busy_s(), _own_cpu_s(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self.t0
        b1 = _cpu_busy_s()
        self.other_cores = None
        if self.b0 is not None and b1 is not None and wall > 0:
            other = (b1 - self.b0) - (_own_cpu_s() - self.o0)
            self.other_cores = max(0.0, other) / wall


def wait_quiet(threshold: float, max_wait_s: float) -> tuple[float, float | None]:
    """Wait (up to ``max_wait_s``) until other load on our CPUs is below ``threshold`` cores."""
    t0 = time.perf_counter()
    load = None
    while True:
        b0 = _cpu_busy_s()
        time.sleep(0.25)
        b1 = _cpu_busy_s()
        if b0 is None or b1 is None:
            return 0.0, None
        load = (b1 - b0) / 0.25
        waited = time.perf_counter() - t0
        if load < threshold or waited >= max_wait_s:
            return waited, load


class Runner:
    """Every measured run: wait for a quiet machine, make the files cold, run, meter other load."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.waited_s = 0.0

    def run(self, fn, files: list[str] | None = None) -> dict[str, Any]:
        waited, _ = wait_quiet(self.args.quiet_load, self.args.quiet_wait)
        self.waited_s += waited
        resident = evict(files, self.args.drop_caches) if files is not None else None
        with CpuMeter() as meter:
            out = fn()
        out["other_cores"] = meter.other_cores
        if resident is not None:
            out["resident_before"] = resident
        return out


def worst(runs: list[dict[str, Any]]) -> float | None:
    loads = [r["other_cores"] for r in runs if r.get("other_cores") is not None]
    return max(loads) if loads else None


# --- the read references -----------------------------------------------------------------------


def run_fio(fio: str, layout: str, dirs: list[Path], out: Path) -> dict[str, Any]:
    """One fio run, one job per directory; MB/s = Σ read bytes / the longest job's runtime."""
    cmd = [fio, *FIO_COMMON, *FIO_BS[layout], "--output-format=json", f"--output={out}"]
    for k, d in enumerate(dirs):
        cmd += [f"--name={layout}{k}", f"--opendir={d}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    text = out.read_text() if out.exists() else ""
    if proc.returncode != 0 or "{" not in text:
        raise RuntimeError(f"fio failed ({proc.returncode}): {(proc.stderr or text)[-400:]}")
    report = json.loads(text[text.index("{") :])  # fio may print "opendir added N files" first
    jobs = report["jobs"]
    errors = [j["error"] for j in jobs if j.get("error")]
    io_bytes = sum(j["read"]["io_bytes"] for j in jobs)
    runtime_s = max(j["read"]["runtime"] for j in jobs) / 1e3
    if errors or io_bytes == 0 or runtime_s <= 0:
        raise RuntimeError(f"fio read nothing (errors {errors}, {io_bytes} bytes)")
    return {
        "mb_per_s": io_bytes / runtime_s / 1e6,
        "io_bytes": io_bytes,
        "runtime_s": runtime_s,
        "ios": sum(j["read"]["total_ios"] for j in jobs),
        "jobs": len(jobs),
        "usr_cpu_percent": statistics.fmean(j["usr_cpu"] for j in jobs),
        "sys_cpu_percent": statistics.fmean(j["sys_cpu"] for j in jobs),
        "command": " ".join(cmd[:1] + [c for c in cmd[1:] if not c.startswith("--output=")]),
    }


def run_python_read(files: list[str]) -> dict[str, Any]:
    """feedbench's syscalls without feedbench: open, read(1 MiB) until EOF, join, close.

    Like ``loaders.data.read_file``: every ``read(1 MiB)`` returns a new 1 MiB bytes
    object (shrunk afterwards), i.e. fresh memory the kernel copies into.
    """
    total = 0
    t0 = time.perf_counter()
    for p in files:
        with open(p, "rb", buffering=0) as f:
            chunks = []
            while True:
                chunk = f.read(READ_CHUNK)
                if not chunk:
                    break
                chunks.append(chunk)
        total += len(b"".join(chunks))
    dt = time.perf_counter() - t0
    return {"mb_per_s": total / dt / 1e6, "io_bytes": total, "runtime_s": dt}


def run_python_readinto(files: list[str]) -> dict[str, Any]:
    """The same bytes read into one reused buffer (``readv``, 1 MiB per call), then one copy."""
    buf = bytearray(READ_CHUNK)
    total = 0
    t0 = time.perf_counter()
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size > len(buf):
                buf = bytearray(size)
            view = memoryview(buf)
            n = 0
            while True:
                k = os.readv(fd, [view[n : n + READ_CHUNK]]) if n < len(buf) else 0
                if k <= 0:
                    break
                n += k
            total += len(bytes(view[:n]))
            del view
        finally:
            os.close(fd)
    dt = time.perf_counter() - t0
    return {"mb_per_s": total / dt / 1e6, "io_bytes": total, "runtime_s": dt}


def run_cat(files: list[str], nbytes: int) -> dict[str, Any]:
    """GNU cat (C, 128 KiB reads) over the same files, in the same order, via xargs."""
    listing = b"\0".join(p.encode() for p in files) + b"\0"
    t0 = time.perf_counter()
    subprocess.run(
        ["xargs", "-0", "cat"], input=listing, stdout=subprocess.DEVNULL, check=True, timeout=3600
    )
    dt = time.perf_counter() - t0
    return {"mb_per_s": nbytes / dt / 1e6, "io_bytes": nbytes, "runtime_s": dt}


def run_feedbench(
    path: Path, fmt: str, out: Path, flags: list[str] | None = None, **opts: Any
) -> tuple[dict[str, Any], str]:
    """``feedbench scan`` in a subprocess, as a user runs it; returns (results, command)."""
    cmd = [sys.executable, "-m", "feedbench.cli", "scan", str(path), "--format", fmt]
    cmd += flags or []
    for key, value in opts.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    cmd += ["--no-plots", "--json", str(out)]
    env = dict(os.environ, COLUMNS="120")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"feedbench failed ({proc.returncode}): {proc.stderr.strip()[-600:]}")
    shown = ["feedbench", *cmd[3:]]
    return json.loads(out.read_text()), " ".join(shown)


def feedbench_read_run(result: dict[str, Any]) -> dict[str, Any]:
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


def read_layout(
    args: argparse.Namespace,
    runner: Runner,
    layout: str,
    path: Path,
    fio: str | None,
    links: LinkDirs,
    runs_dir: Path,
    cores: int,
) -> dict[str, Any]:
    source = open_layout(path, layout)
    files = [str(f) for f in source.files()]
    nbytes = source.total_bytes()
    order = rank_files(source, 0, 1)  # feedbench's order with one consumer: every reference uses it
    before = fingerprint(files)
    section: dict[str, Any] = {
        "path": str(path),
        "files": len(files),
        "bytes": nbytes,
        "repeats": args.repeat,
    }
    fio_dirs: list[Path] = []
    if fio:
        on_disk = sorted(
            os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs if not f.startswith(".")
        )
        if on_disk == sorted(os.path.abspath(f) for f in files):
            fio_dirs = [path]  # fio walks the data itself
        else:
            fio_dirs = links.make([order])
    drop = ["--drop-caches"] if args.drop_caches else []
    series: dict[str, list[dict[str, Any]]] = {
        "fio": [],
        "feedbench_w0": [],
        "feedbench_w1": [],
        "python_read": [],
        "python_readinto": [],
        "cat": [],
    }
    commands: dict[str, str] = {}

    def feedbench(w: int, r: int) -> dict[str, Any]:
        out = runs_dir / f"feedbench-read-{layout}-w{w}-{r}.json"
        opts = {"stages": "read", "consumers": 1, "workers": w, "passes": "cold"}
        res, commands[f"feedbench_w{w}"] = run_feedbench(path, layout, out, drop, **opts)
        return feedbench_read_run(res)

    def fio_run(r: int) -> dict[str, Any]:
        run = run_fio(fio, layout, fio_dirs, runs_dir / f"fio-{layout}-1-{r}.json")
        commands["fio"] = run.pop("command")
        return run

    have_cat = bool(shutil.which("xargs") and shutil.which("cat"))
    for r in range(1, args.repeat + 1):  # interleaved: a drift of the storage hits every tool
        log(f"  read {layout}, 1 job, repeat {r}/{args.repeat}")
        if fio:
            series["fio"].append(runner.run(lambda r=r: fio_run(r), files))
        for w in (0,) if args.lean else (0, 1):
            series[f"feedbench_w{w}"].append(runner.run(lambda w=w, r=r: feedbench(w, r)))
        if args.lean:
            continue
        series["python_read"].append(runner.run(lambda: run_python_read(order), files))
        series["python_readinto"].append(runner.run(lambda: run_python_readinto(order), files))
        if have_cat:
            series["cat"].append(runner.run(lambda: run_cat(order, nbytes), files))
    for name, runs in series.items():
        if runs:
            section[name] = {
                "runs": runs,
                "mb_per_s": spread([x["mb_per_s"] for x in runs]),
                "other_cores_max": worst(runs),
            }
    fb = section["feedbench_w0"]
    fb["read_stage_mb_per_s"] = spread([x["read_stage_mb_per_s"] for x in fb["runs"]])
    section["commands"] = commands
    if fio:
        section["ratio_feedbench_w0_to_fio"] = ratio(fb["mb_per_s"], section["fio"]["mb_per_s"])
        if section.get("feedbench_w1"):
            section["ratio_feedbench_w1_to_fio"] = ratio(
                section["feedbench_w1"]["mb_per_s"], section["fio"]["mb_per_s"]
            )
        section["ratio_paired_w0"] = paired(
            [x["mb_per_s"] for x in fb["runs"]], [x["mb_per_s"] for x in section["fio"]["runs"]]
        )
    for ref in ("python_read", "python_readinto", "cat"):
        if section.get(ref):
            section[f"ratio_feedbench_w0_to_{ref}"] = ratio(
                fb["mb_per_s"], section[ref]["mb_per_s"]
            )
    links.remove()
    section["parallel"] = read_parallel(
        args, runner, layout, path, source, fio, links, runs_dir, cores
    )
    if fingerprint(files) != before:
        raise SystemExit(f"the data under {path} changed while it was read: stop")
    return section


def read_parallel(
    args, runner, layout, path, source, fio, links, runs_dir, cores
) -> dict[str, Any]:
    """fio with N jobs (job k = rank k's files) vs feedbench --consumers N --workers 0."""
    n = args.jobs or cores
    out: dict[str, Any] = {"jobs": n}
    if n < 2:
        return out | {"skipped": "one core: nothing to run in parallel"}
    if layout == "shards" and source.units() < n:
        return out | {"skipped": f"{source.units()} shards < {n} consumers"}
    files = [str(f) for f in source.files()]
    dirs: list[Path] = []
    if fio:
        try:
            dirs = links.make([rank_files(source, k, n) for k in range(n)])
        except OSError as e:
            out["fio_skipped"] = str(e)
    drop = ["--drop-caches"] if args.drop_caches else []

    def fio_run(r: int) -> dict[str, Any]:
        run = run_fio(fio, layout, dirs, runs_dir / f"fio-{layout}-{n}-{r}.json")
        out["fio_command"] = run.pop("command")
        return run

    def feedbench(r: int) -> dict[str, Any]:
        target = runs_dir / f"feedbench-read-{layout}-c{n}-{r}.json"
        opts = {"stages": "read", "consumers": n, "workers": 0, "passes": "cold"}
        res, out["feedbench_command"] = run_feedbench(path, layout, target, drop, **opts)
        return feedbench_read_run(res)

    fio_runs, fb_runs = [], []
    for r in range(1, args.repeat + 1):
        log(f"  read {layout}, {n} jobs, repeat {r}/{args.repeat}")
        if dirs:
            fio_runs.append(runner.run(lambda r=r: fio_run(r), files))
        fb_runs.append(runner.run(lambda r=r: feedbench(r)))
    links.remove()
    out["feedbench"] = {
        "runs": fb_runs,
        "mb_per_s": spread([x["mb_per_s"] for x in fb_runs]),
        "other_cores_max": worst(fb_runs),
    }
    if fio_runs:
        out["fio"] = {
            "runs": fio_runs,
            "mb_per_s": spread([x["mb_per_s"] for x in fio_runs]),
            "other_cores_max": worst(fio_runs),
        }
        out["ratio_feedbench_to_fio"] = ratio(out["feedbench"]["mb_per_s"], out["fio"]["mb_per_s"])
        out["ratio_paired"] = paired(
            [x["mb_per_s"] for x in fb_runs], [x["mb_per_s"] for x in fio_runs]
        )
    return out


# --- decode ------------------------------------------------------------------------------------


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
    (``run.build_measurement``); ``makespan_img_per_s`` = all images / (barrier to the last
    finisher) is kept beside it.
    """
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
    got.sort()
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


def counts_up_to(cores: int) -> list[int]:
    counts, n = [], 1
    while n < cores:
        counts.append(n)
        n *= 2
    return [*counts, cores]


def decode_section(
    args: argparse.Namespace, runner: Runner, images: Path, runs_dir: Path, cores: int
) -> dict[str, Any]:
    """Plain-Python decode vs feedbench --stages decode --workers 0 at 1, 2, 4, … cores consumers.

    One feedbench invocation per (repeat, count), interleaved, so that other load on the machine
    is metered per point and a slow patch spreads over every count instead of sinking one.
    Unless ``--no-parallel-reference``, each feedbench run is followed by N plain-Python decoders
    run at once (``plain_parallel_decode``), process k decoding the files feedbench's consumer k
    decodes: what the host allows N independent decoders, so feedbench(N) / plain-parallel(N)
    separates feedbench's own scaling from the host's (shared cores, all-core clocks).
    """
    source = open_layout(images, "tree")
    files = sorted(str(f) for f in source.files())
    resident = warm(files)
    counts = [int(x) for x in args.consumers.split(",")] if args.consumers else counts_up_to(cores)
    if 1 not in counts:
        counts = [1, *counts]
    parallel = not args.no_parallel_reference
    shares = {n: [rank_files(source, k, n) for k in range(n)] for n in counts} if parallel else {}
    also = " and N plain-Python decoders at once" if parallel else ""
    log(f"  decode: {len(files)} files; plain Python, then feedbench with {counts} consumers{also}")
    plain_decode(files)  # warm-up: page cache, Pillow's plugins, the allocator
    plain_runs: list[dict[str, Any]] = []
    fb_runs: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
    par_runs: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
    command = ""
    for r in range(1, args.decode_repeat + 1):
        plain_runs.append(runner.run(lambda: plain_decode(files)))
        log(f"    repeat {r}: plain Python {plain_runs[-1]['img_per_s']:.1f} img/s")
        for n in counts:
            target = runs_dir / f"feedbench-decode-c{n}-{r}.json"
            opts = {"stages": "decode", "consumers": n, "workers": 0, "passes": "warm"}

            def one(target=target, opts=opts) -> dict[str, Any]:
                nonlocal command
                res, command = run_feedbench(images, "tree", target, **opts)
                m = res["measurements"][0]
                steady = m["steady_samples_per_s"]
                return {
                    "img_per_s": steady if steady is not None else m["samples_per_s"],
                    "rate_basis": "steady" if steady is not None else "pass",
                    "pass_img_per_s": m["samples_per_s"],
                    "samples": m["samples"],
                    "wall_s": m["wall_s"],
                    "resident_before": m["cache"]["resident_before"],
                }

            fb_runs[n].append(runner.run(one))
            log(f"    repeat {r}: feedbench {n} consumers {fb_runs[n][-1]['img_per_s']:.1f} img/s")
            if parallel:
                run = runner.run(lambda n=n: plain_parallel_decode(shares[n], FEEDBENCH_BATCH))
                par_runs[n].append(run)
                log(f"    repeat {r}: plain Python x{n} at once {run['img_per_s']:.1f} img/s")
    plain = spread([x["img_per_s"] for x in plain_runs])
    one_rate = spread([x["img_per_s"] for x in fb_runs[1]])["mean"]
    par_one = spread([x["img_per_s"] for x in par_runs[1]])["mean"] if parallel else None
    curve = []
    for n in counts:
        s = spread([x["img_per_s"] for x in fb_runs[n]])
        point: dict[str, Any] = {
            "consumers": n,
            "img_per_s": s,
            "per_consumer": s["mean"] / n,
            "efficiency": s["mean"] / (n * one_rate) if one_rate else None,
            "other_cores_max": worst(fb_runs[n]),
            "runs": fb_runs[n],
        }
        if parallel:
            ps = spread([x["img_per_s"] for x in par_runs[n]])
            eff = ps["mean"] / (n * par_one) if par_one else None
            point["plain_parallel"] = {
                "img_per_s": ps,
                "makespan_img_per_s": spread([x["makespan_img_per_s"] for x in par_runs[n]]),
                "efficiency": eff,  # vs plain-parallel(1): the same method with one process
                "efficiency_vs_plain_loop": ps["mean"] / (n * plain["mean"]),
                "other_cores_max": worst(par_runs[n]),
                "runs": par_runs[n],
            }
            point["ratio_to_plain_parallel"] = ratio(s, ps)
            point["ratio_to_plain_parallel_paired"] = paired(
                [x["img_per_s"] for x in fb_runs[n]], [x["img_per_s"] for x in par_runs[n]]
            )
            # feedbench's efficiency / the host's: 1 = feedbench scales exactly as the host allows
            fe = point["efficiency"]
            point["relative_efficiency"] = fe / eff if fe is not None and eff else None
        curve.append(point)
    within = [c for c in curve if 1 < c["consumers"] <= cores and c["efficiency"] is not None]
    vs_par = [
        c for c in curve if c["consumers"] <= cores and c.get("ratio_to_plain_parallel") is not None
    ]
    low = min(vs_par, key=lambda c: c["ratio_to_plain_parallel"], default=None)
    reference: dict[str, Any] = {"skipped": "--no-parallel-reference"}
    if parallel:
        reference = {
            "processes": "one spawned process per share, released together by a barrier",
            "shares": "process k of N decodes the files of feedbench's consumer k of N (warm pass)",
            "rate": (
                "sum of per-process steady rates: images after the first "
                f"{FEEDBENCH_BATCH} over the time after them (feedbench's steady rate, summed "
                "over consumers); makespan_img_per_s = all images / barrier to last finisher"
            ),
            "batch": FEEDBENCH_BATCH,
            "efficiency_basis": "plain-parallel(1)",
            "min_ratio_feedbench_to_plain_parallel": low["ratio_to_plain_parallel"]
            if low
            else None,
            "min_ratio_at_consumers": low["consumers"] if low else None,
            "goal_met": bool(vs_par) and all(c["ratio_to_plain_parallel"] >= GOAL for c in vs_par),
        }
    return {
        "files": len(files),
        "resident_before": resident,
        "command": command.replace("--consumers " + str(counts[-1]), "--consumers N"),
        "counts": counts,
        "plain_python": {
            "runs": plain_runs,
            "img_per_s": plain,
            "other_cores_max": worst(plain_runs),
        },
        "feedbench": curve,
        "ratio_feedbench1_to_plain": one_rate / plain["mean"] if one_rate else None,
        "min_efficiency_up_to_cores": min((c["efficiency"] for c in within), default=None),
        "goal_met": bool(within) and all(c["efficiency"] >= GOAL for c in within),
        "plain_parallel": reference,
    }


# --- report ------------------------------------------------------------------------------------


def fmt_ms(s: dict[str, Any] | None, digits: int = 0) -> str:
    if not s or s.get("mean") is None:
        return "–"
    return f"{s['mean']:,.{digits}f} ± {s['std']:,.{digits}f}"


def fmt_r(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def fmt_load(*xs: float | None) -> str:
    vals = [x for x in xs if x is not None]
    return f"{max(vals):.2f}" if vals else "–"


def verdict(x: float | None) -> str:
    if x is None:
        return "–"
    return "yes" if x >= GOAL else "**no**"


def _get(d: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict) or d.get(k) is None:
            return None
        d = d[k]
    return d


def machine_line(res: dict[str, Any]) -> str:
    m = res["machine"]
    fs = m["data_filesystem"]
    block = fs.get("block") or {}
    disk = f"{fs.get('fstype', '?')} on {fs.get('device', '?')}"
    if block:
        disk += f" ({block.get('model') or 'no model'}, rotational={block.get('rotational')}"
        disk += f", read_ahead_kb={block.get('read_ahead_kb')})"
    gpus = f", {len(m['gpus'])}× {m['gpus'][0]}" if m.get("gpus") else ""
    return (
        f"Machine: {res['label']} — {m['cpu_model']}, {m['usable_cores']} usable cores "
        f"({m['logical_cpus']} logical), {m['memory_bytes'] / 2**30:.0f} GiB RAM{gpus}, "
        f"kernel {m['kernel']}, data on {disk}; {m['fio'] or 'no fio'}; Python {m['python']}, "
        f"Pillow {m['pillow']} (libjpeg-turbo {m['libjpeg_turbo']}); {res['date']}."
    )


def markdown(res: dict[str, Any]) -> str:
    lines = [machine_line(res), "", f"Command: `{res['command']}`", ""]
    read = res.get("read") or {}
    if read:
        rep = next(iter(read.values()))["repeats"]
        lines += [
            f"Read, cold page cache, MB/s (10^6 B/s), mean ± std of {rep} interleaved runs; "
            "'other load' = CPU used by other processes during the runs (cores, worst run):",
            "",
            "| layout | files, MB | fio | feedbench w0 | w0 / fio (paired) | ≥ 0.9 "
            "| feedbench w1 | Python read() | Python readinto | cat | other load |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for layout, s in read.items():
            pr = s.get("ratio_paired_w0") or {}
            r0 = s.get("ratio_feedbench_w0_to_fio")
            names = ("fio", "feedbench_w0", "feedbench_w1", "python_read", "python_readinto")
            load = fmt_load(*(_get(s, k, "other_cores_max") for k in names))
            lines.append(
                f"| {layout} | {s['files']:,}, {s['bytes'] / 1e6:,.0f} "
                f"| {fmt_ms(_get(s, 'fio', 'mb_per_s'))} "
                f"| {fmt_ms(s['feedbench_w0']['mb_per_s'])} "
                f"| {fmt_r(r0)} ({fmt_ms(pr, 2) if pr.get('n') else '–'}) | {verdict(r0)} "
                f"| {fmt_ms(_get(s, 'feedbench_w1', 'mb_per_s'))} "
                f"| {fmt_ms(_get(s, 'python_read', 'mb_per_s'))} "
                f"| {fmt_ms(_get(s, 'python_readinto', 'mb_per_s'))} "
                f"| {fmt_ms(_get(s, 'cat', 'mb_per_s'))} | {load} |"
            )
        lines += [""]
        par = [(k, s["parallel"]) for k, s in read.items() if s.get("parallel")]
        if par:
            lines += [
                "| layout | jobs = consumers | fio | feedbench | ratio (paired) | ≥ 0.9 "
                "| other load |",
                "|---|---|---|---|---|---|---|",
            ]
            for layout, p in par:
                if p.get("skipped"):
                    lines.append(f"| {layout} | {p['jobs']} | skipped: {p['skipped']} | | | | |")
                    continue
                pr = p.get("ratio_paired") or {}
                r = p.get("ratio_feedbench_to_fio")
                load = fmt_load(
                    _get(p, "fio", "other_cores_max"), _get(p, "feedbench", "other_cores_max")
                )
                lines.append(
                    f"| {layout} | {p['jobs']} | {fmt_ms(_get(p, 'fio', 'mb_per_s'))} "
                    f"| {fmt_ms(p['feedbench']['mb_per_s'])} "
                    f"| {fmt_r(r)} ({fmt_ms(pr, 2) if pr.get('n') else '–'}) | {verdict(r)} "
                    f"| {load} |"
                )
            lines += [""]
        stage = [
            f"{k} {fmt_ms(s['feedbench_w0'].get('read_stage_mb_per_s'))}" for k, s in read.items()
        ]
        lines += [
            "feedbench w0, read stage alone (bytes / seconds in its read calls; with the "
            "reading thread of shards, seconds waiting for it), MB/s: " + "; ".join(stage) + ".",
            "",
        ]
    dec = res.get("decode")
    if dec:
        plain = dec["plain_python"]["img_per_s"]
        ref = dec.get("plain_parallel") or {}
        par = bool(ref) and not ref.get("skipped")
        head = "| reader | consumers | img/s | per consumer | efficiency | ≥ 0.9 |"
        rule = "|---|---|---|---|---|---|"
        if par:
            head += (
                " plain ×N img/s | plain ×N efficiency | feedbench / plain ×N (paired) | ≥ 0.9 |"
            )
            rule += "---|---|---|---|"
        blank = " | | | |" if par else ""
        lines += [
            f"Decode, warm cache, {dec['files']:,} JPEGs, images/s (feedbench: steady rate after "
            f"the first batch), mean ± std of {plain['n']} interleaved repeats:",
            "",
            head + " other load |",
            rule + "---|",
            f"| plain Python (read + PIL convert) | 1 | {fmt_ms(plain, 1)} | | | |{blank}"
            f" {fmt_load(dec['plain_python']['other_cores_max'])} |",
        ]
        for c in dec["feedbench"]:
            e = c["efficiency"]
            ok = verdict(e) if c["consumers"] > 1 else ""
            row = (
                f"| feedbench --workers 0 | {c['consumers']} | {fmt_ms(c['img_per_s'], 1)} "
                f"| {c['per_consumer']:,.1f} | {fmt_r(e)} | {ok} |"
            )
            pp = c.get("plain_parallel") or {}
            if par:
                pr = c.get("ratio_to_plain_parallel_paired") or {}
                rp = c.get("ratio_to_plain_parallel")
                row += (
                    f" {fmt_ms(pp.get('img_per_s'), 1)} | {fmt_r(pp.get('efficiency'))} "
                    f"| {fmt_r(rp)} ({fmt_ms(pr, 2) if pr.get('n') else '–'}) | {verdict(rp)} |"
                )
            load = fmt_load(c["other_cores_max"], pp.get("other_cores_max"))
            lines.append(f"{row} {load} |")
        lines += [
            "",
            f"feedbench (1 consumer) / plain Python = {fmt_r(dec['ratio_feedbench1_to_plain'])}; "
            f"lowest efficiency for 2 ≤ N ≤ {res['config']['cores']} = "
            f"{fmt_r(dec['min_efficiency_up_to_cores'])}.",
        ]
        if par:
            low = ref.get("min_ratio_feedbench_to_plain_parallel")
            at = ref.get("min_ratio_at_consumers")
            lines += [
                "",
                f"plain ×N = {ref.get('batch', FEEDBENCH_BATCH)}-image-warm-up steady rates of N "
                "plain-Python decoders started together (one process each, process k decoding "
                "feedbench's consumer k's files), summed; efficiency vs plain ×1. Goal "
                f"feedbench(N) / plain-parallel(N) ≥ {GOAL} for N ≤ {res['config']['cores']}: "
                f"lowest {fmt_r(low)} (N = {at if at is not None else '–'}): "
                f"{'met' if ref.get('goal_met') else '**not met**'}.",
            ]
    cold = [
        run.get("resident_before")
        for s in read.values()
        for k in ("fio", "feedbench_w0", "feedbench_w1", "python_read", "python_readinto", "cat")
        for run in (_get(s, k, "runs") or [])
    ]
    cold = [x for x in cold if x is not None]
    if cold:
        lines += [
            "",
            f"Cold check: at most {max(cold):.1%} of the data was in the page cache when a "
            "cold run started.",
        ]
    if res.get("quiet_waited_s"):
        lines += ["", f"(Waited {res['quiet_waited_s']:.0f} s in all for other load to pass.)"]
    return "\n".join(lines) + "\n"


def save(res: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(res, indent=2) + "\n")
    os.replace(tmp, out)


def find_fio(given: str | None) -> tuple[str | None, str | None]:
    """fio on PATH, ``--fio``, or the bundle of scripts/fio_bundle.sh; checked by running it."""
    bundled = Path(__file__).resolve().parent.parent / ".xfer" / "fio" / "run-fio"
    if given:
        if not (os.path.isfile(given) and os.access(given, os.X_OK)):
            return None, f"fio not found at {given}: skipping the fio comparison"
        fio = os.path.abspath(given)
    elif shutil.which("fio"):
        fio = shutil.which("fio")
    elif bundled.is_file():
        fio = str(bundled)
    else:
        return None, "fio not found (apt-get install fio, or --fio PATH): skipping the fio part"
    try:
        proc = subprocess.run([fio, "--version"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{fio} does not run ({e}): skipping the fio comparison"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"{fio} does not run ({last}): skipping the fio comparison"
    return fio, None


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
    shown = argv if argv is not None else sys.argv[1:]
    res: dict[str, Any] = {
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
    save(res, out)
    runner = Runner(args)
    links = LinkDirs(args.workdir.resolve(), data)
    try:
        if "read" in parts:
            res["read"] = {}
            layouts = {x.strip() for x in args.layouts.split(",")}
            for layout, sub in (("tree", "images"), ("shards", "shards")):
                if layout not in layouts:
                    continue
                if not (data / sub).is_dir():
                    log(f"no {data / sub}: skipping the {layout} read")
                    continue
                log(f"read, {layout}: {data / sub}")
                s = read_layout(args, runner, layout, data / sub, fio, links, runs_dir, cores)
                res["read"][layout] = s
                res["goals"][f"read_{layout}_w0_vs_fio"] = s.get("ratio_feedbench_w0_to_fio")
                res["goals"][f"read_{layout}_parallel_vs_fio"] = s["parallel"].get(
                    "ratio_feedbench_to_fio"
                )
                res["quiet_waited_s"] = runner.waited_s
                save(res, out)
        if "decode" in parts:
            log("decode")
            res["decode"] = decode_section(args, runner, data / "images", runs_dir, cores)
            res["goals"]["decode_efficiency_min"] = res["decode"]["min_efficiency_up_to_cores"]
            res["goals"]["decode_goal_met"] = res["decode"]["goal_met"]
            ref = res["decode"]["plain_parallel"]
            if not ref.get("skipped"):
                res["goals"]["decode_vs_plain_parallel_min"] = ref[
                    "min_ratio_feedbench_to_plain_parallel"
                ]
                res["goals"]["decode_vs_plain_parallel_goal_met"] = ref["goal_met"]
            res["quiet_waited_s"] = runner.waited_s
            save(res, out)
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
