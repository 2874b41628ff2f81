#!/usr/bin/env python3
"""Listing at scale (issue 24): ``loaders.data.layout.locate`` on ImageFolder trees of empty
files (10k, 100k, 1.28M: ImageNet-1k's count, 1000 class folders) and on a folder of 100k
one-byte ``.tar`` shards, beside a plain ``os.scandir`` walk with sizes and one sort over the
same folder in the same run, interleaved. Empty files suffice: listing reads no byte of a file.
``--remote N``: N shards served by rclone on loopback, listed as an S3 prefix and named by an
HTTP brace list (a HEAD each for its size).

    python scripts/bench_scale.py [--sizes 10k,100k,1.28M] [--shards 100k] [--remote 10k]
                                  [--root /tmp/fbscale] [--repeat 3] [--out FILE] [--delete]
                                  [--warm-only]

A tree is built once under ``--root`` and reused (a dot-file marks it complete); ``--delete``
removes each after it is measured. The first listing of each is cold when this process may
write ``/proc/sys/vm/drop_caches`` (root) and ``--warm-only`` is not given. Every figure is wall
time and this process's CPU time (on a shared VM the wall time also counts other tenants'
turns). To measure an older checkout, run this file with ``PYTHONPATH`` set to it: the JSON
records which ``loaders`` ran. The goals checked: each 10x of files at most 12x of the time
(time per file x <= 1.2), within 3x of the plain walk, 1.28M files listed in <= 30 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

CLASSES = 1000  # ImageNet-1k's class folders
DONE = ".complete"  # a dot-file: listing leaves it out
DROP = "/proc/sys/vm/drop_caches"


def count(text: str) -> int:
    """``10k``, ``1.28M``, ``16000`` → a number of files."""
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1].lower(), 1)
    return round(float(text[:-1] if scale > 1 else text) * scale)


def _done(folder: Path, n: int) -> bool:
    marker = folder / DONE
    return marker.exists() and marker.read_text().strip() == str(n)


@contextlib.contextmanager
def rclone(root: Path, protocol: str):
    """``root`` served on loopback by rclone (as the tests do): S3 (its folders as buckets;
    the environment set for it) or HTTP with index pages; yields the endpoint's URL."""
    exe = shutil.which("rclone") or str(Path(sys.executable).parent / "rclone")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    auth = ["--auth-key", "bench,bench-secret"] if protocol == "s3" else []
    argv = [exe, "serve", protocol, str(root), "--addr", f"127.0.0.1:{port}", *auth]
    proc = subprocess.Popen([*argv, "--log-level", "ERROR"], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    keys = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret"}
    os.environ.update(AWS_ENDPOINT_URL=url, AWS_DEFAULT_REGION="us-east-1", **keys)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/", timeout=1).close()
                break
            except urllib.error.HTTPError:
                break  # an answer (403 without credentials)
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def measure_remote(folder: Path, n: int, repeat: int) -> list[dict]:
    """The shard folder over loopback: an S3 prefix listed (paginated), and an HTTP brace list
    of every shard (expanded here, a HEAD per shard for its size)."""
    from loaders.data.layout import locate

    rows = []
    with rclone(folder.parent, "s3"):
        url = f"s3://{folder.name}/"
        times = timed(lambda: _check(locate(url), n), repeat)
        rows.append({"kind": "s3 prefix", "files": n, "locate_s": times})
    with rclone(folder.parent, "http") as base:
        url = f"{base}/{folder.name}/shard-{{000000..{n - 1:06d}}}.tar"
        times = timed(lambda: _check(locate(url), n), repeat)
        rows.append({"kind": "http brace list", "files": n, "locate_s": times})
    return rows


def _check(layout, n: int) -> None:
    assert len(layout.files) == n and layout.total_bytes == n, (len(layout.files), n)


def build_tree(folder: Path, n: int) -> None:
    """``n`` empty ``.JPEG`` files over 1000 class folders (fewer below 10 files a class)."""
    if _done(folder, n):
        return
    shutil.rmtree(folder, ignore_errors=True)
    classes = min(CLASSES, max(1, n // 10))
    flags = os.O_CREAT | os.O_WRONLY
    for c in range(classes):
        d = f"{folder}/n{c:08d}"
        os.makedirs(d)
        for i in range(c, n, classes):
            os.close(os.open(f"{d}/n{c:08d}_{i}.JPEG", flags, 0o644))
    (folder / DONE).write_text(str(n))


def build_shards(folder: Path, n: int) -> None:
    """``n`` one-byte ``.tar`` files in one folder (a shard set is listed, not read, here; a
    byte each, so that a store's listing gives sizes and no HEAD is asked per object)."""
    if _done(folder, n):
        return
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for i in range(n):
        fd = os.open(f"{folder}/shard-{i:06d}.tar", os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, b"x")
        os.close(fd)
    (folder / DONE).write_text(str(n))


def plain_walk(path: str) -> int:
    """The floor: every file under ``path`` with its size, one sort; no rule applied."""
    found: list[tuple[str, int]] = []
    stack = [path]
    while stack:
        with os.scandir(stack.pop()) as it:
            for e in it:
                if e.name.startswith("."):
                    continue
                if e.is_dir():
                    stack.append(e.path)
                else:
                    found.append((e.path, e.stat().st_size))
    found.sort()
    return len(found)


def drop_caches() -> bool:
    """Drop the page, dentry and inode caches, if this process may: the next listing is cold."""
    try:
        os.sync()
        with open(DROP, "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def timed(fn, repeat: int, cpu: list[float] | None = None) -> list[float]:
    """Wall seconds of each of ``repeat`` calls; ``cpu`` gets this process's CPU seconds of
    each (user + system: on a shared VM the wall time also counts other tenants' turns)."""
    out = []
    for _ in range(repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
        if cpu is not None:
            cpu.append(time.process_time() - c0)
    return out


def measure(path: Path, kind: str, n: int, repeat: int, cold_pass: bool = True) -> dict:
    from loaders.data.layout import locate

    cold = None
    if cold_pass and drop_caches():
        t0 = time.perf_counter()
        layout = locate(path)
        cold = time.perf_counter() - t0
    layout = locate(path)
    listed = len(layout.files)
    assert listed == n and layout.kind == kind, (listed, layout.kind)
    del layout
    warm, plain, warm_cpu, plain_cpu = [], [], [], []
    for _ in range(repeat):  # interleaved: a busy machine slows both alike
        warm += timed(lambda: locate(path), 1, warm_cpu)
        plain += timed(lambda: plain_walk(str(path)), 1, plain_cpu)
    return {
        "kind": kind, "files": n, "locate_cold_s": cold, "locate_s": warm,
        "scandir_s": plain, "ratio": min(warm) / min(plain), "locate_cpu_s": warm_cpu,
        "scandir_cpu_s": plain_cpu, "cpu_ratio": min(warm_cpu) / min(plain_cpu),
    }  # fmt: skip


def check(rows: list[dict]) -> list[str]:
    """The goals, one line each, for the rows of one kind in order of size."""
    lines = []
    for a, b in zip(rows, rows[1:], strict=False):
        growth = (min(b["locate_s"]) / min(a["locate_s"])) / (b["files"] / a["files"])
        if "locate_cpu_s" in a and "locate_cpu_s" in b:  # the CPU's growth: less noisy
            cpu = (min(b["locate_cpu_s"]) / min(a["locate_cpu_s"])) / (b["files"] / a["files"])
            lines.append(f"{a['files']:,} -> {b['files']:,}: CPU per file x{cpu:.2f}")
        ok = "ok" if growth <= 1.2 else "MISSED"
        lines.append(
            f"{a['files']:,} -> {b['files']:,}: time per file x{growth:.2f} ({ok}, <= 1.2)"
        )
    for r in rows:
        ok = "ok" if r["ratio"] <= 3 else "MISSED"
        lines.append(f"{r['files']:,} {r['kind']}: {r['ratio']:.2f}x the plain walk ({ok}, <= 3)")
        if r["files"] >= 1_280_000:
            t, cpu = min(r["locate_s"]), min(r.get("locate_cpu_s") or [float("nan")])
            ok = "ok" if t <= 30 else "MISSED"
            lines.append(f"{r['files']:,} listed in {t:.1f} s, {cpu:.1f} CPU s ({ok}, <= 30)")
    return lines


def table(rows: list[dict]) -> str:
    head = "| kind | files | locate cold | locate warm (best) | scandir+sort (best) | ratio |"
    out = [head + " CPU s: locate / scandir |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        cold = f"{r['locate_cold_s']:.2f} s" if r["locate_cold_s"] is not None else "-"
        cpu = f"{min(r['locate_cpu_s']):.2f} / {min(r['scandir_cpu_s']):.2f}"
        out.append(
            f"| {r['kind']} | {r['files']:,} | {cold} | {min(r['locate_s']):.3f} s | "
            f"{min(r['scandir_s']):.3f} s | {r['ratio']:.2f} | {cpu} |"
        )
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10k,100k", help="tree sizes, e.g. 10k,100k,1.28M")
    p.add_argument("--shards", default="100k", help="shard-set size (0: none)")
    p.add_argument("--remote", default="0", help="shards served over S3 and HTTP (0: none)")
    p.add_argument("--root", default="/tmp/fbscale", type=Path)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--delete", action="store_true", help="remove each tree once measured")
    p.add_argument("--warm-only", action="store_true", help="no cold pass (caches not dropped)")
    p.add_argument("--out", type=Path, default=Path("results/bench_scale.json"))
    a = p.parse_args()
    import loaders

    jobs = [("tree", count(s)) for s in a.sizes.split(",") if s]
    jobs += [("shards", count(a.shards))] if count(a.shards) else []
    rows = []
    for kind, n in jobs:
        folder = a.root / f"{kind}-{n}"
        t0 = time.perf_counter()
        (build_tree if kind == "tree" else build_shards)(folder, n)
        print(f"{kind} {n:,}: ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        rows.append(measure(folder, kind, n, a.repeat, not a.warm_only))
        print(table(rows[-1:]).splitlines()[-1], file=sys.stderr)
        if a.delete:
            shutil.rmtree(folder)
    remote = []
    for n in [count(x) for x in a.remote.split(",") if count(x)]:
        build_shards(a.root / f"shards-{n}", n)
        remote += measure_remote(a.root / f"shards-{n}", n, a.repeat)
        print(f"{remote[-2]} {remote[-1]}", file=sys.stderr)
    trees = [r for r in rows if r["kind"] == "tree"]
    goals = check(trees) + check([r for r in rows if r["kind"] == "shards"])
    print(table(rows))
    for r in remote:
        per = min(r["locate_s"]) / r["files"] * 1e6
        print(f"{r['kind']}: {r['files']:,} objects listed in {min(r['locate_s']):.2f} s "
              f"({per:.0f} us each)")  # fmt: skip
    print("\n".join(goals))
    where = str(Path(loaders.__file__).parent)
    git = ["git", "-C", where, "rev-parse", "--short", "HEAD"]
    commit = subprocess.run(git, capture_output=True, text=True).stdout.strip()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({
        "command": " ".join(sys.argv), "loaders": loaders.__file__, "commit": commit,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "date": time.strftime("%Y-%m-%d"), "cold": any(r["locate_cold_s"] for r in rows),
        "rows": rows, "remote": remote, "goals": goals,
    }, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
