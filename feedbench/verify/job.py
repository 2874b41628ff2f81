"""One torchrun job of a verify: its command, its watch (a rank's death, the timeout, Ctrl-C),
the ranks' part files, and one line that says what failed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

from feedbench.core.envelope import from_dict
from feedbench.core.supervise import JOB_TAG, alive, reap, stop, stop_signals_deferred
from feedbench.verify.config import Plan, VerifyConfig
from feedbench.verify.loaders import batches_per_epoch
from feedbench.verify.results import SYNTHETIC, StepSeries, units

WORKER_MODULE = "feedbench.verify.worker"  # what torchrun runs as each rank
RANK_DEATH_GRACE_S = 10.0  # a rank has died: torchrun's time to notice before we stop the job


@dataclass
class JobOutcome:
    returncode: int | None
    interrupted: bool
    timed_out: bool
    rank_died: bool
    total_s: float
    leftover: int  # processes of the job still alive at the end, then killed


def _project_root() -> str:
    return str(Path(__file__).resolve().parent.parent)


def worker_command(
    config: VerifyConfig, p: Plan, loader: str, gpus: int, out_dir: str
) -> list[str]:
    per = p.per_gpu_batch(config.scaling, gpus)
    source = p.sources.get(loader, config.data)
    n = p.samples.get(source) or next(iter(p.samples.values()), 0)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
        "--nproc-per-node", str(gpus), "--max-restarts", "0", "--monitor-interval", "0.1",
        # torchrun's own folder (else a torchelastic_* in the temp folder that nothing removes)
        # inside the job's, which the run removes
        "--log-dir", os.path.join(out_dir, "torchelastic"),
        "-m", WORKER_MODULE,
        "--loader", loader, "--source", source, "--model", p.model, "--batch-size", str(per),
        "--steps", str(p.steps), "--warmup", str(p.warmup), "--image-size", str(p.image_size),
        "--seed", str(config.seed), "--num-classes", str(config.num_classes),
        "--device", p.device, "--out-dir", out_dir,
        "--synthetic-batches", str(max(1, batches_per_epoch(n, gpus, per)) if n else 100),
    ]  # fmt: skip
    if config.workers is not None:
        cmd += ["--workers", str(config.workers)]
    for key, value in p.options.get(loader, {}).items():
        cmd += ["--option", f"{key}={value}"]
    if config.stream_priority != "normal":
        cmd += ["--stream-priority", config.stream_priority]
    if config.cpu_affinity != "inherit":
        cmd += ["--cpu-affinity", config.cpu_affinity]
    for key, value in p.ddp_options.items():
        cmd += ["--ddp-option", f"{key}={value}"]
    if config.compile != "off":
        cmd += ["--compile", config.compile]
    if config.sync_each_step:
        cmd += ["--sync-each-step"]
    if p.interleave and loader != SYNTHETIC:
        cmd += ["--interleave", str(p.interleave)]
    return cmd


def _job_env(p: Plan, gpus: int) -> dict[str, str]:
    env = dict(os.environ)
    root = _project_root()
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if p.device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = "1"  # one core of compute per CPU rank, as one GPU per rank
    return env


def run_job(cmd: list[str], env: dict[str, str], log_path: str, timeout_s: float) -> JobOutcome:
    """Run one torchrun job to its end, a rank's death, the timeout or Ctrl-C; leave nothing."""
    t0 = time.monotonic()
    tag = uuid.uuid4().hex
    env = env | {JOB_TAG: tag}
    nested = "LOCAL_RANK" in env  # verify run inside a torchrun job: ranks' env tells nothing
    known: dict[int, psutil.Process] = {}
    ranks: dict[int, psutil.Process] = {}
    interrupted = timed_out = rank_died = False
    died_at: float | None = None
    with open(log_path, "wb") as log:
        try:
            with stop_signals_deferred():  # Ctrl-C taken once it runs: then stopped below
                top = subprocess.Popen(
                    cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )
        except KeyboardInterrupt:
            interrupted = True
        try:
            last_scan = 0.0
            while not interrupted:
                try:
                    top.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic()
                if now - last_scan > 0.5:
                    last_scan = now
                    try:
                        me = psutil.Process(top.pid)
                        for child in me.children(recursive=True):
                            known.setdefault(child.pid, child)
                        for child in me.children(recursive=False):
                            if _is_rank(child, nested):  # not a passing helper (ldconfig…)
                                ranks.setdefault(child.pid, child)
                    except psutil.Error:
                        pass
                    if died_at is None and ranks and len(alive(ranks.values())) < len(ranks):
                        died_at = now  # a rank is gone while torchrun still runs
                if died_at is not None and now - died_at > RANK_DEATH_GRACE_S:
                    rank_died = True
                    stop(top)
                    break
                if now - t0 > timeout_s:
                    timed_out = True
                    stop(top)
                    break
        except KeyboardInterrupt:
            interrupted = True
            stop(top)
        finally:
            if top.poll() is None:
                stop(top)
            leftover = reap(tag, known.values(), grace_s=3.0)
    return JobOutcome(
        top.returncode, interrupted, timed_out, rank_died, time.monotonic() - t0, leftover
    )


