"""Run a scan: N consumer processes (torch.distributed, gloo) per count, gathered at rank 0.

Locally, :func:`scan` spawns the consumers for each count in turn (across machines, torchrun
starts them: :mod:`feedbench.scan.torchrun`). Rank 0 gathers every consumer's numbers after each
measurement, so the results file grows as the scan goes and an interrupted or failed scan keeps
what was measured.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import signal
import tempfile
import time
from collections.abc import Callable
from typing import Any

from feedbench.core.envelope import DatasetInfo, envelope, unfinished
from feedbench.core.errors import FeedbenchError, MeasurementFailed
from feedbench.core.listing import skipped_files, skipped_warning
from feedbench.core.supervise import (
    Interrupted,
    children_die_with_parent,
    die_with_parent,
    environ,
    free_port,
    job_tag,
    leave_without_finalizing,
    reap,
    stop_signals_deferred,
)
from feedbench.core.system import client_cache_caveat
from feedbench.core.words import count
from feedbench.scan import spawn
from feedbench.scan.config import Plan, ScanConfig, check
from feedbench.scan.factory import UserLoaderError, is_user_spec, resolve, run_exit_handlers
from feedbench.scan.forkserver import SERVER_PARENT_ENV
from feedbench.scan.opening import SCAN_PID_ENV, check_direct, open_source
from feedbench.scan.results import Measurement, RankOutcome, ScanResult
from feedbench.scan.sizing import (
    assess,
    client_memory_text,
    disturbed,
    find_max_result,
    short_count,
)
from feedbench.scan.sources import Source, shared_listing
from feedbench.scan.sweep import curve, find_max, max_consumers_default
from feedbench.scan.verdict import judge
from feedbench.scan.watch import in_flight, slow_warning, watch
from loaders.dist import default_workers


def _spawned(
    local_rank: int,
    world: int,
    config_dict: dict,
    init_method: str,
    workers: int,
    out_path: str,
    done_bytes: Any,
    beats: Any,
    phases: Any,
    env: dict[str, str],
) -> None:
    # the scan killed outright (SIGKILL) ends its fork server, and so this consumer and its
    # loader workers: nothing goes on reading for a parent that is gone
    die_with_parent(int(env[SCAN_PID_ENV]))
    children_die_with_parent()
    os.setpgid(0, 0)  # a group of its own, its loader workers' too: reaped by it, even orphaned
    os.environ.clear()  # forked from the server, which started before the parent's last settings
    os.environ.update(env)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    # a spawned child inherits "spawn" as its default start method; a training process started
    # by torchrun has the platform's own (fork on Linux), and so must the loaders in a consumer:
    # otherwise every DataLoader worker imports torch and the user's module again, per pass
    multiprocessing.set_start_method(None, force=True)
    outcomes: list[RankOutcome] = []

    def keep(o: RankOutcome) -> None:
        outcomes.append(o)
        tmp = out_path + ".tmp"
        with open(tmp, "wb") as f:
            pickle.dump(outcomes, f)
        os.replace(tmp, out_path)

    def progress(nbytes: int) -> None:  # one writer per slot: no lock needed
        done_bytes[local_rank] += nbytes
        beats[local_rank] += 1  # a batch taken (also one of failed samples): not stalled

    def phase(k: int) -> None:
        phases[local_rank] = k

    from feedbench.scan.rank import run_rank  # imported by the server already (preload)

    try:
        run_rank(
            local_rank,
            world,
            local_rank,
            ScanConfig.from_dict(config_dict),
            init_method,
            workers,
            keep,
            progress,
            on_phase=phase,
        )
    except UserLoaderError as e:  # the user's loader, not this consumer, failed: tell the parent
        tmp = f"{out_path}.error.{local_rank}"
        with open(tmp, "wb") as f:
            pickle.dump(e, f)
        os.replace(tmp, out_path + ".error")
        raise
    if is_user_spec(config_dict.get("loader")):
        run_exit_handlers()
    leave_without_finalizing()


def _user_loader_error(out_path: str) -> UserLoaderError | None:
    """The error of the user's loader a consumer left (see :func:`_spawned`), if any."""
    path = out_path + ".error"
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        error = pickle.load(f)
    os.unlink(path)
    return error


# Consumers are forked from a server process that imported torch and the scan code once (a
# fresh interpreter per consumer paid that import, seconds, at every count); not from this
# process itself, whose threads (monitor, progress) a fork could catch holding a lock.
START_METHOD = "forkserver"


