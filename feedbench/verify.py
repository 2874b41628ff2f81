"""``feedbench verify``: real DDP training per loader and GPU count, and whether the GPUs stay fed.

For every GPU count and loader (plus ``synthetic``, data already on the GPU: the compute +
communication ceiling) one torchrun job trains the model (:mod:`feedbench.verify_worker`, NCCL on
GPUs; gloo, a small CNN and low resolution on a machine without them). Each rank writes its own
part file; after every job the parent merges them into the results file, so a failed or
interrupted verify keeps every run measured before it, and the steps of the run that broke.

The parent watches each job: if a rank dies the job is stopped (torchrun first, then any process
of the job still alive, by pid), and Ctrl-C does the same; it never leaves processes behind.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from feedbench.errors import FeedbenchError
from feedbench.results import DatasetInfo, HostInfo, from_dict, now_utc
from feedbench.verify_loaders import (
    BASELINE,
    DALI_EXAMPLE,
    GPU_ONLY,
    LIBRARY,
    LOADERS,
    SYNTHETIC,
    batches_per_epoch,
    loader_options,
    option_value,
    unavailable,
)
from feedbench.verify_results import (
    KIND,
    StepSeries,
    VerifyResult,
    VerifyRun,
    compare,
    summarize_run,
    units,
    window_stats,
)
from feedbench.verify_worker import (
    COMPILE_MODES,
    CPU_AFFINITIES,
    DDP_OPTIONS,
    MODELS,
    STREAM_PRIORITIES,
)

SCALINGS = ("weak", "strong")
DEVICES = ("auto", "cuda", "cpu")
GPU_DEFAULTS = {"model": "resnet50", "image_size": 224, "batch_size": 256, "steps": 200,
                "warmup": 20}  # fmt: skip
CPU_DEFAULTS = {"model": "smallcnn", "image_size": 64, "batch_size": 16, "steps": 30, "warmup": 5}
STOP_GRACE_S = 5.0  # torchrun's time to stop its workers before everything is killed
RANK_DEATH_GRACE_S = 10.0  # a rank has died: torchrun's time to notice before we stop the job


@dataclass
class VerifyConfig:
    data: str
    gpus: tuple[int, ...] = (1, 2)
    loaders: tuple[str, ...] | None = None  # None: baseline + every library loader available
    synthetic: bool = True
    model: str | None = None  # None: resnet50 on GPU, smallcnn on CPU
    steps: int | None = None
    warmup: int | None = None
    batch_size: int | None = None  # per GPU (weak scaling) or global (strong scaling)
    scaling: str = "weak"
    image_size: int | None = None
    workers: int | None = None  # loader workers per rank (None: each loader's default)
    loader_options: tuple[str, ...] = ()  # [LOADER:]KEY=VALUE for the library loaders
    stream_priority: str = "normal"  # normal / high: the training stream's CUDA priority
    ddp_options: tuple[str, ...] = ()  # KEY=VALUE for DistributedDataParallel (DDP_OPTIONS)
    compile: str = "off"  # torch.compile mode for the model (COMPILE_MODES)
    cpu_affinity: str = "inherit"  # inherit / split: each rank pinned to its own share of the cores
    sync_each_step: bool = False  # diagnostic: the host waits for the GPU after taking each batch
    device: str = "auto"
    seed: int = 0
    num_classes: int = 1000
    target_au: float = 0.9
    run_timeout_s: float = 1800.0
    monitor_interval_s: float = 0.25
    keep_going: bool = False  # after a failed run, go on with the next ones
    fail_at_step: int | None = None  # test-only: a rank dies at this step
    fail_rank: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass
class Plan:
    """A config resolved against this machine and the data."""

    device: str  # cuda / cpu
    backend: str  # nccl / gloo
    unit: str  # GPU / CPU process
    model: str
    image_size: int
    batch_size: int
    steps: int
    warmup: int
    loaders: list[str]  # run order at each count: synthetic first
    sources: dict[str, str]  # loader → the path it reads
    samples: dict[str, int]  # source path → samples
    dataset: DatasetInfo | None
    warnings: list[str] = field(default_factory=list)
    options: dict[str, dict] = field(default_factory=dict)  # loader → build_loader options
    ddp_options: dict[str, Any] = field(default_factory=dict)  # DistributedDataParallel's

    def per_gpu_batch(self, scaling: str, gpus: int) -> int:
        return self.batch_size if scaling == "weak" else self.batch_size // gpus


def parse_list(text: str, what: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(x.strip().lower() for x in text.split(",") if x.strip()))
    if not names:
        raise FeedbenchError(f"{what} takes a comma-separated list (got {text!r})")
    return names


def parse_ddp_options(items: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``--ddp-option KEY=VALUE`` values → DistributedDataParallel keyword arguments, checked."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise FeedbenchError(f"--ddp-option takes KEY=VALUE, not {item!r}")
        if key not in DDP_OPTIONS:
            raise FeedbenchError(
                f"--ddp-option {key!r}: verify sets {', '.join(DDP_OPTIONS)} of DDP"
            )
        value = option_value(text)
        kinds = DDP_OPTIONS[key]
        if type(value) not in kinds:
            want = " or ".join("true/false" if k is bool else k.__name__ for k in kinds)
            raise FeedbenchError(f"--ddp-option {key} takes {want}, not {text!r}")
        out[key] = value
    return out


def parse_gpus(text: str) -> tuple[int, ...]:
    """``"1,2"`` → (1, 2): sorted, unique, each ≥ 1."""
    try:
        counts = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise FeedbenchError(f"--gpus takes counts like 1,2,4,8 (got {text!r})") from None
    if not counts or counts[0] < 1:
        raise FeedbenchError(f"--gpus takes counts ≥ 1 (got {text!r})")
    return tuple(counts)


def cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_gpus(asked: tuple[int, ...], present: int) -> None:
    """More GPUs asked than this machine has: one clear error."""
    if present == 0:
        raise FeedbenchError(
            "--device cuda: no CUDA GPU is visible here (use --device cpu, or leave --device "
            "auto to train on the CPU)"
        )
    if max(asked) > present:
        raise FeedbenchError(
            f"--gpus asks for {max(asked)} GPUs; this machine has {present} "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
        )


def count_samples(path: str) -> tuple[DatasetInfo, int]:
    """What is at ``path`` and how many usable samples it holds, as the loaders index it."""
    from loaders.data import locate, open_index
    from loaders.errors import LoaderError

    try:
        layout = locate(path)
        n = len(open_index(layout))
    except LoaderError as e:
        raise FeedbenchError(str(e)) from None
    info = DatasetInfo(
        path=os.path.abspath(path),
        format=layout.kind,
        files=len(layout.files),
        bytes=layout.total_bytes,
        samples=n,
    )
    return info, n


def sources_for(data: str) -> dict[str, str]:
    """The path each loader reads. A feedbench sample root (``images/`` and ``shards/``): the
    tree for baseline, torch and dali, the shards for wds; any other path: the path itself."""
    from loaders.data.layout import SAMPLE_SHARDS, SAMPLE_TREE

    tree, shards = os.path.join(data, SAMPLE_TREE), os.path.join(data, SAMPLE_SHARDS)
    if os.path.isdir(tree) and os.path.isdir(shards):
        return {BASELINE: tree, DALI_EXAMPLE: tree, "torch": tree, "dali": tree, "wds": shards}
    return {name: data for name in (BASELINE, DALI_EXAMPLE, *LIBRARY)}


def plan(config: VerifyConfig) -> Plan:
    """Check every option against this machine and the data; raise FeedbenchError on bad input."""
    if config.device not in DEVICES:
        raise FeedbenchError(f"--device takes {', '.join(DEVICES)} (got {config.device!r})")
    if config.scaling not in SCALINGS:
        raise FeedbenchError(f"--scaling takes weak or strong (got {config.scaling!r})")
    if not config.gpus or min(config.gpus) < 1:
        raise FeedbenchError("--gpus takes counts ≥ 1")
    present = cuda_count()
    device = config.device if config.device != "auto" else ("cuda" if present else "cpu")
    if device == "cuda":
        check_gpus(config.gpus, present)
    defaults = GPU_DEFAULTS if device == "cuda" else CPU_DEFAULTS
    model = config.model or defaults["model"]
    if model not in MODELS:
        raise FeedbenchError(f"unknown model {model!r}: choose from {', '.join(MODELS)}")
    image_size = config.image_size or defaults["image_size"]
    batch = config.batch_size or defaults["batch_size"]
    steps = config.steps if config.steps is not None else defaults["steps"]
    warmup = config.warmup if config.warmup is not None else defaults["warmup"]
    if image_size < 16:
        raise FeedbenchError("--image-size must be at least 16 pixels")
    if batch < 1:
        raise FeedbenchError("--batch-size must be at least 1")
    if steps < 1:
        raise FeedbenchError("--steps must be at least 1")
    if warmup < 0:
        raise FeedbenchError("--warmup must be 0 or more")
    if config.workers is not None and config.workers < 0:
        raise FeedbenchError("--workers must be 0 or more")
    if not 0 < config.target_au <= 1:
        raise FeedbenchError("--target-au must be within (0, 1]")
    if config.stream_priority not in STREAM_PRIORITIES:
        raise FeedbenchError(
            f"--stream-priority takes {' or '.join(STREAM_PRIORITIES)} "
            f"(got {config.stream_priority!r})"
        )
    if config.stream_priority != "normal" and device != "cuda":
        raise FeedbenchError("--stream-priority is a CUDA stream setting: it needs --device cuda")
    if config.sync_each_step and device != "cuda":
        raise FeedbenchError("--sync-each-step waits for the GPU: it needs --device cuda")
    ddp_options = parse_ddp_options(config.ddp_options)
    if config.compile not in COMPILE_MODES:
        raise FeedbenchError(f"--compile takes {', '.join(COMPILE_MODES)} (got {config.compile!r})")
    if config.cpu_affinity not in CPU_AFFINITIES:
        raise FeedbenchError(
            f"--cpu-affinity takes {' or '.join(CPU_AFFINITIES)} (got {config.cpu_affinity!r})"
        )
    if config.scaling == "strong":
        bad = [g for g in config.gpus if batch % g]
        if bad:
            raise FeedbenchError(
                f"strong scaling splits the global batch {batch} over the GPUs: it does not "
                f"divide by {bad[0]}"
            )
    warnings: list[str] = []
    cores = os.cpu_count() or 1
    if device == "cpu":
        warnings.append(
            "no GPU: each rank trains on one CPU core (gloo) while its loader shares the same "
            "cores, so these figures test the whole path; they do not predict GPU training"
        )
    if device == "cpu" and max(config.gpus) > cores:
        warnings.append(
            f"{max(config.gpus)} CPU processes on {cores} cores: they share cores, so the "
            "scaling says little"
        )
    # loaders: explicit names must exist and be usable; the default takes what is available
    if config.loaders is None:
        names = [BASELINE]
        for name in (DALI_EXAMPLE, *LIBRARY):
            if name in GPU_ONLY and device != "cuda":
                continue
            why = unavailable(name)
            if why:
                warnings.append(f"loader {name} left out: {why}")
            else:
                names.append(name)
    else:
        names = list(config.loaders)
        for name in names:
            if name not in LOADERS:
                raise FeedbenchError(f"unknown loader {name!r}: choose from {', '.join(LOADERS)}")
            why = unavailable(name)
            if why:
                raise FeedbenchError(f"loader {name} is unavailable: {why}")
            if name in GPU_ONLY and device != "cuda":
                raise FeedbenchError(f"loader {name} decodes on the GPU: it needs --device cuda")
    real = [n for n in names if n != SYNTHETIC]
    options = loader_options(config.loader_options, real)
    order = ([SYNTHETIC] if config.synthetic or SYNTHETIC in names else []) + real
    # the data: it must exist, and hold a full batch per rank at the largest count
    sources = sources_for(config.data)
    samples: dict[str, int] = {}
    infos: dict[str, DatasetInfo] = {}
    dataset = None
    if not (os.path.exists(config.data) or "{" in config.data or glob.has_magic(config.data)):
        raise FeedbenchError(f"no such file or directory: {config.data}")
    for name in real:
        path = sources[name]
        if path not in samples:
            infos[path], samples[path] = count_samples(path)
        if dataset is None or name == BASELINE:
            dataset = infos[path]
        if name in (BASELINE, DALI_EXAMPLE) and infos[path].format != "tree":
            raise FeedbenchError(
                f"the {name} loader reads an image tree (ImageFolder); {path} holds tar shards"
            )
    if dataset is None:  # synthetic only: describe the data anyway
        dataset, n = count_samples(config.data)
        samples[config.data] = n
    for name in real:
        n = samples[sources[name]]
        for g in config.gpus:
            per = batch if config.scaling == "weak" else batch // g
            if batches_per_epoch(n, g, per) < 1:
                raise FeedbenchError(
                    f"{sources[name]} has {n} images: too few for a batch of {per} on each of "
                    f"{units(g, 'GPU' if device == 'cuda' else 'CPU process')} "
                    f"(needs at least {per * g}); use a smaller --batch-size or more data"
                )
    for name in real:
        n = samples[sources[name]]
        g = max(config.gpus)
        per = batch if config.scaling == "weak" else batch // g
        if batches_per_epoch(n, g, per) < 5:
            warnings.append(
                f"{name}: only {batches_per_epoch(n, g, per)} batches per epoch at {g} ranks: "
                "epoch starts weigh on the steps; use more data for steadier figures"
            )
            break
    return Plan(
        device=device,
        backend="nccl" if device == "cuda" else "gloo",
        unit="GPU" if device == "cuda" else "CPU process",
        model=model,
        image_size=image_size,
        batch_size=batch,
        steps=steps,
        warmup=warmup,
        loaders=order,
        sources=sources,
        samples=samples,
        dataset=dataset,
        warnings=warnings,
        options=options,
        ddp_options=ddp_options,
    )


def new_result(config: VerifyConfig, p: Plan) -> VerifyResult:
    cfg = config.as_dict() | {
        "device": p.device,
        "backend": p.backend,
        "unit": p.unit,
        "model": p.model,
        "image_size": p.image_size,
        "batch_size": p.batch_size,
        "steps": p.steps,
        "warmup": p.warmup,
        "loaders": p.loaders,
        "options_per_loader": p.options,
        "ddp_options": p.ddp_options,
        "sources": {k: v for k, v in p.sources.items() if k in p.loaders},
        "precision": "bf16 autocast, channels_last" if p.device == "cuda" else "fp32",
        "optimizer": "SGD lr 0.01 momentum 0.9 wd 1e-4",
        "data_bound_above": round(1 - config.target_au, 6),
    }
    for k in ("fail_at_step", "fail_rank"):
        if cfg.get(k) is None:
            cfg.pop(k, None)
    return VerifyResult(
        kind=KIND,
        created_utc=now_utc(),
        command=["feedbench", *sys.argv[1:]],
        config=cfg,
        host=HostInfo.current(),
        dataset=p.dataset,
        warnings=list(p.warnings),
    )


# --- one torchrun job -----------------------------------------------------------------------------


class Interrupted(Exception):
    """Ctrl-C during a run."""


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
        "-m", "feedbench.verify_worker",
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
    if config.fail_at_step is not None:
        cmd += ["--fail-at-step", str(config.fail_at_step)]
        if config.fail_rank is not None:
            cmd += ["--fail-rank", str(config.fail_rank)]
    return cmd


def _job_env(p: Plan, gpus: int) -> dict[str, str]:
    env = dict(os.environ)
    root = _project_root()
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if p.device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = "1"  # one core of compute per CPU rank, as one GPU per rank
    return env


def _alive(procs: dict[int, psutil.Process]) -> list[psutil.Process]:
    out = []
    for proc in procs.values():
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:
            continue
    return out


def _stop(top: subprocess.Popen) -> None:
    """SIGTERM to torchrun (it stops its workers); after a grace, SIGKILL to every process of the
    job still alive, each by the pid we saw it with (psutil checks it is still that process)."""
    if top.poll() is None:
        top.send_signal(signal.SIGTERM)
        try:
            top.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            top.kill()
            top.wait()


JOB_TAG = "FEEDBENCH_VERIFY_JOB"  # in every process of a job: found by it, even orphaned


def job_processes(tag: str) -> list[psutil.Process]:
    """The live processes carrying ``JOB_TAG=tag`` in their environment (ours: same user)."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(JOB_TAG) == tag and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _reap(tag: str, known: dict[int, psutil.Process], grace_s: float) -> int:
    """End every process of the job still alive (loader workers orphaned by a dead rank, ...):
    SIGTERM, then SIGKILL after ``grace_s``; each by its pid, checked to be that process."""
    left = {p.pid: p for p in _alive(known)} | {p.pid: p for p in job_processes(tag)}
    if not left:
        return 0
    for proc in left.values():
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, still = psutil.wait_procs(list(left.values()), timeout=grace_s)
    for proc in still:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(still, timeout=2)
    return len(left)


