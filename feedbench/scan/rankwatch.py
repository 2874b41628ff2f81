"""The stall watch of a torchrun scan: every rank watches its own progress; a stall ends them all.

A local scan's parent watches its consumers (:class:`~feedbench.core.supervise.Watchdog`). Under
torchrun no process sees every rank, and a rank whose storage hangs blocks the others inside a
collective, where no Python runs. So :class:`RankWatch`, a thread in each rank:

- counts the rank's progress (:meth:`RankWatch.beat`: a batch taken, a file of the cache
  prepared) and looks at what the main thread is doing (:func:`activity`: reading which file,
  or waiting for the other ranks in a collective);
- tells the others through torchrun's store (``beat/RANK`` every tick);
- reports its own rank stalled when it made no progress for the stall timeout while not waiting
  for the others (a rank waiting in a barrier is held up by another one's stall, not its own);
- on ranks 0 and 1, when waiting without progress for the stall timeout, looks at the others'
  beats: a rank whose watch itself fell silent (its process stopped, or blocked in C code that
  holds Python's lock, as some C extensions' reads do) is reported by them;
- once any rank reported, ends the scan: rank 0 writes the results (``on_stalled``), then every
  rank leaves with exit code 3, from this thread, as the main thread may never come back.

Why not torch.distributed's own timeouts (the process group's, or ``monitored_barrier``'s):
they bound one wait in a collective, so a rank waiting while a peer warms the page cache for
minutes would fail though nothing is stalled, and a rank stuck in a read is in no collective at
all. Progress, not the length of a wait, tells a stall; the store names the rank and its file.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType

import feedbench
import loaders
from feedbench.core.errors import EXIT_FAILED
from feedbench.core.supervise import leave_without_finalizing
from loaders.data import remote

ENDING_S = 60.0  # the other ranks wait this long for rank 0 to write the results
STORE_TIMEOUT_S = 10.0  # one store request (a store that does not answer: torchrun is ending)
STARTUP_S = 60.0  # before the first progress, as a local scan allows (first batch, connections)
WATCHERS = (0, 1)  # the ranks that look after the others' beats (rank 1: when rank 0 is silent)
_OURS = (os.path.dirname(feedbench.__file__), os.path.dirname(loaders.__file__))
_SOURCES = os.path.join(_OURS[0], "scan", "sources.py")  # the timed reads: their frame has `path`
_DIST = os.sep + os.path.join("torch", "distributed") + os.sep
_LOADER = os.path.join("torch", "utils", "data", "dataloader.py")
_WAITS = {  # (our function, collective) → what that wait is
    ("__call__", "all_reduce"): "the step barrier",
    ("idle_cost", "all_reduce"): "the step barrier",
    ("idle_cost", "barrier"): "the step barrier",
    ("measure", "barrier"): "the barrier before the pass",
    ("measure", "gather_object"): "the gathering after the pass",
    ("run_rank", "gather_object"): "the gathering of hosts",
    ("run_rank", "init_process_group"): "the start",
}

_WORK = {("consumer.py", "step"): "sleeping its emulated accelerator step"}  # (file, function)
# listing and indexing move no progress counter and are no stall, however long: (file, function
# entered) → what the rank is doing. (Not a sample's read: SampleIndex.read is a read.)
_DATA = os.path.join(_OURS[1], "data") + os.sep
_BUSY = {
    (_DATA + "layout.py", "locate"): "listing {}",
    (_DATA + "layout.py", "locate_files"): "listing {}",
    (_DATA + "index.py", "open_index"): "building the index of {}",
    (_DATA + "saved.py", "write"): "saving the index to {}",
    (_DATA + "saved.py", "read"): "loading the index {}",
    (os.path.join(_OURS[1], "index_once.py"), "obtain"): "listing {} (or waiting for local "
    "rank 0's listing)",
}


@dataclass(frozen=True)
class Activity:
    """What a rank's main thread does: ``waiting`` for the other ranks (in a collective), or
    its own work (``what``: "reading FILE", ...)."""

    waiting: bool
    what: str
    busy: bool = False  # listing or building the index: its own work, not a stall


def _stack(frame: FrameType | None) -> list[FrameType]:
    out = []
    while frame is not None:
        out.append(frame)
        frame = frame.f_back
    return out  # innermost first


def activity(frame: FrameType | None) -> Activity:
    """What the thread at ``frame`` (its innermost) is doing, read from its Python stack: no
    bookkeeping in the read loop, and the stack of a thread blocked in C stays readable."""
    frames = _stack(frame)
    dist = [i for i, f in enumerate(frames) if _DIST in f.f_code.co_filename]
    if dist:
        return Activity(True, "waiting in " + _wait_name(frames, dist[-1]))
    busy = next((f for f in reversed(frames) if _busy_key(f) in _BUSY), None)
    if busy is not None:  # the outermost: indexing calls the listing, not the reverse
        return Activity(False, _BUSY[_busy_key(busy)].format(_listed(busy)), busy=True)
    for f in frames:
        path = f.f_locals.get("path") if f.f_code.co_filename == _SOURCES else None
        if isinstance(path, str):
            return Activity(False, f"reading {path}")
    if any(f.f_code.co_filename.endswith(_LOADER) for f in frames):
        return Activity(False, "waiting for a batch from its loader workers")
    for f in frames:
        if f.f_code.co_filename.startswith(_OURS):
            name = os.path.basename(f.f_code.co_filename)
            known = _WORK.get((name, f.f_code.co_name))
            return Activity(False, known or f"in {f.f_code.co_name} ({name}:{f.f_lineno})")
    return Activity(False, "starting")


def _busy_key(frame: FrameType) -> tuple[str, str]:
    return frame.f_code.co_filename, frame.f_code.co_name


def _listed(frame: FrameType) -> str:
    """What the listing at ``frame`` lists (its ``path`` or ``source``), without credentials."""
    for name in ("path", "source"):
        value = frame.f_locals.get(name)
        if isinstance(value, (str, os.PathLike)):
            return remote.redact_url(os.fspath(value))
    return "the data"


def _wait_name(frames: list[FrameType], outermost: int) -> str:
    """The collective entered at ``frames[outermost]`` (wrappers of torch.distributed skipped)
    named for the function of ours that called it."""
    called = next(
        (f.f_code.co_name for f in reversed(frames[: outermost + 1])
         if f.f_code.co_filename.endswith("distributed_c10d.py")),
        frames[outermost].f_code.co_name,
    )  # fmt: skip
    caller = frames[outermost + 1].f_code.co_name if outermost + 1 < len(frames) else "?"
    return _WAITS.get((caller, called), f"{called} (from {caller})")


def ranks_text(ranks: Sequence[int]) -> str:
    """How ranks are named in a message: "rank 3", "ranks 0, 2–5"."""
    rs = sorted(ranks)
    runs: list[list[int]] = []
    for r in rs:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    parts = [str(g[0]) if len(g) == 1 else f"{g[0]}–{g[-1]}" for g in runs]
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(parts)


def stall_message(
    reports: Sequence[dict], beats: dict[int, dict], timeout_s: float, shown: int = 4
) -> str:
    """One line: each stalled rank (``reports``: rank, host, what, silent_s) with its host and
    what it was doing, then what the others were doing (``beats``: rank → what), grouped."""
    first: dict[int, dict] = {}  # a rank reported by itself and by a watcher: named once
    for r in reports:
        first.setdefault(r["rank"], r)
    reports = sorted(first.values(), key=lambda r: r["rank"])
    parts = [
        f"{ranks_text([r['rank']])} on {r['host']} made no progress for {r['silent_s']:.0f} s, "
        f"{r['what']}"
        for r in reports[:shown]
    ]
    if not reports:  # asked after rank 0's store went away
        parts.append("another rank stopped making progress")
    if len(reports) > shown:
        parts.append(f"{len(reports) - shown} more ranks stalled")
    stalled = {r["rank"] for r in reports}
    others: dict[str, list[int]] = {}
    for rank, beat in sorted(beats.items()):
        if rank not in stalled:
            others.setdefault(beat["what"], []).append(rank)
    for what, ranks in others.items():
        parts.append(f"{ranks_text(ranks)} {'was' if len(ranks) == 1 else 'were'} {what}")
    return f"stalled: {'; '.join(parts)} (--stall-timeout {timeout_s:g})"


class RankWatch:
    """The stall watch of one torchrun rank (see the module): a context manager around the
    rank's work, which calls :meth:`beat` at every sign of progress.

    ``on_stalled(message)`` runs on the watch's thread when the scan stalled, before the rank
    leaves: on rank 0 (to write the results and say why), and on another rank only when rank 0
    did not confirm it wrote them within ``ENDING_S``.
    """

    def __init__(
        self, rank: int, world: int, timeout_s: float, on_stalled: Callable[[str], None]
    ) -> None:
        self.rank, self.world, self.timeout_s = rank, world, timeout_s
        self.on_stalled = on_stalled
        self.host = socket.gethostname()
        self.beats = 0  # written by the watched thread only, read by the watch
        self.lock = threading.Lock()  # an ending holds it until the process leaves
        self.tick_s = min(1.0, timeout_s / 4)
        self._watched = threading.current_thread()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)
        now = time.monotonic()
        self._seen, self._progressed, self._waited, self._started = 0, now, now, False
        self._ticks = 0
        self._reported: set[int] = set()  # ranks this watch reported stalled
        self._peers: dict[int, tuple[int, float]] = {}  # rank → (its tick, when it changed)

    def beat(self, nbytes: int = 0) -> None:
        self.beats += 1

    def __enter__(self) -> RankWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        with self.lock:  # waits for an ending under way, which leaves the process
            self._stop.set()
        self._thread.join(timeout=STORE_TIMEOUT_S + 1)

    def _run(self) -> None:
        store = None
        while not self._stop.wait(self.tick_s):
            try:
                store = store or _connect()
                if store is not None:  # (None until the process group is up)
                    self._tick(store, time.monotonic())
            except RuntimeError:  # (DistStoreError) the store did not answer: torchrun is
                continue  # ending the job, or it answers next time

    def _tick(self, store, now: float) -> None:
        """Tell this rank's state, report it stalled, look after the others, end on a stall."""
        act = activity(sys._current_frames().get(self._watched.ident))
        if self.beats != self._seen:
            self._seen, self._progressed, self._started = self.beats, now, True
        if act.waiting or act.busy:  # held up by another rank, or listing: not a silence
            self._waited = now
        self._ticks += 1
        beat = {"what": act.what, "host": self.host, "tick": self._ticks}
        store.set(f"beat/{self.rank}", json.dumps(beat))
        silent_s = now - max(self._progressed, self._waited)
        allowed_s = self.timeout_s + (0.0 if self._started else STARTUP_S)
        if self.rank not in self._reported and silent_s > allowed_s:
            self._report(store, self.rank, self.host, act.what, silent_s)
        if act.waiting and self.rank in WATCHERS and now - self._progressed > self.timeout_s:
            self._look_after(store, now)
        if store.add("stalled", 0) > 0:
            self._end(store)

    def _look_after(self, store, now: float) -> None:
        """Report the ranks whose watch itself fell silent (their beats stopped): a process
        stopped, or blocked in C code that holds Python's lock (its watch cannot run)."""
        keys = [f"beat/{r}" for r in range(self.world)]
        if not store.check(keys):
            return  # a rank that never beat yet: not started, not stalled
        for r, raw in enumerate(store.multi_get(keys)):
            beat = json.loads(raw)
            tick, since = self._peers.get(r, (None, now))
            if beat["tick"] != tick:
                self._peers[r] = (beat["tick"], now)
            elif r not in self._reported and now - since > self.timeout_s:
                what = f"without a sign of life (its last: {beat['what']})"
                self._report(store, r, beat["host"], what, now - since)

    def _report(self, store, rank: int, host: str, what: str, silent_s: float) -> None:
        self._reported.add(rank)
        n = store.add("stalled", 1)
        report = {"rank": rank, "host": host, "what": what, "silent_s": silent_s}
        store.set(f"report/{n}", json.dumps(report))

    def _end(self, store) -> None:
        with self.lock:
            if self._stop.is_set():
                return  # this rank finished meanwhile; its own end is under way
            try:
                if self.rank == 0:
                    self.on_stalled(self._message(store))
                    store.set("written", "1")
                elif not _written(store):
                    self.on_stalled(self._message(store))
            except BaseException:  # a bug: shown, and the rank still leaves
                traceback.print_exc()
            leave_without_finalizing(EXIT_FAILED)

    def _message(self, store) -> str:
        """Every report so far, and the latest beat of every rank."""
        wait = timedelta(seconds=STORE_TIMEOUT_S)
        n = store.add("stalled", 0)
        reports, beats = [], {}
        with contextlib.suppress(RuntimeError):  # a rank's beat or report missing: left out
            keys = [f"report/{i}" for i in range(1, n + 1)]
            store.wait(keys, wait)  # counted before written
            reports = [json.loads(v) for v in store.multi_get(keys)]
            keys = [f"beat/{r}" for r in range(self.world)]
            store.wait(keys, wait)
            beats = {r: json.loads(v) for r, v in enumerate(store.multi_get(keys))}
        return stall_message(reports, beats, self.timeout_s)


def _written(store) -> bool:
    try:
        store.wait(["written"], timedelta(seconds=ENDING_S))
    except RuntimeError:  # not within ENDING_S, or rank 0's store is gone with it
        return False
    return True


def _connect():
    """This rank's own connection to torchrun's store (the main thread's may be blocked in a
    request), under a prefix of this run and restart; None before the process group is up."""
    import torch.distributed as tdist

    if not tdist.is_initialized():
        return None
    store = tdist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=STORE_TIMEOUT_S),
    )
    run = os.environ.get("TORCHELASTIC_RUN_ID", "")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return tdist.PrefixStore(f"feedbench/stall/{run}/{restart}/", store)
