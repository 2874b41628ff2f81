"""How every measured run is made: on a quiet machine, cold when asked, with other load metered."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from feedbench.core.stats import spread

from .data import LinkDirs, evict
from .machine import CpuMeter, wait_quiet


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


@dataclass
class BenchEnv:
    """What every section shares: the options, the runner, fio, the links, where runs go."""

    args: argparse.Namespace
    runner: Runner
    fio: str | None
    links: LinkDirs
    runs_dir: Path
    cores: int

    @property
    def drop(self) -> list[str]:
        return ["--drop-caches"] if self.args.drop_caches else []


def worst(runs: list[dict[str, Any]]) -> float | None:
    """The most other load (cores) seen during any of ``runs``."""
    loads = [r["other_cores"] for r in runs if r.get("other_cores") is not None]
    return max(loads) if loads else None


def series(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Repeats of one tool: the runs, mean ± std of ``key`` and the worst other load."""
    return {"runs": runs, key: spread([x[key] for x in runs]), "other_cores_max": worst(runs)}


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
