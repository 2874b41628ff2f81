"""One listing per job: the sample index :func:`~loaders.api.build_loader` reads, made by one
rank per machine and loaded by the others, or saved by the user and reused across jobs.

Listing 1.28 M files is minutes on a network filesystem; torchrun's 8 ranks per machine would
each do it. Here local rank 0 lists and saves the index (:meth:`SampleIndex.save`, one file);
the other ranks of the machine wait for that file and map it. No collective is used: a listing
may outlast a process group's timeout, and the ranks' order of calls stays the caller's (DDP
semantics unchanged). The file is named for the job (the launcher's process, which every local
rank shares, and torchrun's run and restart) and the source, in the temporary folder; local
rank 0 removes it when it exits. Ranks that find no listing under way list for themselves: at
once where no other process shares their parent (a rank alone, or a launcher that starts each
rank from another process), else after waiting ``ANNOUNCE_S`` for one to announce it.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import TypeVar

import psutil

from loaders.data import SampleIndex, open_index
from loaders.data.index import listed_as
from loaders.dist import DistInfo
from loaders.errors import LoaderError

ANNOUNCE_S = 60.0  # how long another rank waits for local rank 0 to say it is listing
POLL_S, POLL_MAX_S = 0.01, 0.5  # how often a waiting rank looks for the index: at first, at most
T = TypeVar("T")


def obtain(source, fmt: str, info: DistInfo, path: str | os.PathLike[str] | None) -> SampleIndex:
    """The index of ``source``: from ``path`` when it holds this source's index; else listed
    (once per machine when ranks share it: see the module) and saved to ``path`` if given."""
    if isinstance(source, SampleIndex):
        return source
    listed = listed_as(source, fmt)
    target = os.fspath(path) if path is not None else None
    if target is not None and os.path.exists(target):
        return _checked(SampleIndex.load(target, source), listed, target)
    if info.world_size > 1 and info.local_world_size > 1:
        own = target is None  # the job's own file, removed with it; else the user's, kept
        if target is None:
            target = job_index_path(listed, _next_call(listed, info))
        index = once_per_machine(
            info.local_rank, target, lambda: open_index(source, fmt), SampleIndex.save, own=own
        )
        if index is not None:
            return index
        index = _checked(SampleIndex.load(target, source), listed, target)
        if own:
            _loaded(target, info.local_rank, info.local_world_size)
        return index
    index = open_index(source, fmt)
    if target is not None:
        index.save(target)
    return index


_calls: dict[tuple[str, int, int], int] = {}  # obtain() calls per source, rank and world


def _next_call(listed: str, info: DistInfo) -> str:
    """This call's name among this rank's calls for ``listed`` at its world size. Every rank
    builds its loaders in the same order (DDP), so the k-th call names the same file on each
    (ranks built in one process too); a file per call, because the last rank to map one
    removes it (:func:`_loaded`) while a later call of the same job may look for it."""
    key = (listed, info.local_rank, info.world_size)
    n = _calls.get(key, 0)
    _calls[key] = n + 1
    return f"{info.world_size}:{n}"


def job_index_path(listed: str, call: str) -> str:
    """The job's index file for the call named ``call`` (:func:`_next_call`) of ``listed``."""
    return job_path(f"{listed} #{call}", ".npz")


def _checked(index: SampleIndex, listed: str, path: str) -> SampleIndex:
    if index.listed != listed:
        raise LoaderError(
            f"{path} is the index of {index.listed}, not of {listed}: give another index path, "
            "or delete the file to list again"
        )
    return index


