#!/usr/bin/env python3
"""One table over several ``feedbench verify`` results files (e.g. tuning variants, one file each).

    python scripts/verify_table.py results/tune-*.json   # .json.gz too

Per run: images/s, the fraction of the synthetic ceiling (the synthetic run at the same GPU count,
from any of the files), data wait as a fraction of the step, and the step breakdown in ms (mean
over ranks and measured steps). Markdown on stdout.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    runs = []
    for p in paths:
        raw = Path(p).read_bytes()
        doc = json.loads(gzip.decompress(raw) if p.endswith(".gz") else raw)
        opts = " ".join(doc.get("config", {}).get("loader_options") or [])
        prio = doc.get("config", {}).get("stream_priority", "normal")
        for r in doc.get("runs", []):
            runs.append((Path(p).name.split(".")[0], opts, prio, r))
    # the ceiling: the synthetic run of the same file, else the first file's with one
    own: dict[tuple[str, int], float] = {}
    fallback: dict[int, float] = {}
    for stem, _o, _p, r in runs:
        if r["loader"] == "synthetic" and r.get("status") == "ok":
            own[(stem, r["gpus"])] = r["images_per_s"]
            fallback.setdefault(r["gpus"], r["images_per_s"])
    print(
        "| file | loader | options | stream | workers | GPUs | img/s | ceiling | of ceiling "
        "| data wait | fwd+bwd ms | all-reduce ms | optim ms | step ms | GPU util % |"
    )
    print("|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for stem, opts, prio, r in runs:
        b = r.get("breakdown") or {}
        ceil = own.get((stem, r["gpus"]), fallback.get(r["gpus"]))
        frac = r["images_per_s"] / ceil if ceil else None

        def ms(key: str, b=b) -> str:
            return f"{b[key] * 1e3:.1f}" if b.get(key) is not None else "–"

        wait = r.get("data_wait_fraction")
        util = r.get("gpu_util_percent_mean")
        print(
            f"| {stem} | {r['loader']} | {opts or '–'} | {prio} | {r.get('workers') or '–'} "
            f"| {r['gpus']} | {r['images_per_s']:,.0f} | {f'{ceil:,.0f}' if ceil else '–'} "
            f"| {f'{frac:.3f}' if frac else '–'} "
            f"| {f'{wait * 100:.1f}%' if wait is not None else '–'} "
            f"| {ms('forward_backward_s')} | {ms('allreduce_s')} | {ms('optimizer_s')} "
            f"| {ms('step_s')} | {f'{util:.0f}' if util is not None else '–'} |"
            + ("" if r.get("status") == "ok" else f" {r.get('status')}: {r.get('error')}")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