def start_consumer_server() -> None:
    """Start the server consumers are forked from, importing what they run; it works while this
    process lists and prepares the data. Idempotent."""
    from multiprocessing import forkserver

    # first: the server dies with this process; then torch and the consumer
    preload = ["feedbench.scan.forkserver", __name__, "feedbench.scan.rank"]
    forkserver.set_forkserver_preload(preload)
    with environ(SERVER_PARENT_ENV, str(os.getpid())):
        forkserver.ensure_running()


def run_count(
    config: ScanConfig,
    n: int,
    workers: int,
    on_progress: Callable[[int], None] | None = None,
) -> list[RankOutcome]:
    """Spawn ``n`` local consumers, run every pass × repeat, return rank 0's gathered outcomes.

    ``on_progress(bytes read so far, all consumers)`` is called about twice a second. Ctrl-C
    raises :class:`Interrupted`; a consumer that fails, or none making progress for the stall
    timeout, raises :class:`_CountFailed`: both with the outcomes measured before, and every
    process the count started ended (its loader workers too).
    """
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # before the job's tag: it outlives the job, not reaped
    start_consumer_server()
    forks = multiprocessing.get_context(START_METHOD)
    done_bytes, beats = forks.Array("q", n, lock=False), forks.Array("q", n, lock=False)
    phases = forks.Array("b", n, lock=False)  # watch.PHASES: each consumer's, for the watch
    fd, out_path = tempfile.mkstemp(prefix="feedbench-", suffix=".pkl")
    os.close(fd)
    os.unlink(out_path)
    init = f"tcp://127.0.0.1:{free_port()}"
    ctx = None
    how, why = "interrupted", None
    slow: list[float] = []  # bytes/s arriving each time the watch waited on slow storage
    try:
        # a signal while the consumers start is taken once all are known here, and so ended
        with job_tag() as tag, stop_signals_deferred():
            env = dict(os.environ) | {SCAN_PID_ENV: str(os.getpid())}
            args = (n, config.as_dict(), init, workers, out_path, done_bytes, beats, phases, env)
            ctx = spawn.start(_spawned, args, n, START_METHOD)
        how, why = watch(ctx, config, done_bytes, beats, phases, on_progress, slow)
    except KeyboardInterrupt:  # as they started: they are ended below, the count interrupted
        pass
    finally:
        if ctx is not None:
            if _end(ctx, tag):  # a signal as they were ended: taken after
                how, why = "interrupted", None
            ctx.remove_error_files()
    outcomes: list[RankOutcome] = []
    if os.path.exists(out_path):
        with open(out_path, "rb") as f:
            outcomes = pickle.load(f)
        os.unlink(out_path)
    if slow and outcomes:
        outcomes[-1].warnings.append(slow_warning(n, slow, config))
    error = _user_loader_error(out_path)
    if error is not None and how == "failed":
        raise error
    if how == "interrupted":
        raise Interrupted(outcomes)
    if how == "stalled":
        why = _stalled(config, n, workers, outcomes, why)
    if why:
        raise _CountFailed(why, outcomes)
    return outcomes


def _stalled(
    config: ScanConfig, n: int, workers: int, outcomes: list[RankOutcome], why: str | None
) -> str | None:
    """What a stall of count ``n`` means for its outcomes: None when every measurement was
    already in (the consumers went silent on their way out: a store that stopped answering as
    they closed; the count is whole and the next one meets the store as it is), else the count's
    failure, its measurement recorded once (the consumers' own, or one for the watch's)."""
    consumers = f"{n} consumer{'s' if n != 1 else ''}"
    if len(outcomes) >= len(config.passes) * config.repeat:
        outcomes[-1].warnings.append(
            f"{consumers}: ended by the watch after their last measurement ({why})"
        )
        return None
    last = outcomes[-1].measurement if outcomes else None
    if last is not None:
        _judge_failed(last)  # (as _absorb would: most of its samples failed)
    if last is not None and last.failed:  # the consumers recorded its failure as the watch
        m, why = last, last.failed  # gave up on them: that measurement, not a second one
    else:
        stalled = in_flight(config, n, workers, len(outcomes), why)
        outcomes.append(stalled)
        m = stalled.measurement
    return f"{consumers}, {m.pass_name} pass: {why}"


def _end(ctx, tag: str, grace_s: float = 5.0) -> bool:
    """Every process of the count ended: the consumers (SIGTERM; SIGKILL for those still there
    after ``grace_s`` in all, e.g. stuck in a read), then what is left in their process groups or
    carries the count's tag (the loader workers a consumer left behind). True when Ctrl-C (or
    SIGTERM, SIGHUP) came meanwhile: taken once all are ended, not half way."""
    try:
        with stop_signals_deferred():
            _end_all(ctx, tag, grace_s)
    except KeyboardInterrupt:
        return True
    return False