def job_path(listed: str, suffix: str) -> str:
    """This job's file (or folder) for ``listed``, the same on every local rank (see the
    module), in a folder of this user's in the temporary folder."""
    parent = os.getppid()
    try:
        born = psutil.Process(parent).create_time()
    except psutil.Error:
        born = 0.0
    env = ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")
    job = [str(parent), repr(born), *(os.environ.get(k, "") for k in env), listed]
    digest = hashlib.sha1("\n".join(job).encode("utf-8", "replace")).hexdigest()[:20]
    folder = os.path.join(tempfile.gettempdir(), f"feedbench-index-{os.getuid()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return os.path.join(folder, digest + suffix)


def once_per_machine(
    local_rank: int,
    target: str,
    make: Callable[[], T],
    save: Callable[[T, str], None],
    *,
    own: bool = True,
    error: type[Exception] = LoaderError,
) -> T | None:
    """Local rank 0 makes the value (``make``: lists) and saves it at ``target``, and returns
    it; another rank waits for that and returns None (load ``target``), or makes the value
    itself when no rank of its machine announced it (see the module). A failure of rank 0's
    ``make`` (an ``error``) is raised on every rank, with its message. ``own``: ``target`` is
    removed when local rank 0 exits."""
    announce, error_file = target + ".listing", target + ".error"
    if local_rank != 0:
        if _wait_for(target):
            return None
        told = _read_error(target)
        if told is not None:
            raise error(told)
        return make()  # no rank listing for this machine: list here
    _remove([error_file])  # a killed job's
    _write_atomic(announce, str(os.getpid()))
    atexit.register(_remove, [announce, error_file, target] if own else [announce, error_file])
    try:
        value = make()
    except error as e:
        _write_atomic(error_file, json.dumps({"error": str(e)}))
        raise
    save(value, target)
    return value


def _loaded(target: str, local_rank: int, local_world: int) -> None:
    """This rank mapped the job's index: the last of the machine's other ranks to do so
    removes the file (mapped, it stays readable), as ranks started by multiprocessing leave
    without running local rank 0's exit handler."""
    _write_atomic(f"{target}.loaded.{local_rank}", "")
    folder, name = os.path.split(target)
    done = [f for f in os.listdir(folder) if f.startswith(name + ".loaded.")]
    if len(done) >= local_world - 1:
        forget(target)
        _remove([os.path.join(folder, f) for f in done])


def forget(target: str) -> None:
    """Remove what :func:`once_per_machine` left at ``target`` (local rank 0, at the job's end,
    where the process leaves without running exit handlers)."""
    _remove([target + ".listing", target + ".error", target])


def _wait_for(target: str) -> bool:
    """Whether local rank 0 saved ``target``: waits while its listing is under way (its
    process alive); False when none was announced within ``ANNOUNCE_S``, or it ended without,
    or at once when no process could announce it (:func:`_has_siblings`)."""
    announce, error_file = target + ".listing", target + ".error"
    deadline = time.monotonic() + ANNOUNCE_S
    pause = POLL_S
    while True:
        if os.path.exists(target):
            return True
        if os.path.exists(error_file):
            return False
        pid = _lister(announce)
        if pid is None and (time.monotonic() > deadline or not _has_siblings()):
            return False
        if pid is not None and not psutil.pid_exists(pid):
            return os.path.exists(target)
        time.sleep(pause)
        pause = min(pause * 1.5, POLL_MAX_S)  # a long listing: 7 ranks polling take no core


def _has_siblings() -> bool:
    """Whether this process's parent has another child: only one could be local rank 0 of this
    job, whose files are named for the parent (:func:`job_path`). A rank given by its arguments
    in a process of its own (``build_loader(..., rank=1, world_size=2)`` to look at a shard)
    has none, and lists at once instead of waiting ``ANNOUNCE_S`` for nobody."""
    try:
        return any(p.pid != os.getpid() for p in psutil.Process(os.getppid()).children())
    except psutil.Error:
        return True  # cannot tell: wait as for a sibling


def _lister(announce: str) -> int | None:
    try:
        with open(announce) as f:
            return int(f.read().strip() or 0) or None
    except (OSError, ValueError):
        return None


def _read_error(target: str) -> str | None:
    try:
        with open(target + ".error") as f:
            return str(json.load(f)["error"])
    except (OSError, ValueError, KeyError):
        return None


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _remove(paths: list[str]) -> None:
    for p in paths:
        if os.path.isdir(p):
            shutil.rmtree(p, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.unlink(p)
