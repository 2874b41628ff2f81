"""Run a scan: N consumer processes (torch.distributed, gloo) per count, gathered at rank 0.

Locally, :func:`scan` spawns the consumers for each count in turn. Across machines, start
``python -m feedbench.consumer`` under torchrun on every node: :func:`run_under_torchrun`.
Rank 0 gathers every consumer's numbers after each measurement, so the results file grows as the
scan goes and an interrupted or failed scan keeps what was measured.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
import psutil

from feedbench import cache
from feedbench.consumer import StepOptions, consumer_units, merge_stages, run_consumer
from feedbench.errors import FeedbenchError
from feedbench.exit import leave_without_finalizing
from feedbench.profiles import get_profile
from feedbench.results import (
    CacheState,
    DatasetInfo,
    HostInfo,
    Measurement,
    SampleError,
    ScanResult,
    now_utc,
)
from feedbench.scan.sources import Source, detect, shared_listing
from feedbench.sweep import curve, default_workers, find_max, max_consumers_default

PASSES = ("cold", "warm")


@dataclass
class ScanConfig:
    path: str
    stages: tuple[str, ...] = ("read", "decode", "augment")
    batch_size: int | None = None  # None: the profile's batch, else 64
    passes: tuple[str, ...] = ("cold",)
    consumers: tuple[int, ...] = (1,)
    workers: int | None = None  # per consumer; None: cores divided fairly
    repeat: int = 1
    fmt: str = "auto"
    image_size: int = 224
    drop_caches: bool = False
    direct: bool = False
    step_s: float | None = None
    rate: float | None = None  # samples/s per accelerator
    profile: str | None = None
    async_steps: bool = False
    warmup_batches: int = 1
    read_latency_s: float = 0.0
    read_ahead_mb: float = 0.0  # shards: MiB the kernel is asked to read ahead (0: its own)
    read_thread: bool = True  # a reading thread per local shard, `--stages read` only (open_source)
    target_au: float = 0.9
    find_max: bool = False
    max_consumers: int | None = None
    seed: int = 0
    monitor_interval_s: float = 0.25
    loader: str | None = None  # measure a loaders backend end to end: torch, dali or wds

    def as_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ScanConfig:
        names = ScanConfig.__dataclass_fields__
        return ScanConfig(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in names}
        )


@dataclass
class Plan:
    """What a config resolves to: batch size, emulated step, the accelerator it stands for."""

    batch_size: int
    step_s: float = 0.0
    accelerator: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)


def parse_passes(text: str) -> tuple[str, ...]:
    names = tuple(p.strip().lower() for p in text.split(",") if p.strip())
    bad = [p for p in names if p not in PASSES]
    if not names or bad:
        raise FeedbenchError(f"--passes takes cold, warm or cold,warm (got {text!r})")
    return names


def plan(config: ScanConfig) -> Plan:
    given = [x for x in (config.step_s, config.rate, config.profile) if x is not None]
    if len(given) > 1:
        raise FeedbenchError("give one of --step-time, --rate and --profile, not several")
    if config.batch_size is not None and config.batch_size < 1:
        raise FeedbenchError("--batch-size must be at least 1")
    if config.profile is not None:
        prof = get_profile(config.profile)
        bs = config.batch_size or prof.batch_size
        acc = prof.as_dict() | {"step_s": prof.step_s(bs), "kind": "profile"}
        return Plan(bs, prof.step_s(bs), acc)
    bs = config.batch_size or 64
    if config.rate is not None:
        if config.rate <= 0:
            raise FeedbenchError("--rate must be positive (samples per second per accelerator)")
        acc = {
            "kind": "rate",
            "samples_per_s": config.rate,
            "step_s": bs / config.rate,
            "batch_size": bs,
            "name": f"{config.rate:g} samples/s",
        }
        return Plan(bs, bs / config.rate, acc)
    if config.step_s is not None:
        if config.step_s <= 0:
            raise FeedbenchError("--step-time must be positive (seconds per batch)")
        acc = {
            "kind": "step",
            "samples_per_s": bs / config.step_s,
            "step_s": config.step_s,
            "batch_size": bs,
            "name": f"{config.step_s:g} s/step",
        }
        return Plan(bs, config.step_s, acc)
    return Plan(bs)


def open_source(config: ScanConfig) -> tuple[Source, list[str]]:
    source, notes = detect(config.path, config.fmt)
    # THE READING THREAD (local shards) only where reading is the whole job, the storage test
    # (`--stages read`): there the tar walk must not stand in for the storage. In a pipeline a
    # worker reads in series with its other stages, as a WebDataset worker does, and each stage's
    # time stays its own (a thread would turn the read stage's time into time spent waiting and
    # "read alone would run N× faster" into a guess). The results record what was used.
    config.read_thread = bool(
        config.read_thread
        and source.kind == "shards"
        and not source.remote
        and not config.read_ahead_mb
        and tuple(config.stages) == ("read",)
        and config.loader is None
    )
    source.set_options(
        direct=config.direct,
        latency_s=config.read_latency_s,
        read_ahead=int(config.read_ahead_mb * (1 << 20)),
        read_thread=config.read_thread,
    )
    return source, notes


def _check_direct(source: Source) -> None:
    from loaders.data import read_file

    try:
        read_file(str(source.files()[0]), direct=True)
    except OSError as e:
        raise FeedbenchError(
            f"--direct: O_DIRECT reads fail on this filesystem ({e.strerror or e})"
        ) from e


def _check_loader(backend: str) -> None:
    if backend not in ("torch", "dali", "wds"):
        raise FeedbenchError(f"unknown loader {backend!r}: choose torch, dali or wds")
    if backend == "dali":
        try:
            import nvidia.dali  # noqa: F401
        except ImportError:
            raise FeedbenchError(
                "--loader dali needs NVIDIA DALI: pip install 'feedbench[dali]'"
            ) from None
    if backend == "wds":
        try:
            import webdataset  # noqa: F401
        except ImportError:
            raise FeedbenchError("--loader wds needs webdataset: pip install webdataset") from None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare_cache(name: str, files, drop: bool) -> tuple[CacheState, list[str]]:
    """Evict before a cold pass (and say how cold it really is); leave the cache for warm."""
    warnings: list[str] = []
    if name == "warm":
        resident = cache.residency(files).fraction
        if resident < 0.95:  # a warm pass must be warm: read everything once first
            cache.warm(files)
            resident = cache.residency(files).fraction
            if resident < 0.95:
                warnings.append(
                    f"only {resident:.0%} of the data fits in the page cache: the warm pass is "
                    "partly cold"
                )
        return CacheState("warm", resident), warnings
    failures = cache.evict(files)
    if drop and not cache.drop_all_caches():
        warnings.append("--drop-caches needs root: only per-file eviction was done")
    resident = cache.residency(files).fraction
    if resident > 0.05:
        warnings.append(
            f"{resident:.0%} of the data stayed in the page cache after eviction "
            "(this filesystem ignores fadvise?): the cold pass is partly warm; try --drop-caches"
        )
    return CacheState("cold", resident, failures), warnings


# --- one rank ---------------------------------------------------------------------------------


@dataclass
class RankOutcome:
    measurement: Measurement
    errors: list[SampleError]
    warnings: list[str]


def run_rank(
    rank: int,
    world: int,
    local_rank: int,
    config: ScanConfig,
    init_method: str,
    workers: int,
    on_measurement: Callable[[RankOutcome], None] | None = None,
    progress: Callable[[int], None] | None = None,
) -> None:
    """One consumer process: every pass × repeat of ``config`` at this world size."""
    import torch
    import torch.distributed as tdist

    tdist.init_process_group(
        "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world,
        timeout=timedelta(minutes=30),
    )
    try:
        p = plan(config)
        source, _ = open_source(config)
        device = None
        wants_gpu = "transfer" in config.stages or config.loader is not None
        if wants_gpu and torch.cuda.is_available():
            device = torch.device("cuda", local_rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        steps = StepOptions(p.step_s, not config.async_steps, config.warmup_batches)
        loader = None
        if config.loader is not None:
            from loaders import build_loader

            loader = build_loader(
                config.path, config.loader, p.batch_size, image_size=config.image_size,
                rank=rank, world_size=world, local_rank=local_rank, seed=config.seed,
                workers=workers, device=device,
            )  # fmt: skip
        epoch = 0
        for pass_name in config.passes:
            for repeat in range(1, config.repeat + 1):
                state, warnings = CacheState(pass_name, None), []
                if local_rank == 0 and not source.remote:
                    state, warnings = prepare_cache(pass_name, source.files(), config.drop_caches)
                tdist.barrier()
                monitor = (
                    _start_monitor(f"{world} consumers, {pass_name}, repeat {repeat}", config)
                    if rank == 0
                    else None
                )
                units = consumer_units(source, rank, world, seed=config.seed, epoch=epoch)
                batches = None
                if loader is not None:
                    from feedbench.consumer import loader_batches

                    loader.set_epoch(epoch)
                    batches = loader_batches(loader)
                stats, errors, raw = run_consumer(
                    source,
                    units,
                    config.stages,
                    rank=rank,
                    batch_size=p.batch_size,
                    workers=workers,
                    image_size=config.image_size,
                    seed=config.seed + epoch,
                    steps=steps,
                    device=device,
                    group=tdist.group.WORLD,
                    progress=progress,
                    batches=batches,
                    loader_name=config.loader,
                )
                if loader is not None:
                    # the loaders run ahead into the next epoch (workers, DALI's prefetch): stop
                    # them here, so that nothing of the next pass is read before its cache
                    # eviction or done before its clock starts; each pass starts the loader anew
                    loader.close()
                timeline = monitor.stop() if monitor is not None else None
                gathered: list[Any] | None = [None] * world if rank == 0 else None
                tdist.gather_object((stats, errors, raw), gathered, dst=0)
                if rank == 0 and on_measurement is not None:
                    assert gathered is not None
                    m = build_measurement(
                        gathered, world, workers, pass_name, repeat, state, timeline
                    )
                    errs = [e for _, es, _ in gathered for e in es]
                    on_measurement(RankOutcome(m, errs, warnings))
                epoch += 1
    finally:
        with contextlib.suppress(Exception):
            tdist.destroy_process_group()


def _start_monitor(label: str, config: ScanConfig):
    try:
        from feedbench.monitor import Monitor
    except ImportError:  # monitor not available in this build
        return None
    m = Monitor(interval_s=config.monitor_interval_s, label=label)
    m.start()
    return m


def build_measurement(gathered, world, workers, pass_name, repeat, state, timeline) -> Measurement:
    stats = sorted((s for s, _, _ in gathered), key=lambda s: s.rank)
    pooled = {
        name: np.concatenate([raw[name] for _, _, raw in gathered if name in raw])
        for name in {n for _, _, raw in gathered for n in raw}
    }
    wall = max(s.wall_s for s in stats)
    samples = sum(s.samples for s in stats)
    read_bytes = sum(s.read_bytes for s in stats)
    files = sum(s.files for s in stats)
    steady = [s.steady_samples_per_s for s in stats]
    aus = [s.au for s in stats if s.au is not None]
    firsts = [s.first_batch_s for s in stats if s.first_batch_s is not None]
    return Measurement(
        consumers=world,
        workers=workers,
        pass_name=pass_name,
        repeat=repeat,
        samples=samples,
        files=files,
        read_bytes=read_bytes,
        errors=sum(s.errors for s in stats),
        batches=sum(s.batches for s in stats),
        wall_s=wall,
        first_batch_s=max(firsts) if firsts else None,
        samples_per_s=samples / wall if wall > 0 else 0.0,
        steady_samples_per_s=float(sum(steady)) if all(x is not None for x in steady) else None,
        mb_per_s=read_bytes / wall / 1e6 if wall > 0 else 0.0,
        files_per_s=files / wall if wall > 0 else 0.0,
        stages=merge_stages([s.stages for s in stats], pooled),
        cache=state,
        per_consumer=stats,
        au_mean=float(np.mean(aus)) if aus else None,
        au_min=float(min(aus)) if aus else None,
        monitor=timeline,
    )


def _spawned(
    local_rank: int,
    world: int,
    config_dict: dict,
    init_method: str,
    workers: int,
    out_path: str,
    done_bytes: Any,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    outcomes: list[RankOutcome] = []

    def keep(o: RankOutcome) -> None:
        outcomes.append(o)
        tmp = out_path + ".tmp"
        with open(tmp, "wb") as f:
            pickle.dump(outcomes, f)
        os.replace(tmp, out_path)

    def progress(nbytes: int) -> None:
        done_bytes[local_rank] += nbytes  # one writer per slot: no lock needed

    run_rank(
        local_rank,
        world,
        local_rank,
        ScanConfig.from_dict(config_dict),
        init_method,
        workers,
        keep,
        progress,
    )
    leave_without_finalizing()


class Interrupted(Exception):
    """Ctrl-C during a count: what was measured before it is kept."""


def run_count(
    config: ScanConfig,
    n: int,
    workers: int,
    on_progress: Callable[[int], None] | None = None,
) -> list[RankOutcome]:
    """Spawn ``n`` local consumers, run every pass × repeat, return rank 0's gathered outcomes.

    ``on_progress(bytes read so far, all consumers)`` is called about twice a second.
    """
    import multiprocessing

    import torch.multiprocessing as mp

    done_bytes = multiprocessing.get_context("spawn").Array("q", n, lock=False)

    fd, out_path = tempfile.mkstemp(prefix="feedbench-", suffix=".pkl")
    os.close(fd)
    os.unlink(out_path)
    init = f"tcp://127.0.0.1:{_free_port()}"
    ctx = mp.start_processes(
        _spawned,
        args=(n, config.as_dict(), init, workers, out_path, done_bytes),
        nprocs=n,
        join=False,
        start_method="spawn",
    )
    failure: str | None = None
    interrupted = False
    try:
        while not ctx.join(timeout=0.5):
            if on_progress is not None:
                on_progress(sum(done_bytes))
    except KeyboardInterrupt:
        interrupted = True
    except mp.ProcessRaisedException as e:
        failure = f"consumer {e.error_index} failed: {_last_line(str(e))}"
    except mp.ProcessExitedException as e:
        failure = f"consumer {e.error_index} died (exit code {e.exit_code})"
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.terminate()
        for proc in ctx.processes:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    outcomes: list[RankOutcome] = []
    if os.path.exists(out_path):
        with open(out_path, "rb") as f:
            outcomes = pickle.load(f)
        os.unlink(out_path)
    if interrupted:
        raise Interrupted(outcomes)
    if failure:
        raise _CountFailed(failure, outcomes)
    return outcomes


class _CountFailed(FeedbenchError):
    def __init__(self, message: str, outcomes: list[RankOutcome]) -> None:
        super().__init__(message)
        self.outcomes = outcomes


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else text
    for prefix in ("feedbench.errors.FeedbenchError: ", "FeedbenchError: "):
        if last.startswith(prefix):
            return last[len(prefix) :]
    return last


# --- the whole scan -----------------------------------------------------------------------------


def new_result(config: ScanConfig, source: Source, notes: list[str], p: Plan) -> ScanResult:
    dataset = DatasetInfo(
        path=os.path.abspath(config.path),
        format=source.kind,
        files=len(source.files()),
        bytes=source.total_bytes(),
        samples=source.samples_hint(),
    )
    cfg = config.as_dict() | {"batch_size": p.batch_size}
    result = ScanResult(
        kind="scan",
        created_utc=now_utc(),
        command=["feedbench", *sys.argv[1:]],
        config=cfg,
        host=HostInfo.current(),
        dataset=dataset,
        accelerator=p.accelerator,
        warnings=list(notes) + p.warnings,
    )
    ram = psutil.virtual_memory().total
    if source.remote:
        result.warnings.append(
            "remote source: 'cold' means this machine holds no copy (reads bypass any client "
            "cache); the server's own caches are out of feedbench's reach, so a second pass may "
            "be served from its memory"
        )
    elif dataset.bytes < 5 * ram:
        result.warnings.append(
            f"dataset ({dataset.bytes / 1e9:.2f} GB) is smaller than 5× RAM ({ram / 1e9:.0f} GB): "
            "in training it would stay in the page cache after the first epoch; the cold pass "
            "shows first-epoch speed, the warm pass later epochs"
        )
    return result


def validate(config: ScanConfig) -> tuple[Source, list[str], Plan]:
    if config.repeat < 1:
        raise FeedbenchError("--repeat must be at least 1")
    if config.workers is not None and config.workers < 0:
        raise FeedbenchError("--workers must be 0 or more")
    if config.warmup_batches < 0:
        raise FeedbenchError("--warmup-batches must be 0 or more")
    if config.read_latency_s < 0:
        raise FeedbenchError("--read-latency must be 0 or more")
    if not 0 <= config.read_ahead_mb <= 1024:
        raise FeedbenchError("--read-ahead takes 0 to 1024 MiB")
    if not 0 < config.target_au <= 1:
        raise FeedbenchError("--target-au must be within (0, 1]")
    p = plan(config)
    if config.loader is not None:
        _check_loader(config.loader)
    if config.find_max and p.step_s <= 0:
        raise FeedbenchError("--find-max needs an accelerator: --profile, --rate or --step-time")
    source, notes = open_source(config)
    if source.remote and (config.direct or config.drop_caches):
        raise FeedbenchError(
            f"--{'direct' if config.direct else 'drop-caches'} controls this machine's page "
            f"cache; {config.path} is read over the network"
        )
    if config.read_ahead_mb:
        why = None
        if source.remote:
            why = "it reads over the network"
        elif config.direct:
            why = "with --direct there is no page cache to fill"
        elif source.kind != "shards":
            why = "it applies to tar shards, not an image tree"
        elif config.loader is not None:
            why = "it does not apply to --loader, which reads with the loader's own reader"
        if why:
            raise FeedbenchError(f"--read-ahead: {config.path}: {why}")
    if source.remote and config.loader is not None:
        raise FeedbenchError("--loader reads local paths; scan the URL without --loader")
    if config.direct:
        _check_direct(source)
    biggest = max(config.consumers)
    if source.kind == "shards" and source.units() < biggest:
        raise FeedbenchError(
            f"{source.units()} tar shards cannot feed {biggest} consumers: each consumer reads "
            "whole shards; use fewer consumers or more shards"
        )
    return source, notes, p


def scan(
    config: ScanConfig,
    *,
    on_update: Callable[[ScanResult], None] | None = None,
    on_count: Callable[[int, int, int], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> ScanResult:
    """Measure every consumer count (and search for the maximum when asked).

    ``on_update`` gets the result after every count (for saving); ``on_count(n, workers, bytes)``
    is told when a count starts and ``on_progress(bytes)`` as it goes. Ctrl-C returns the
    result so far, marked partial.
    """
    source, notes, p = validate(config)
    if not source.remote:
        return _scan(config, source, notes, p, on_update, on_count, on_progress)
    with shared_listing(source, config.path, config.fmt):  # consumers do not list it again
        return _scan(config, source, notes, p, on_update, on_count, on_progress)


def _scan(config, source, notes, p, on_update, on_count, on_progress) -> ScanResult:
    result = new_result(config, source, notes, p)
    cores = os.cpu_count() or 1
    done: dict[int, bool] = {}

    def measure(n: int) -> bool:
        workers = config.workers if config.workers is not None else default_workers(n, cores)
        if source.kind == "shards" and workers > 0 and source.units() < n * workers:
            result.warnings.append(
                f"{n} consumers × {workers} workers > {source.units()} shards: some workers idle"
            )
        if on_count:  # (consumers, workers, bytes the count will read, about)
            on_count(n, workers, result.dataset.bytes * len(config.passes) * config.repeat)
        try:
            outcomes = run_count(config, n, workers, on_progress)
        except Interrupted as e:
            _absorb(result, e.args[0])
            result.partial = True
            raise
        except _CountFailed as e:
            _absorb(result, e.outcomes)
            result.partial = True
            raise
        _absorb(result, outcomes)
        result.curve = curve(result.measurements)
        if on_update:
            on_update(result)
        point = next(
            (c for c in result.curve if c.consumers == n and c.pass_name == config.passes[0]), None
        )
        ok = point is not None and point.au_mean is not None and point.au_mean >= config.target_au
        done[n] = ok
        return ok

    try:
        for n in config.consumers:
            measure(n)
        if config.find_max:
            limit = config.max_consumers or max_consumers_default(cores)
            best, tried = find_max(measure, limit=limit, known=done)
            result.config["find_max_result"] = {
                "supported_consumers": best,
                "tried": {str(k): v for k, v in tried.items()},
                "limit": limit,
            }
    except Interrupted:
        pass
    except _CountFailed as e:
        result.curve = curve(result.measurements)
        _finish(result, config)
        if on_update:
            on_update(result)
        raise FeedbenchError(str(e)) from None
    result.curve = curve(result.measurements)
    _finish(result, config)
    return result


def _absorb(result: ScanResult, outcomes: list[RankOutcome]) -> None:
    for o in outcomes:
        result.measurements.append(o.measurement)
        room = 20 - len(result.errors)
        if room > 0:
            result.errors.extend(o.errors[:room])
        for w in o.warnings:
            if w not in result.warnings:
                result.warnings.append(w)


def _finish(result: ScanResult, config: ScanConfig) -> None:
    from feedbench.verdict import judge

    ds = result.dataset
    if ds.samples is None and result.measurements:
        first = result.measurements[0]
        if first.consumers == 1 and not first.partial:
            ds.samples = first.samples + first.errors
    few = [
        m
        for m in result.measurements
        if m.per_consumer and min(c.batches for c in m.per_consumer) < 5
    ]
    if few:
        result.warnings.append(
            f"{len(few)} measurement(s) had fewer than 5 batches per consumer: rates and AU are "
            "rough; use a larger dataset or a smaller --batch-size"
        )
    result.verdict = judge(result, target_au=config.target_au)


def unusable(result: ScanResult) -> str | None:
    """Why a finished scan measured nothing usable (every sample failed), or None."""
    ms = [m for m in result.measurements if not m.partial]
    if ms and all(m.samples == 0 for m in ms) and not result.partial:
        cfg = result.config
        e = result.errors[0] if result.errors else None
        example = f"{os.path.basename(e.key)}: {e.message}" if e else "none recorded"
        return (
            f"no sample of {cfg['path']} could be read through {','.join(cfg['stages'])}: "
            f"{ms[0].errors} errors, e.g. {example}"
        )
    return None


def _sigterm_as_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def run_under_torchrun(
    config: ScanConfig, on_update: Callable[[ScanResult], None] | None = None
) -> ScanResult | None:
    """This process is one rank started by torchrun; rank 0 returns the result, others None."""
    from loaders.dist import discover

    d = discover()
    if d.world_size < 1 or "MASTER_ADDR" not in os.environ:
        raise FeedbenchError("python -m feedbench.consumer must be started by torchrun")
    config.consumers = (d.world_size,)
    source, notes, p = validate(config)
    result = new_result(config, source, notes, p) if d.rank == 0 else None
    cores = os.cpu_count() or 1
    local = int(os.environ.get("LOCAL_WORLD_SIZE", d.world_size))
    workers = config.workers if config.workers is not None else default_workers(local, cores)

    def keep(o: RankOutcome) -> None:
        assert result is not None
        _absorb(result, [o])
        result.curve = curve(result.measurements)
        if on_update:
            on_update(result)

    t0 = time.perf_counter()
    # Ctrl-C reaches every rank (SIGINT) and torchrun's agent then stops them (SIGTERM): both end
    # the measurement here, and rank 0 keeps what was measured (marked partial). A rank blocked
    # in a collective only sees it on its way back to Python; until then the results file holds
    # every measurement finished so far (on_update).
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        run_rank(
            d.rank, d.world_size, d.local_rank, config, "env://", workers,
            keep if d.rank == 0 else None,
        )  # fmt: skip
    except KeyboardInterrupt:
        if result is None:
            raise
        result.partial = True
        # the agent signals again while it stops the ranks: let rank 0 finish writing
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, previous)
    if result is not None:
        result.config["torchrun"] = {
            "world_size": d.world_size,
            "local_world_size": local,
            "elapsed_s": time.perf_counter() - t0,
        }
        _finish(result, config)
    return result