def _end_all(ctx, tag: str, grace_s: float) -> None:
    for proc in ctx.processes:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in ctx.processes:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for proc in ctx.processes:
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
    reap(tag, grace_s=2.0, groups=[p.pid for p in ctx.processes])


class _CountFailed(MeasurementFailed):
    def __init__(self, message: str, outcomes: list[RankOutcome]) -> None:
        super().__init__(message)
        self.outcomes = outcomes


NO_PATH = "no data path given: the page cache was left as it was (a cold pass may be warm)"


def new_result(config: ScanConfig, source: Source, notes: list[str], p: Plan) -> ScanResult:
    if config.path is None:  # feedbench.measure of a loader that knows its own data
        path, notes = "(the loader's own data)", [*notes, NO_PATH]
    else:
        path = config.path if source.remote else os.path.abspath(config.path)
    dataset = DatasetInfo(
        path=path,
        format=source.fmt if source.kind == "records" else source.kind,
        files=len(source.files()),
        bytes=source.total_bytes(),
        samples=source.samples_hint(),
    )
    dataset.skipped_files, dataset.skipped = skipped_files(source.layout.skipped)
    cfg = config.as_dict() | {"batch_size": p.batch_size}
    if is_user_spec(config.loader):
        cfg["loader_code"] = resolve(config.loader).describe()
    result = ScanResult(
        **envelope("scan", cfg, config.path),
        dataset=dataset,
        accelerator=p.accelerator,
        warnings=list(notes) + p.warnings + skipped_warning(dataset),
    )
    caveat = client_cache_caveat(result.system) if result.system else None
    if caveat:
        result.warnings.append(caveat)
    host = result.host
    if host and not source.remote and 0 < dataset.bytes < 5 * host.client_memory_bytes:
        result.warnings.append(
            f"dataset ({dataset.bytes / 1e9:.2f} GB) is smaller than 5× this client's "
            f"{client_memory_text(host)}: "
            "in training it would stay in the page cache after the first epoch; the cold pass "
            "shows first-epoch speed, the warm pass later epochs"
        )
    return result


def validate(
    config: ScanConfig, on_listing: Callable[[int], None] | None = None
) -> tuple[Source, list[str], Plan]:
    """The config's own checks (:func:`feedbench.scan.config.check`), then those that need the
    data: one clear error for anything that cannot be measured. ``on_listing(files)`` as a
    local folder is listed."""
    p = check(config)
    if config.loader == "wds" and config.fmt == "auto":
        # the wds loader reads tar shards: on a sample root (images/ and shards/) "auto" would
        # list the tree, which it cannot read
        config.fmt = "shards"
    if config.path is None and not is_user_spec(config.loader):
        raise FeedbenchError("a data path is needed (only your own loader may go without one)")
    source, notes = open_source(config, on_listing)
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
            why = "it applies to tar shards only"
        elif config.loader is not None:
            why = "it does not apply to --loader, which reads with the loader's own reader"
        if why:
            raise FeedbenchError(f"--read-ahead: {config.path}: {why}")
    if source.remote and config.loader is not None:
        raise FeedbenchError("--loader reads local paths; scan the URL without --loader")
    if source.kind == "records" and config.loader is not None:
        raise FeedbenchError(f"--loader reads image trees and tar shards, not {source.fmt} files")
    if config.direct and source.kind == "records" and not source.sample_is_file():
        raise FeedbenchError(
            f"--direct reads whole files; {source.fmt} samples lie at unaligned offsets in theirs"
        )
    if config.direct:
        check_direct(source)
    biggest = max(config.consumers)
    if source.kind == "shards" and source.units() < biggest:
        raise FeedbenchError(
            f"{source.units()} tar shards cannot feed {biggest} consumers: each consumer reads "
            "whole shards; use fewer consumers or more shards"
        )
    if source.kind in ("tree", "records"):
        _check_warmup(config.warmup_batches, batches_per_consumer(source.units(), biggest, p))
    return source, notes, p


def batches_per_consumer(samples: int, consumers: int, p: Plan) -> int:
    """Batches each consumer reads in a pass (DistributedSampler: ceil(n / N) samples each)."""
    return math.ceil(math.ceil(samples / consumers) / p.batch_size)


