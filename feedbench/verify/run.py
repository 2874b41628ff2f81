"""Every GPU count × loader of a verify, one torchrun job each (synthetic first at each count).

Each rank writes its own part file; after every job the parent merges them into the results file,
so a failed or interrupted verify keeps every run measured before it, and the steps of the run
that broke. The parent watches each job: if a rank dies the job is stopped (torchrun first, then
any process of the job still alive, by pid), and Ctrl-C does the same; it never leaves processes
behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from feedbench.core.envelope import unfinished
from feedbench.core.monitor import Monitor
from feedbench.core.redact import scrub_file
from feedbench.core.supervise import Interrupted, sigterm_as_interrupt
from feedbench.core.timeline import Timeline, summarize
from feedbench.verify.analysis import compare, summarize_run
from feedbench.verify.config import Plan, VerifyConfig
from feedbench.verify.job import (
    JobOutcome,
    _job_env,
    explain_failure,
    read_parts,
    run_job,
    worker_command,
)
from feedbench.verify.loaders import SYNTHETIC, file_label
from feedbench.verify.plan import new_result, plan
from feedbench.verify.results import VerifyResult, VerifyRun, units


def monitor_start(interval_s: float) -> tuple[Monitor, float]:
    m = Monitor(interval_s=interval_s)
    t0 = time.monotonic()
    m.start()
    return m, t0


def window_figures(run: VerifyRun, timeline: Timeline, mono0: float, device: str) -> VerifyRun:
    """The run's CPU and GPU figures over its measured window (in place): the window from its
    ranks' host clocks, placed on the monitor's (``mono0``: time.monotonic() at its start); a
    window some rank did not end runs to now. Nothing when no rank started its window."""
    starts = [s.window_start_mono for s in run.ranks if s.window_start_mono is not None]
    ends = [s.window_end_mono for s in run.ranks if s.window_end_mono is not None]
    if not starts:
        return run
    a = min(starts) - mono0
    b = (max(ends) if ends and len(ends) == len(starts) else time.monotonic()) - mono0
    run.window_t_s = [a, b]
    used = list(range(run.gpus)) if device == "cuda" else None
    stats = summarize(timeline, a, b, used)
    run.cpu_percent_mean = stats.get("cpu_percent_mean")
    run.busy_cores_mean = stats.get("busy_cores_mean")
    run.steal_cores_mean = stats.get("steal_cores_mean")
    run.gpu_util_percent_mean = stats.get("gpu_util_percent_mean")
    run.gpu_sm_clock_mhz_min = stats.get("gpu_sm_clock_mhz_min_loaded")
    run.gpu_power_w_mean = stats.get("gpu_power_w_mean_loaded")
    mem = stats.get("gpu_mem_used_bytes_max")
    run.gpu_mem_used_bytes_max = int(mem) if mem is not None else None
    return run


def run_one(
    config: VerifyConfig, p: Plan, loader: str, gpus: int, log_dir: str | None
) -> VerifyRun:
    """One loader on ``gpus`` ranks: launch, watch, merge the ranks' parts into a run."""
    per = p.per_gpu_batch(config.scaling, gpus)
    run = VerifyRun(
        loader=loader,
        gpus=gpus,
        per_gpu_batch=per,
        global_batch=per * gpus,
        source=None if loader == SYNTHETIC else p.sources.get(loader),
        warmup_steps=p.warmup,
    )
    out_dir = tempfile.mkdtemp(prefix="feedbench-verify-")
    try:
        log_path = job_log_path(log_dir, out_dir, loader, gpus)
        cmd = worker_command(config, p, loader, gpus, out_dir)
        monitor, mono0 = monitor_start(config.monitor_interval_s)
        try:
            outcome = run_job(cmd, _job_env(p, gpus), log_path, config.run_timeout_s)
        finally:
            timeline = monitor.stop() if monitor is not None else None
            scrub_file(log_path)  # the ranks' own output: credentials masked as everywhere
        if monitor is not None and timeline is not None:
            timeline.label = f"{loader}, {units(gpus, p.unit)}"
        series, done = read_parts(out_dir, gpus)
        run.ranks = sorted(series, key=lambda s: s.rank)
        run.total_s = outcome.total_s
        run.log = log_path if log_dir else None
        run.monitor = timeline
        run.workers = next((s.workers for s in run.ranks if s.workers is not None), None)
        run.loader_settings = next(
            (s.loader_settings for s in run.ranks if s.loader_settings), None
        )
        run.cpus = [s.cpus for s in run.ranks] if any(s.cpus for s in run.ranks) else None
        run.epochs = max((max(s.epoch) + 1 for s in run.ranks if s.epoch), default=0)
        if not completed(outcome, done, gpus):
            mark_broken(run, outcome, log_path, p.unit)
        summarize_run(run)
        if timeline is not None:
            window_figures(run, timeline, mono0, p.device)
        if outcome.interrupted:
            raise Interrupted(run)
        return run
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def job_log_path(log_dir: str | None, out_dir: str, loader: str, gpus: int) -> str:
    """Where torchrun's output goes: kept in ``log_dir``, else beside the parts (removed with
    them, yet readable to explain a failure)."""
    if not log_dir:
        return os.path.join(out_dir, "torchrun.log")
    os.makedirs(log_dir, exist_ok=True)
    return os.path.join(log_dir, f"{file_label(loader)}-{gpus}.log")


