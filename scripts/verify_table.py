#!/usr/bin/env python3
"""One table over several ``feedbench verify`` results files (e.g. tuning variants, one file each).

    python scripts/verify_table.py results/tune-*.json   # .json.gz too

Per run: images/s, the fraction of the synthetic ceiling, data wait as a fraction of the step, the
step breakdown in ms (mean over ranks and measured steps) and, where verify paired the loader
with the synthetic batch in one process (``--interleave``), that fraction with its 95% interval
and the step's slowdown. Markdown on stdout.

Repeats: files named ``NAME-rK`` (``scripts/bench_verify.sh tune`` with ``REPEAT=K``) are repeat K
of variant NAME. Each run's ceiling is a synthetic run at its GPU count and per-GPU batch: of the
same repeat of its own variant, else of the same file, else of the same repeat (run just before
it, e.g. ``tune-synthetic-r2`` for ``tune-x-r2``), else the first; a synthetic run measured
again after the loaders (verify's ``--ceiling-twice``) gives the mean of the two. A second table
gives each variant's mean ± standard deviation over its repeats.
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


RUNS_HEAD = (
    "| file | loader | options | stream | CPUs | workers | GPUs | img/s | ceiling | of ceiling "
    "| data wait | fwd+bwd ms | all-reduce ms | optim ms | step ms | GPU util % "
    "| SM clock min MHz | power W | paired: of ceiling (95% CI) | paired: slowdown ms |"
)
RUNS_RULE = (
    "|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"
)
VARIANTS_HEAD = (
    "| variant | loader | GPUs | runs | img/s | of ceiling | data wait % | fwd+bwd ms "
    "| paired: of ceiling |"
)
VARIANTS_RULE = "|---|---|---:|---:|---:|---:|---:|---:|---:|"


def setting(cfg: dict) -> dict:
    """What distinguishes a results file's runs: loader/DDP options, stream, CPUs, synced."""
    return {
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


def load_runs(paths: list[str]) -> list[tuple[str, dict, dict]]:
    """(file stem, its setting, run) for every run of every file, in order."""
    runs = []
    for p in paths:
        try:
            raw = Path(p).read_bytes()
            doc = json.loads(gzip.decompress(raw) if p.endswith(".gz") else raw)
        except (OSError, ValueError) as e:  # missing, unreadable, not gzip, not JSON
            raise SystemExit(f"error: {p}: not a readable verify results file ({e})") from None
        st = setting(doc.get("config", {}))
        for r in doc.get("runs", []):
            runs.append((Path(p).name.split(".")[0], st, r))
    return runs


class Ceilings:
    """Each run's ceiling: the synthetic run of its repeat, else of its file, else the first."""

    def __init__(self, runs: list[tuple[str, dict, dict]]) -> None:
        # the ceiling: synthetic runs as they are (not the --sync-each-step diagnostic)
        ok_synth = [
            (s, r)
            for s, st, r in runs
            if r["loader"] == "synthetic" and r.get("status") == "ok" and not st["synced"]
        ]
        # a ceiling is at the same GPU count and per-GPU batch; of the same repeat, of its own
        # variant first (check-b64-r1's synthetic run, not check-b256-r1's)
        self.table: dict[tuple, float] = {}
        for s, r in ok_synth:
            variant, rep = split_stem(s)
            at = (r["gpus"], r.get("per_gpu_batch"))
            for key in (("variant", variant, rep, *at), ("file", s, *at), ("repeat", rep, *at)):
                if key[0] == "file" or rep:
                    self.table.setdefault(key, _ceiling(r))
            self.table.setdefault(("first", *at), _ceiling(r))

    def __call__(self, stem: str, run: dict) -> float | None:
        variant, rep = split_stem(stem)
        at = (run["gpus"], run.get("per_gpu_batch"))
        for key in (("variant", variant, rep, *at), ("file", stem, *at), ("repeat", rep, *at),
                    ("first", *at)):  # fmt: skip
            if key in self.table:
                return self.table[key]
        return None


def _ceiling(synthetic: dict) -> float:
    """A synthetic run's ceiling: with ``--ceiling-twice`` the mean of its runs before and after
    the loaders, as verify's own fractions use."""
    again = synthetic.get("ceiling_after_images_per_s")
    ips = synthetic["images_per_s"]
    return (ips + again) / 2 if again else ips


def _opt(x: float | None, fmt: str) -> str:
    return format(x, fmt) if x is not None else "–"


def paired_cells(r: dict) -> str:
    """The run's paired fraction (95% interval) and slowdown cells; dashes where not paired."""
    p = r.get("paired")
    if not p:
        return "| – | – |"
    lo, hi = p.get("ceiling_fraction_lo"), p.get("ceiling_fraction_hi")
    ci = f" ({lo:.2f}–{hi:.2f})" if lo is not None and hi is not None else ""
    return f"| {p['ceiling_fraction']:.3f}{ci} | {p['slowdown_s'] * 1e3:+.1f} |"


def run_row(stem: str, st: dict, r: dict, ceil: float | None) -> str:
    """One run's row of the first table."""
    b = r.get("breakdown") or {}
    frac = r["images_per_s"] / ceil if ceil else None

    def ms(key: str) -> str:
        return f"{b[key] * 1e3:.1f}" if b.get(key) is not None else "–"

    wait = r.get("data_wait_fraction")
    return (
        f"| {stem} | {r['loader']}{' (synced)' if st['synced'] else ''} "
        f"| {st['opts'] or '–'} | {st['prio']} | {st['cpu']} "
        f"| {r.get('workers') or '–'} "
        f"| {r['gpus']} | {r['images_per_s']:,.0f} | {f'{ceil:,.0f}' if ceil else '–'} "
        f"| {f'{frac:.3f}' if frac else '–'} "
        f"| {f'{wait * 100:.1f}%' if wait is not None else '–'} "
        f"| {ms('forward_backward_s')} | {ms('allreduce_s')} | {ms('optimizer_s')} "
        f"| {ms('step_s')} | {_opt(r.get('gpu_util_percent_mean'), '.0f')} "
        f"| {_opt(r.get('gpu_sm_clock_mhz_min'), ',.0f')} "
        f"| {_opt(r.get('gpu_power_w_mean'), '.0f')} {paired_cells(r)}"
        + ("" if r.get("status") == "ok" else f" {r.get('status')}: {r.get('error')}")
    )


def variant_groups(runs: list[tuple[str, dict, dict]], ceiling: Ceilings) -> dict:
    """(variant, loader, GPUs) → the figures of its ok runs, one entry per repeat."""
    groups: dict[tuple[str, str, int], list[dict]] = {}
    for stem, _, r in runs:
        if r.get("status") != "ok":
            continue
        ceil = ceiling(stem, r)
        key = (split_stem(stem)[0], r["loader"], r["gpus"])
        groups.setdefault(key, []).append(
            {
                "ips": r["images_per_s"],
                "frac": r["images_per_s"] / ceil if ceil else None,
                "wait": r.get("data_wait_fraction"),
                "fb": (r.get("breakdown") or {}).get("forward_backward_s"),
                "paired": (r.get("paired") or {}).get("ceiling_fraction"),
            }
        )
    return groups


def variant_row(name: str, loader: str, gpus: int, rows: list[dict]) -> str:
    """One variant's mean ± std over its repeats."""

    def col(key: str, scale: float = 1.0) -> list[float]:
        return [x[key] * scale for x in rows if x[key] is not None]

    return (
        f"| {name} | {loader} | {gpus} | {len(rows)} | {spread(col('ips'), ',.0f')} "
        f"| {spread(col('frac'), '.3f')} | {spread(col('wait', 100), '.1f')} "
        f"| {spread(col('fb', 1e3), '.1f')} | {spread(col('paired'), '.3f')} |"
    )


def main(paths: list[str]) -> int:
    if paths[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    runs = load_runs(paths)
    ceiling = Ceilings(runs)
    print(RUNS_HEAD)
    print(RUNS_RULE)
    for stem, st, r in runs:
        print(run_row(stem, st, r, ceiling(stem, r)))
    groups = variant_groups(runs, ceiling)
    if any(len(v) > 1 for v in groups.values()):
        print()
        print(VARIANTS_HEAD)
        print(VARIANTS_RULE)
        for (name, loader, gpus), rows in groups.items():
            print(variant_row(name, loader, gpus, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