def _check_warmup(warmup: int, batches: int) -> None:
    """More warm-up batches than a pass has: nothing would be measured. (As many: the rate falls
    back to the whole pass, and says so.)"""
    if warmup > batches:
        raise FeedbenchError(
            f"--warmup {warmup} leaves nothing to measure: a consumer reads {batches} batch"
            f"{'es' if batches != 1 else ''} per pass; use a smaller --warmup or --batch-size, "
            "or more data"
        )


def scan(
    config: ScanConfig,
    *,
    on_update: Callable[[ScanResult], None] | None = None,
    on_count: Callable[[int, int, int], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
    on_listing: Callable[[int], None] | None = None,
) -> ScanResult:
    """Measure every consumer count (and search for the maximum when asked).

    ``on_update`` gets the result after every count (for saving: marked partial and unfinished
    until the last call, the finished result); ``on_count(n, workers, bytes)``
    is told when a count starts and ``on_progress(bytes)`` as it goes; ``on_listing(files)`` as
    a local folder is listed, before. Ctrl-C returns the
    result so far, marked partial; so does a failure (a consumer died, the storage stalled, most
    samples of a measurement failed), with ``result.failure`` saying what: :func:`outcome`.
    """
    source, notes, p = validate(config, on_listing)
    start_consumer_server()
    if config.path is None:  # the user's loader knows its data: nothing listed
        return _scan(config, source, notes, p, on_update, on_count, on_progress)
    # listed once: the consumers load this listing (and our loaders' index) instead of listing
    user = is_user_spec(config.loader)
    ours = None if user else config.loader
    with shared_listing(source, config.path, "files" if user else config.fmt, ours):
        return _scan(config, source, notes, p, on_update, on_count, on_progress)


def oversubscribed(workers: int, cores: int) -> str | None:
    """The one warning for more loader workers per consumer than cores (torch's own, printed
    by every DataLoader of every consumer, is not shown)."""
    if workers <= cores:
        return None
    return (
        f"{count(workers, 'loader worker')} per consumer on {count(cores, 'core')}: the workers "
        "share the cores (--workers sets fewer)"
    )


def _scan(config, source, notes, p, on_update, on_count, on_progress) -> ScanResult:
    result = new_result(config, source, notes, p)
    cores = os.cpu_count() or 1
    done: dict[int, bool | None] = {}

    def measure(n: int) -> bool | None:
        workers = config.workers if config.workers is not None else default_workers(n, minimum=0)
        if source.kind == "shards" and workers > 0 and source.units() < n * workers:
            result.warnings.append(
                f"{n} consumers × {workers} workers > {source.units()} shards: some workers idle"
            )
        shared = oversubscribed(workers, cores)
        if shared and shared not in result.warnings:
            result.warnings.append(shared)
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
        if on_update:  # a write the run goes on after: it says so until the last one
            on_update(unfinished(result))
        failed = next((m for m in result.measurements[-len(outcomes) :] if m.failed), None)
        if failed is not None:  # a server that died: the next counts would only fail too
            raise _CountFailed(
                f"{n} consumer{'s' if n != 1 else ''}, {failed.pass_name} pass: {failed.failed}", []
            )
        point = next(
            (c for c in result.curve if c.consumers == n and c.pass_name == config.passes[0]), None
        )
        ok = point is not None and point.au_mean is not None and point.au_mean >= config.target_au
        # AU over a window of prefetched batches passes nothing and fails nothing (sizing rules)
        done[n] = None if short_count(result, n) is not None else ok
        return done[n]

    try:
        for n in config.consumers:
            measure(n)
        if config.find_max:
            limit = config.max_consumers or max_consumers_default(cores)
            found = find_max(measure, limit=limit, known=done)
            result.config["find_max_result"] = find_max_result(result, found, limit)
    except (Interrupted, KeyboardInterrupt):  # Ctrl-C, or SIGTERM / SIGHUP as the CLI maps them
        result.partial, result.stopped_by = True, "interrupted"
        result.failure = f"interrupted after {len(result.measurements)} measurements"
    except _CountFailed as e:  # results written, the failure marked; the caller exits non-zero
        result.partial, result.failure, result.stopped_by = True, str(e), "failed"
    result.curve = curve(result.measurements)
    _finish(result, config)
    if on_update:
        on_update(result)
    return result


def _absorb(result: ScanResult, outcomes: list[RankOutcome]) -> None:
    for o in outcomes:
        _judge_failed(o.measurement)
        result.measurements.append(o.measurement)
        for said in (unequal_batches(o.measurement), unsettled_warmup(o.measurement)):
            if said and said not in result.warnings:
                result.warnings.append(said)
        room = 20 - len(result.errors)
        if room > 0:
            result.errors.extend(o.errors[:room])
        for w in o.warnings:
            if w not in result.warnings:
                result.warnings.append(w)


def unequal_batches(m: Measurement) -> str | None:
    """The ranks' batch counts, when a training loader yielded different ones in a pass: in
    DDP the ranks with more would wait for the others forever at their extra step."""
    counts = [(c.rank, c.loader_batches) for c in m.per_consumer if c.loader_batches is not None]
    if len({n for _, n in counts}) < 2:
        return None
    per_rank = ", ".join(f"rank {r} {n}" for r, n in counts)
    return (
        f"unequal batches per rank ({m.consumers} consumers, {m.pass_name} pass): {per_rank}; "
        "in DDP the ranks with more batches would hang at their extra steps: give every rank "
        "the same number of batches (DistributedSampler pads, or drop_last)"
    )


def unsettled_warmup(m: Measurement) -> str | None:
    """Whether the warm-up (scan/warmup.py) stopped at half the pass before the loader was past
    its start-up (still slower than its pace, or more batches ready than half the pass): the
    window may hold start-up."""
    if not any(c.warmup_settled is False for c in m.per_consumer):
        return None
    # one warning per count and pass, whichever repeats and consumers (the JSON says which)
    return (
        f"the loader's start-up may be in the window ({m.consumers} "
        f"consumer{'s' if m.consumers != 1 else ''}, {m.pass_name} pass): the warm-up stops at "
        "half of the pass, and by then the loader was still slower than its pace or had more "
        "batches ready than that; give each consumer more batches (more data, a smaller "
        "--batch-size or fewer --consumers)"
    )


def _judge_failed(m: Measurement) -> None:
    """A measurement in which most samples failed is a failure, never a rate. A shard cut short
    lost the samples after its error: counted by the index where there is one (scan --index);
    without, the listing does not count a shard's samples, so cut shards weigh as their share
    of the shards the measurement read."""
    if m.failed is not None:
        return
    bad = m.errors - m.failed_files  # a shard's own error is no sample
    if m.lost_samples is not None:
        if bad + m.lost_samples > m.samples:
            bad += m.lost_samples
            m.failed = f"{bad:,} of {m.samples + bad:,} samples failed ({m.lost_text()})"
    elif bad > m.samples:
        m.failed = f"{bad:,} of {m.samples + bad:,} samples failed"
    elif m.failed_files and 2 * m.failed_files > max(m.files, m.failed_files):
        m.failed = (
            f"{m.failed_files:,} of {max(m.files, m.failed_files):,} shards failed (cut short "
            "or corrupt): their samples after the error were never read"
        )


def _finish(result: ScanResult, config: ScanConfig) -> None:
    ds = result.dataset
    if ds.samples is None and result.measurements:
        first = result.measurements[0]
        if first.consumers == 1 and not first.partial:
            ds.samples = first.samples + first.errors
    busy = disturbed(result)
    if busy:
        result.warnings.append(f"{busy}; its rates may be lower than on an idle host")
    result.verdict = judge(result, target_au=config.target_au)
    result.sizing = assess(result, config.target_au)


def outcome(result: ScanResult) -> FeedbenchError | None:
    """How a finished scan must end, as the error to raise: bad data (nothing could be read from
    the start, exit 2) or a failed measurement (exit 3); None when it completed (or was
    interrupted: ``stopped_by``)."""
    problem = unusable(result)
    if problem:
        return FeedbenchError(problem)
    if result.failure and result.stopped_by != "interrupted":
        return MeasurementFailed(result.failure)
    return None


def unusable(result: ScanResult) -> str | None:
    """Why a scan measured nothing usable: its data, not its storage (every sample failed from
    the first measurement on), or None. Shards cut short are the storage's failure (exit 3, a
    failed measurement), even where the cut came before a first sample was whole."""
    ms = [m for m in result.measurements if not m.partial or m.errors]
    if ms and all(m.samples == 0 for m in ms) and not any(m.failed_files for m in ms):
        cfg = result.config
        e = result.errors[0] if result.errors else None
        example = f"{os.path.basename(e.key)}: {e.message}" if e else "none recorded"
        return (
            f"no sample of {cfg['path']} could be read through {','.join(cfg['stages'])}: "
            f"{ms[0].errors} errors, e.g. {example}"
        )
    return None
