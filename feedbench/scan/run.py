"""Run a scan: N consumer processes (torch.distributed, gloo) per count, gathered at rank 0.

Locally, :func:`scan` spawns the consumers for each count in turn (across machines, torchrun
starts them: :mod:`feedbench.scan.torchrun`). Rank 0 gathers every consumer's numbers after each
measurement, so the results file grows as the scan goes and an interrupted or failed scan keeps
what was measured.
"""

from __future__ import annotations

import os
import pickle
import signal
import tempfile
from collections.abc import Callable
from typing import Any

import psutil

from feedbench.core.envelope import DatasetInfo, envelope
from feedbench.core.errors import FeedbenchError
from feedbench.core.supervise import Interrupted, free_port, leave_without_finalizing
from feedbench.scan.config import Plan, ScanConfig, _check_loader, plan
from feedbench.scan.rank import RankOutcome, _check_direct, open_source, run_rank
from feedbench.scan.results import ScanResult
from feedbench.scan.sources import Source, shared_listing
from feedbench.scan.sweep import curve, find_max, max_consumers_default
from loaders import default_workers


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
    init = f"tcp://127.0.0.1:{free_port()}"
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
    for prefix in ("feedbench.core.errors.FeedbenchError: ", "FeedbenchError: "):
        if last.startswith(prefix):
            return last[len(prefix) :]
    return last


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
        **envelope("scan", cfg),
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
        workers = config.workers if config.workers is not None else default_workers(n, minimum=0)
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
    from feedbench.scan.verdict import judge

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
