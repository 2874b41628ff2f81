"""Process supervision shared by scan and verify: start, interrupt, SIGTERM, reap, leave.

Every process feedbench starts by exec carries ``JOB_TAG`` in its environment (inherited by
torchrun's ranks and their loader workers), and every consumer forked by scan leads a process group
of its own (its loader workers join it), so that a job's processes are found and ended even when
orphaned; and each dies with its parent when that is killed outright (SIGKILL: no chance to end
them). Ctrl-C, SIGTERM and SIGHUP end a measurement with its results kept; a worker process
whose work is handed over leaves without the interpreter's teardown.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence

import psutil

JOB_TAG = "FEEDBENCH_JOB"  # in every process of a job: found by it, even orphaned
STOP_GRACE_S = 5.0  # a job's own time to stop its processes before they are killed


class Interrupted(Exception):
    """Ctrl-C (or SIGTERM) during a measurement; ``args[0]`` is what was measured before it."""


def leave_without_finalizing(code: int = 0) -> None:
    """Exit now with ``code``, skipping the interpreter's teardown.

    There, torch.distributed's C++ state can still own a running thread whose destructor aborts
    the process ("terminate called without an active exception": SIGABRT with no Python frame,
    after ``destroy_process_group``; seen in the scan tests under load). The parent would then
    report a process that did all its work, and wrote it, as dead.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # each ends a run as Ctrl-C does


class Stop:
    """Which signal stopped the run (its name, once one came): :func:`sigterm_as_interrupt`."""

    signal: str | None = None
    holding = False  # signals are noted, not raised

    def hold(self) -> None:
        """From now on a signal is noted only, and ignored once the block is left: what follows
        (writing the results, leaving) is not cut short."""
        self.holding = True


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[Stop]:
    """SIGTERM and SIGHUP (a closed terminal, a batch system's stop) do what Ctrl-C does: stop
    the job, keep the results. The first of them raises KeyboardInterrupt; later ones are noted
    and ignored, so the stop itself (ending the processes, writing the part) is not cut short."""
    stop = Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum, frame):
        if stop.signal is None:
            stop.signal = signal.Signals(signum).name
            if not stop.holding:
                raise KeyboardInterrupt

    old = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for s, h in old.items():  # held: the process is ending, writing what it has
            signal.signal(s, signal.SIG_IGN if stop.holding else h)


@contextlib.contextmanager
def stop_signals_deferred() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP arriving inside the block take effect when it ends, through
    the handlers in place before it. For starting or ending a job's processes: cut half way, a
    process started but not yet known to its parent is never stopped, and the parent's exit
    waits for it (multiprocessing joins its children at exit) forever.

    Handlers, not the signal mask: a process-directed signal blocked in the main thread is
    taken by another thread, whose C handler still has the main thread raise."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    old = {s: signal.signal(s, lambda signum, frame: came.append(signum)) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, signal.SIG_DFL if h is None else h)  # None: set outside Python
        if came:  # as if it arrived now: the old handler decides (KeyboardInterrupt, mostly)
            signal.raise_signal(came[0])


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when the thread that started it ends (its parent killed outright);
    exit at once if ``parent_pid`` is gone already (it died before the request took effect).
    Linux only: elsewhere the parent's own ending of its children is all there is."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    try:
        os.kill(parent_pid, 0)
    except ProcessLookupError:
        os._exit(128 + signal.SIGKILL)


_forker: dict[str, object] = {}  # the forking process and thread, seen by the child


def _before_fork() -> None:
    _forker["pid"] = os.getpid()
    _forker["main"] = threading.current_thread() is threading.main_thread()


def _after_fork_in_child() -> None:
    # the signal comes when the forking THREAD ends: a child forked by a passing thread would
    # die with that thread, so only children of the main thread get it
    if _forker.get("main"):
        die_with_parent(int(_forker["pid"]))  # type: ignore[call-overload]


