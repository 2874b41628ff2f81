"""The read references feedbench is checked against: fio, plain-Python loops, GNU cat.

Each returns one run: ``mb_per_s`` = bytes read / seconds, and what it is made of.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from .common import READ_CHUNK

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
