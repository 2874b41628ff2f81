"""The stall watchdog's rule, on a clock the test controls; signals and parent death, with real
processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from feedbench.core import supervise
from feedbench.core.supervise import Watchdog


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(supervise.time, "monotonic", lambda: now[0])
    return now


def test_a_stall_is_no_counter_moving_for_the_timeout(clock):
    dog = Watchdog(2, timeout_s=5, startup_s=60)
    assert not dog.check([(0, 0), (0, 0)])
    clock[0] += 3
    assert not dog.check([(0, 1), (0, 0)])  # consumer 0 is ready: start-up is over
    clock[0] += 4
    assert not dog.check([(100, 2), (0, 0)])  # it reads: not stalled (consumer 1 waits)
    clock[0] += 5.5
    assert dog.check([(100, 2), (0, 0)])  # nothing moved for 5.5 s
    (first, silent), _ = dog.silent()
    assert first == 1 and silent == pytest.approx(12.5)  # consumer 1 never moved


def test_start_up_gets_its_own_allowance(clock):
    dog = Watchdog(1, timeout_s=5, startup_s=60)
    assert not dog.check([(0, 0)])
    clock[0] += 64
    assert not dog.check([(0, 0)])  # importing, connecting: 65 s allowed before the first move
    clock[0] += 2
    assert dog.check([(0, 0)])


def test_a_busy_process_is_not_silent(clock):
    """Listing or building an index moves no counter: busy, it is no stall however long."""
    dog = Watchdog(2, timeout_s=5, startup_s=0)
    assert not dog.check([(0, 1), (0, 1)])
    clock[0] += 100
    assert not dog.check([(0, 1), (0, 1)], busy=[True, False])  # consumer 0 lists
    clock[0] += 6
    assert dog.check([(0, 1), (0, 1)], busy=[False, False])  # listed, then nothing for 6 s
    (first, silent), _ = dog.silent()
    assert first == 1 and silent == pytest.approx(106)


# --- signals and parent death: real processes -----------------------------------------------------

PARENT = """
import os, sys, threading, time
from feedbench.core.supervise import children_die_with_parent
children_die_with_parent()

def child():
    time.sleep(60)
    os._exit(0)

by_main = os.fork() or child()
box = []
passing = threading.Thread(target=lambda: box.append(os.fork() or child()))
passing.start()
passing.join()  # the thread that forked it has ended
print(by_main, box[0], flush=True)
time.sleep(60)
"""


def _run(code: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, **kw)  # fmt: skip


def _dies(pid: int, within_s: float) -> bool:
    """Whether ``pid`` ends within ``within_s``: gone, or a zombie (dead; its new parent, init,
    reaps it when it gets to it, which on a loaded machine can take seconds)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_children_die_with_a_parent_killed_outright():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    by_main, by_thread = map(int, parent.stdout.readline().split())
    try:
        time.sleep(0.3)
        # the death signal follows the forking THREAD: one forked by a passing thread is left
        # without it, or it would have died with that thread
        assert psutil.pid_exists(by_thread) and psutil.pid_exists(by_main)
        parent.kill()
        parent.wait()
        assert _dies(by_main, within_s=10)
    finally:
        for pid in (by_main, by_thread):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_child_whose_parent_is_already_gone_leaves():
    dead = subprocess.Popen(["true"])
    dead.wait()
    done = _run(f"from feedbench.core.supervise import die_with_parent\n"
                f"die_with_parent({dead.pid})\nprint('still here')")  # fmt: skip
    assert done.returncode == 128 + signal.SIGKILL and "still here" not in done.stdout


def test_sigterm_and_sighup_stop_as_ctrl_c_does_once_then_are_held():
    code = """
import os, signal, time
from feedbench.core.supervise import sigterm_as_interrupt
with sigterm_as_interrupt() as stop:
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(5)
    except KeyboardInterrupt:
        print("stopped by", stop.signal)
    os.kill(os.getpid(), signal.SIGTERM)  # while stopping: noted, not raised
    time.sleep(0.1)
    stop.hold()
os.kill(os.getpid(), signal.SIGTERM)  # held: ignored after the block too
time.sleep(0.1)
print("written")
"""
    done = _run(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["stopped by SIGHUP", "written"]