def children_die_with_parent() -> None:
    """Every process this one forks from now on (loader workers) dies with it
    (:func:`die_with_parent`). Once per process."""
    if not _forker:
        _forker["pid"] = os.getpid()
        os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def environ(name: str, value: str) -> Iterator[str]:
    """``name=value`` in this process's environment for the block (processes started meanwhile
    inherit it), then as it was."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield value
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def job_tag() -> contextlib.AbstractContextManager[str]:
    """A new tag set in this process's environment while the job's processes are started: they
    (and their children: loader workers, torchrun's ranks) inherit it, so :func:`reap` finds
    them all."""
    return environ(JOB_TAG, uuid.uuid4().hex)


class Watchdog:
    """A stall: none of ``n`` progress counters (bytes read, batches taken, one per process) has
    moved for ``timeout_s`` seconds; before the first move, ``startup_s`` more are allowed (the
    processes import, connect, evict the cache). :meth:`check` takes the counters' values."""

    def __init__(self, n: int, timeout_s: float, startup_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        now = time.monotonic()
        self.moved = [now] * n
        self.seen: list = [None] * n
        self.started = False
        self.grace_s = startup_s

    def check(self, values: Sequence[tuple[int, ...]], busy: Sequence[bool] = ()) -> bool:
        """Whether the processes stalled. ``busy[i]``: process i is at work that moves no
        counter (listing, building an index): not silent, however long it takes."""
        now = time.monotonic()
        for i, b in enumerate(busy):
            if b:
                self.moved[i] = now
        for i, v in enumerate(values):
            if v != self.seen[i]:
                if self.seen[i] is not None or any(v):  # counters start at zero
                    self.started = True
                self.seen[i], self.moved[i] = v, now
        allowed = self.timeout_s + (0.0 if self.started else self.grace_s)
        return now - max(self.moved) > allowed

    def poke(self) -> None:
        """Progress seen elsewhere (bytes arriving for a batch not yet whole): not stalled."""
        self.moved = [time.monotonic()] * len(self.moved)

    def silent(self) -> list[tuple[int, float]]:
        """(index, seconds without progress) of every counter, the longest silent first."""
        now = time.monotonic()
        return sorted(((i, now - t) for i, t in enumerate(self.moved)), key=lambda x: -x[1])


def alive(procs) -> list[psutil.Process]:
    out = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:
            continue
    return out


def stop(top: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to a job's top process (it stops its own children); SIGKILL after ``grace_s``."""
    if top.poll() is None:
        top.send_signal(signal.SIGTERM)
        try:
            top.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            top.kill()
            top.wait()


def tagged(tag: str) -> list[psutil.Process]:
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


def in_groups(pgids: Sequence[int]) -> list[psutil.Process]:
    """The live processes of these process groups (ours: same user)."""
    wanted, found = set(pgids), []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) in wanted and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (OSError, psutil.Error):
            continue
    return found


def reap(tag: str | None, known=(), grace_s: float = 3.0, groups: Sequence[int] = ()) -> int:
    """End every process of the job still alive (loader workers orphaned by a dead rank, ...):
    those tagged ``tag``, in ``known`` or in the process ``groups``: SIGTERM, then SIGKILL after
    ``grace_s``; each by its pid, checked to be that process. Returns how many there were."""
    left = {p.pid: p for p in alive(known)}
    if tag is not None:
        left |= {p.pid: p for p in tagged(tag)}
    if groups:
        left |= {p.pid: p for p in in_groups(groups) if p.pid != os.getpid()}
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


class Terminated(SystemExit):
    """SIGTERM (torchrun stopping the job): leave through ``finally`` so the part is written."""


def _on_sigterm(signum, frame):
    raise Terminated(128 + signum)


def exit_on_sigterm(last_words) -> None:
    """Leave at once on SIGTERM, even while the main thread is blocked in a collective.

    A Python signal handler runs only when the main thread is back in Python, which a rank stuck in
    a collective with a dead peer may not be for a long time. So the C-level handler's wake-up
    byte is watched by a thread, which writes the part file (``last_words``) and exits.
    """
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.signal(signal.SIGTERM, _on_sigterm)  # installs the C handler that writes the byte
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)

    def watch() -> None:
        while True:
            data = os.read(r, 64)
            if signal.SIGTERM in data:  # other bytes: SIGCHLD from loader workers, and so on
                with contextlib.suppress(Exception):
                    last_words()
                sys.stderr.flush()
                os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="sigterm-exit", daemon=True).start()