def run_job(cmd: list[str], env: dict[str, str], log_path: str, timeout_s: float) -> JobOutcome:
    """Run one torchrun job to its end, a rank's death, the timeout or Ctrl-C; leave nothing."""
    t0 = time.monotonic()
    tag = uuid.uuid4().hex
    env = env | {JOB_TAG: tag}
    known: dict[int, psutil.Process] = {}
    ranks: dict[int, psutil.Process] = {}
    interrupted = timed_out = rank_died = False
    died_at: float | None = None
    with open(log_path, "wb") as log:
        top = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            last_scan = 0.0
            while True:
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
                            ranks.setdefault(child.pid, child)
                    except psutil.Error:
                        pass
                    if died_at is None and ranks and len(_alive(ranks)) < len(ranks):
                        died_at = now  # a rank is gone while torchrun still runs
                if died_at is not None and now - died_at > RANK_DEATH_GRACE_S:
                    rank_died = True
                    _stop(top)
                    break
                if now - t0 > timeout_s:
                    timed_out = True
                    _stop(top)
                    break
        except KeyboardInterrupt:
            interrupted = True
            _stop(top)
        finally:
            if top.poll() is None:
                _stop(top)
            leftover = _reap(tag, known, grace_s=3.0)
    return JobOutcome(
        top.returncode, interrupted, timed_out, rank_died, time.monotonic() - t0, leftover
    )


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
    """(rank, exit code) of torchrun's "Root Cause (first observed failure)", else its first."""
    i = log_text.find("Root Cause")
    m = _RANK_BLOCK.search(log_text, i if i >= 0 else 0) or _RANK_BLOCK.search(log_text)
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


