#!/usr/bin/env python3
"""One table over several ``feedbench verify`` results files (e.g. tuning variants, one file each).

    python scripts/verify_table.py results/tune-*.json   # .json.gz too

Per run: images/s, the fraction of the synthetic ceiling, data wait as a fraction of the step, and
the step breakdown in ms (mean over ranks and measured steps). Markdown on stdout.

Repeats: files named ``NAME-rK`` (``scripts/bench_verify.sh tune`` with ``REPEAT=K``) are repeat K
of variant NAME; each run's ceiling is then the synthetic run of the SAME repeat (run just before
it), else the synthetic run of the same file, else the first synthetic run at that GPU count. A
second table gives each variant's mean ± standard deviation over its repeats.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path


def split_stem(stem: str) -> tuple[str, str]:
    """``tune-hw99-r2`` → (``tune-hw99``, ``2``); no repeat suffix → (stem, "")."""
    m = re.fullmatch(r"(.*?)-r(\d+)", stem)
    return (m.group(1), m.group(2)) if m else (stem, "")


def spread(values: list[float], fmt: str) -> str:
    """Mean ± sample std of the repeats (``feedbench.core.stats.spread``), formatted."""
    from feedbench.core.stats import spread as summary

    s = summary(values)
    if s["n"] == 0:
        return "–"
    if s["n"] == 1:
        return format(s["mean"], fmt) + " (1 run)"
    return f"{format(s['mean'], fmt)} ± {format(s['std'], fmt)}"


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    runs = []
    for p in paths:
        raw = Path(p).read_bytes()
        doc = json.loads(gzip.decompress(raw) if p.endswith(".gz") else raw)
        cfg = doc.get("config", {})
        setting = {
            "opts": " ".join(
                [
                    *(cfg.get("loader_options") or []),
                    *(f"ddp:{k}={v}" for k, v in (cfg.get("ddp_options") or {}).items()),
                    *([f"compile={cfg['compile']}"] if cfg.get("compile", "off") != "off" else []),
                ]
            ),
            "prio": cfg.get("stream_priority", "normal"),
            "cpu": cfg.get("cpu_affinity", "inherit"),
            "synced": bool(cfg.get("sync_each_step")),
        }
        for r in doc.get("runs", []):
            runs.append((Path(p).name.split(".")[0], setting, r))
    ok_synth = [  # the ceiling: synthetic runs as they are (not the --sync-each-step diagnostic)
        (s, r)
        for s, st, r in runs
        if r["loader"] == "synthetic" and r.get("status") == "ok" and not st["synced"]
    ]
    by_repeat = {
        (split_stem(s)[1], r["gpus"]): r["images_per_s"] for s, r in ok_synth if split_stem(s)[1]
    }
    by_file = {(s, r["gpus"]): r["images_per_s"] for s, r in ok_synth}
    first: dict[int, float] = {}
    for _, r in ok_synth:
        first.setdefault(r["gpus"], r["images_per_s"])

    def ceiling(stem: str, gpus: int) -> float | None:
        rep = split_stem(stem)[1]
        return by_repeat.get((rep, gpus)) or by_file.get((stem, gpus)) or first.get(gpus)

    print(
        "| file | loader | options | stream | CPUs | workers | GPUs | img/s | ceiling | of ceiling "
        "| data wait | fwd+bwd ms | all-reduce ms | optim ms | step ms | GPU util % "
        "| SM clock min MHz | power W |"
    )
    print("|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    groups: dict[tuple[str, str, int], list[dict]] = {}
    for stem, st, r in runs:
        b = r.get("breakdown") or {}
        ceil = ceiling(stem, r["gpus"])
        frac = r["images_per_s"] / ceil if ceil else None

        def ms(key: str, b=b) -> str:
            return f"{b[key] * 1e3:.1f}" if b.get(key) is not None else "–"

        wait = r.get("data_wait_fraction")
        util = r.get("gpu_util_percent_mean")
        clock, watt = r.get("gpu_sm_clock_mhz_min"), r.get("gpu_power_w_mean")
        print(
            f"| {stem} | {r['loader']}{' (synced)' if st['synced'] else ''} "
            f"| {st['opts'] or '–'} | {st['prio']} | {st['cpu']} "
            f"| {r.get('workers') or '–'} "
            f"| {r['gpus']} | {r['images_per_s']:,.0f} | {f'{ceil:,.0f}' if ceil else '–'} "
            f"| {f'{frac:.3f}' if frac else '–'} "
            f"| {f'{wait * 100:.1f}%' if wait is not None else '–'} "
            f"| {ms('forward_backward_s')} | {ms('allreduce_s')} | {ms('optimizer_s')} "
            f"| {ms('step_s')} | {f'{util:.0f}' if util is not None else '–'} "
            f"| {f'{clock:,.0f}' if clock is not None else '–'} "
            f"| {f'{watt:.0f}' if watt is not None else '–'} |"
            + ("" if r.get("status") == "ok" else f" {r.get('status')}: {r.get('error')}")
        )
        if r.get("status") == "ok":
            key = (split_stem(stem)[0], r["loader"], r["gpus"])
            groups.setdefault(key, []).append(
                {
                    "ips": r["images_per_s"],
                    "frac": frac,
                    "wait": wait,
                    "fb": b.get("forward_backward_s"),
                }
            )
    if any(len(v) > 1 for v in groups.values()):
        print()
        print("| variant | loader | GPUs | runs | img/s | of ceiling | data wait % | fwd+bwd ms |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for (name, loader, gpus), rows in groups.items():

            def col(key: str, scale: float = 1.0, rows=rows) -> list[float]:
                return [x[key] * scale for x in rows if x[key] is not None]

            print(
                f"| {name} | {loader} | {gpus} | {len(rows)} | {spread(col('ips'), ',.0f')} "
                f"| {spread(col('frac'), '.3f')} | {spread(col('wait', 100), '.1f')} "
                f"| {spread(col('fb', 1e3), '.1f')} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