def completed(outcome: JobOutcome, done: dict[int, bool], gpus: int) -> bool:
    """Whether the job ended well and every rank's part says it finished: a clean exit alone
    does not show that each rank wrote its steps."""
    return (
        outcome.returncode == 0
        and not (outcome.interrupted or outcome.timed_out or outcome.rank_died)
        and len(done) == gpus
        and all(done.values())
    )


def mark_broken(run: VerifyRun, outcome: JobOutcome, log_path: str, unit: str) -> None:
    """A run that did not complete: failed or interrupted, and why, read from its log."""
    try:
        log_text = Path(log_path).read_text(errors="replace")
    except OSError:
        log_text = ""
    run.status = "interrupted" if outcome.interrupted else "failed"
    run.error = explain_failure(run.loader, run.gpus, unit, log_text, run.ranks, outcome)
    run.partial = True


def verify(
    config: VerifyConfig,
    *,
    log_dir: str | None = None,
    on_update: Callable[[VerifyResult], None] | None = None,
    on_run: Callable[[str, int, int, int], None] | None = None,
) -> VerifyResult:
    """Every GPU count × loader (synthetic first at each count). ``on_update`` gets the result
    after every run (to save it); ``on_run(loader, gpus, i, total)`` is told when a run starts.

    A run that fails stops the verify (unless ``keep_going``), and so does Ctrl-C: the result is
    returned ``partial``, ``stopped_by`` "failed" or "interrupted", with the broken run's error and
    the steps its ranks recorded."""
    p = plan(config)
    result = new_result(config, p)
    jobs = job_list(config, p)
    again = False
    try:
        with sigterm_as_interrupt():
            for i, (loader, g, again) in enumerate(jobs):
                if on_run:
                    on_run(f"{loader} again" if again else loader, g, i, len(jobs))
                run = run_one(config, p, loader, g, log_dir)
                if again:
                    fold_ceiling(result, run, p.unit)
                    compare(result)
                    if on_update:
                        on_update(result if i == len(jobs) - 1 else unfinished(result))
                    continue
                result.runs.append(run)
                for note in user_loader_notes(run, p, config.num_classes):
                    if note not in result.warnings:
                        result.warnings.append(note)
                if run.status != "ok":
                    result.partial = True
                    if not config.keep_going:
                        result.stopped_by = "failed"
                compare(result)
                if on_update:  # the last write is the finished result; those before say so
                    last = result.stopped_by or i == len(jobs) - 1
                    on_update(result if last else unfinished(result))
                if result.stopped_by:
                    return result
    except Interrupted as e:
        if not again:  # (the ceiling's second run is no run of its own)
            result.runs.append(e.args[0])
        result.partial, result.stopped_by = True, "interrupted"
    except KeyboardInterrupt:  # between two runs
        result.partial, result.stopped_by = True, "interrupted"
    else:
        return result
    compare(result)
    if on_update:
        on_update(result)
    return result