def _is_rank(proc: psutil.Process, nested: bool = False) -> bool:
    """A child of torchrun that is one of the job's ranks (the worker module), not a helper it
    or its imports started and that ends by itself (its end is no rank's death).

    Between fork and exec such a helper (ldconfig, a shell) still carries torchrun's command
    line, which names the worker module: on a loaded host the watch caught one there, took its
    end for a rank's death and stopped a healthy job. Only a rank has torchrun's per-rank
    environment (``LOCAL_RANK``); ``nested``: torchrun's own has it too, and only the command
    line can tell."""
    try:
        if WORKER_MODULE not in proc.cmdline():
            return False
        return nested or "LOCAL_RANK" in proc.environ()
    except psutil.Error:
        return False


def read_parts(out_dir: str, gpus: int) -> tuple[list[StepSeries], dict[int, bool]]:
    import json

    series, done = [], {}
    for r in range(gpus):
        path = os.path.join(out_dir, f"rank{r}.json")
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        series.append(from_dict(StepSeries, data["series"]))
        done[r] = bool(data.get("done"))
    return series, done


_RANK_BLOCK = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*exitcode\s*:\s*(-?\d+)")

_ERROR_LINE = re.compile(r"^(?:\[rank\d+\]:?\s*)?error: (.+)$", re.MULTILINE)


def first_failure(log_text: str) -> tuple[int, int] | None:
    """(rank, exit code) of the rank that failed first: one killed by a signal (a crash; its
    peers then fail in their collectives, and torchrun may observe one of them first), else
    torchrun's "Root Cause (first observed failure)", else its first."""
    killed = [m for m in _RANK_BLOCK.finditer(log_text) if int(m.group(2)) < 0]
    i = log_text.find("Root Cause")
    m = (killed[0] if killed else None) or _RANK_BLOCK.search(log_text, i if i >= 0 else 0)
    m = m or _RANK_BLOCK.search(log_text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def explain_failure(
    loader: str, gpus: int, unit: str, log_text: str, series: list[StepSeries], o: JobOutcome
) -> str:
    """One line: which rank failed, how, and at which step."""
    where = f"{loader} on {units(gpus, unit)}"
    steps = max((len(s.step_s) + len(s.warmup_step_s) for s in series), default=0)
    at = f" after {steps} step{'s' if steps != 1 else ''}"
    if o.interrupted:
        return f"{where}: interrupted{at}"
    if o.timed_out:
        return f"{where}: stopped after the run timeout ({o.total_s:.0f} s){at}"
    user = _ERROR_LINE.findall(log_text)
    if user:
        return f"{where}: {user[-1].strip()}"
    errors = {s.rank: s.error for s in series if s.error}
    first = first_failure(log_text)
    if first is not None:
        rank, code = first
        how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        msg = f"{where}: rank {rank} died ({how}){at}"
        if errors.get(rank):
            msg += f": {errors[rank]}"
        return msg
    if errors:
        rank, err = min(errors.items())
        return f"{where}: rank {rank} failed{at}: {err}"
    if o.rank_died:
        return f"{where}: a rank died{at}; the job was stopped"
    tail = [ln for ln in log_text.strip().splitlines() if ln.strip()][-1:] or ["no output"]
    return f"{where}: torchrun exited with code {o.returncode}: {tail[0][:300]}"