def monitor_start(interval_s: float):
    try:
        from feedbench.monitor import Monitor
    except ImportError:  # pragma: no cover
        return None, 0.0
    m = Monitor(interval_s=interval_s)
    t0 = time.monotonic()
    m.start()
    return m, t0


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
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
            log_path = os.path.join(log_dir, f"{loader}-{gpus}.log")
        else:
            log_path = os.path.join(out_dir, "torchrun.log")
        cmd = worker_command(config, p, loader, gpus, out_dir)
        monitor, mono0 = monitor_start(config.monitor_interval_s)
        try:
            outcome = run_job(cmd, _job_env(p, gpus), log_path, config.run_timeout_s)
        finally:
            timeline = monitor.stop() if monitor is not None else None
        if monitor is not None and timeline is not None:
            timeline.label = f"{loader}, {units(gpus, p.unit)}"
        series, done = read_parts(out_dir, gpus)
        run.ranks = sorted(series, key=lambda s: s.rank)
        run.total_s = outcome.total_s
        run.log = log_path if log_dir else None
        run.monitor = timeline
        run.workers = next((s.workers for s in run.ranks if s.workers is not None), None)
        run.cpus = [s.cpus for s in run.ranks] if any(s.cpus for s in run.ranks) else None
        run.epochs = max((max(s.epoch) + 1 for s in run.ranks if s.epoch), default=0)
        complete = (
            outcome.returncode == 0
            and not (outcome.interrupted or outcome.timed_out or outcome.rank_died)
            and len(done) == gpus
            and all(done.values())
        )
        if not complete:
            try:
                log_text = Path(log_path).read_text(errors="replace")
            except OSError:
                log_text = ""
            run.status = "interrupted" if outcome.interrupted else "failed"
            run.error = explain_failure(loader, gpus, p.unit, log_text, run.ranks, outcome)
            run.partial = True
        summarize_run(run)
        starts = [s.window_start_mono for s in run.ranks if s.window_start_mono is not None]
        ends = [s.window_end_mono for s in run.ranks if s.window_end_mono is not None]
        if timeline is not None and starts:
            a = min(starts) - mono0
            b = (max(ends) if ends and len(ends) == len(starts) else time.monotonic()) - mono0
            run.window_t_s = [a, b]
            used = list(range(gpus)) if p.device == "cuda" else None
            stats = window_stats(timeline, a, b, used)
            run.cpu_percent_mean = stats.get("cpu_percent_mean")
            run.busy_cores_mean = stats.get("busy_cores_mean")
            run.gpu_util_percent_mean = stats.get("gpu_util_percent_mean")
            run.gpu_sm_clock_mhz_min = stats.get("gpu_sm_clock_mhz_min")
            run.gpu_power_w_mean = stats.get("gpu_power_w_mean")
            mem = stats.get("gpu_mem_used_bytes_max")
            run.gpu_mem_used_bytes_max = int(mem) if mem is not None else None
        if outcome.interrupted:
            raise Interrupted(run)
        return run
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM to this process does what Ctrl-C does (stop the job, keep the results)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


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
    jobs = [(loader, g) for g in config.gpus for loader in p.loaders]
    try:
        with sigterm_as_interrupt():
            for i, (loader, g) in enumerate(jobs):
                if on_run:
                    on_run(loader, g, i, len(jobs))
                run = run_one(config, p, loader, g, log_dir)
                result.runs.append(run)
                if run.status != "ok":
                    result.partial = True
                    if not config.keep_going:
                        result.stopped_by = "failed"
                compare(result)
                if on_update:
                    on_update(result)
                if result.stopped_by:
                    return result
    except Interrupted as e:
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


def failure(result: VerifyResult) -> str | None:
    """The error of the run that stopped the verify, or None."""
    return next((r.error for r in result.runs if r.status == "failed"), None)