def job_list(config: VerifyConfig, p: Plan) -> list[tuple[str, int, bool]]:
    """(loader, GPUs, again) in run order: at each count synthetic first, then the loaders, then
    (``ceiling_twice``) synthetic again, so that the host's drift under the loaders is seen."""
    twice = ceiling_twice(config, p)
    jobs = []
    for g in config.gpus:
        jobs += [(loader, g, False) for loader in p.loaders]
        if twice:
            jobs.append((SYNTHETIC, g, True))
    return jobs


def ceiling_twice(config: VerifyConfig, p: Plan) -> bool:
    """Whether the ceiling runs again after the loaders: asked, else on a GPU (a small batch's
    step there follows the host's speed, which moved ±10% between runs on one H200: issue 29);
    never without synthetic or a loader to bracket."""
    if SYNTHETIC not in p.loaders or all(n == SYNTHETIC for n in p.loaders):
        return False
    return config.ceiling_twice if config.ceiling_twice is not None else p.device == "cuda"


def fold_ceiling(result: VerifyResult, again: VerifyRun, unit: str) -> None:
    """The ceiling's second run at a count, into its first (``ceiling_after_images_per_s``,
    ``ceiling_drift``); one that failed is said in a warning, the first run then stands alone."""
    ceilings = (r for r in result.runs if r.loader == SYNTHETIC and r.gpus == again.gpus)
    first = next((r for r in ceilings if r.status == "ok"), None)
    if first is None or first.images_per_s <= 0:
        if again.status == "ok" and again.images_per_s > 0:  # (--keep-going past a failed one)
            result.runs.append(again)
            result.warnings.append(
                f"the synthetic ceiling's first run on {units(again.gpus, unit)} did not "
                "finish: the fractions there rest on its run after the loaders alone"
            )
        return
    if again.status != "ok" or again.images_per_s <= 0:
        result.warnings.append(
            f"the synthetic ceiling's second run on {units(again.gpus, unit)} did not finish "
            f"({again.error or again.status}): the fractions there rest on its first run alone"
        )
        return
    first.ceiling_after_images_per_s = again.images_per_s
    first.ceiling_drift = again.images_per_s / first.images_per_s - 1


def user_loader_notes(run: VerifyRun, p: Plan, num_classes: int) -> list[str]:
    """What to say about a run of the user's loader: labels made up (it gave images alone), or
    images of another size than the synthetic ceiling's (the fraction compares unlike work)."""
    notes = []
    if any(s.labels_synthesised for s in run.ranks):
        notes.append(
            f"{run.loader} yields images without labels: verify made them up (random, "
            f"{num_classes} classes), so the loss means nothing; the step times are as measured"
        )
    hw = next(((s.image_height, s.image_width) for s in run.ranks if s.image_height), None)
    if hw and hw != (p.image_size, p.image_size) and SYNTHETIC in p.loaders:
        notes.append(
            f"{run.loader} yields {hw[0]}×{hw[1]} images, the synthetic ceiling "
            f"{p.image_size}×{p.image_size} (--image-size): its share of the ceiling compares "
            "unlike steps; give --image-size the loader's size"
        )
    return notes


def failure(result: VerifyResult) -> str | None:
    """The error of the run that stopped the verify, or None."""
    return next((r.error for r in result.runs if r.status == "failed"), None)
