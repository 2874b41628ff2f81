"""A run called complete only when it was: signals, a parent killed outright, a full disk.

Real `feedbench scan` processes, real signals, a real full file system (a small tmpfs, mounted
by the test: root only, else skipped)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from feedbench.core.supervise import in_groups
from feedbench.scan import results as scan_results
from tests.conftest import interruptible

MARK = "FEEDBENCH_TEST_RUN"  # in every process of one run: found by it, orphaned or not
REPO = Path(__file__).resolve().parents[2]


def start_scan(
    data: Path, out: Path, *extra: str, mark: str | None = None, driver: Path | None = None
) -> subprocess.Popen:
    """The scan, its output to ``out`` + ".log" (a file: a pipe would be held open by processes
    it leaves behind, and reading it to its end would wait for them). ``driver``: a script run
    in place of ``-m feedbench``, with the same arguments."""
    run = [str(driver)] if driver else ["-m", "feedbench"]
    cmd = [sys.executable, *run, "scan", str(data), "--stages", "read", "-b", "2",
           "--workers", "1", "--json", str(out), "--no-plots", *extra]  # fmt: skip
    env = dict(os.environ, **{MARK: mark or uuid.uuid4().hex})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    with open(log_of(out), "w") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True, preexec_fn=interruptible)  # fmt: skip


def log_of(out: Path) -> Path:
    return out.with_name(out.name + ".log")


def ended(proc: subprocess.Popen, out: Path, timeout_s: float = 60) -> str:
    """Wait for the scan's own process (not for what it may have left running); its output."""
    proc.wait(timeout=timeout_s)
    return log_of(out).read_text()


def marked(mark: str) -> list[int]:
    """The live processes whose environment carries ``MARK=mark`` (zombies are gone)."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    with open(f"/proc/{pid}/stat") as st:
                        if st.read().rpartition(")")[2].split()[0] != "Z":
                            found.append(pid)
        except OSError:
            continue
    return found


def consumers(mark: str, scan_pid: int) -> list[int]:
    """The run's consumer processes: each leads a process group of its own."""
    found = []
    for pid in marked(mark):
        with contextlib.suppress(OSError):
            if pid != scan_pid and os.getpgid(pid) == pid:
                found.append(pid)
    return found


def mark_of(proc: subprocess.Popen) -> str:
    return psutil.Process(proc.pid).environ()[MARK]


def wait_until(check, timeout_s: float, step_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(step_s)
    return bool(check())


def first_write(out: Path, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    """Wait for the results file's first write (after the first consumer count)."""
    assert wait_until(lambda: out.exists() or proc.poll() is not None, timeout_s)
    log = log_of(out)
    assert out.exists(), log.read_text() if log.exists() else f"exit {proc.poll()}"


def gone_within(mark: str, scan_pid: int, timeout_s: float = 2.0) -> list[int]:
    """The run's processes still alive ``timeout_s`` after now (none, when it ends them): those
    carrying its mark and those in its process group (the scan leads one: a process that is
    exiting no longer shows its environment, but is still in its group)."""

    def left() -> list[int]:
        return sorted(set(marked(mark)) | {p.pid for p in in_groups([scan_pid])})

    wait_until(lambda: not left(), timeout_s)
    still = left()
    for pid in still:  # leave nothing behind for the next test, then report them
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return still


# --- signals --------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_a_scan_as_ctrl_c_does(dataset, tmp_path, sig):
    out = tmp_path / "r.json"
    proc = start_scan(dataset / "images", out, "--consumers", "1,2", "--read-latency", "0.05",
                      "--repeat", "2")  # fmt: skip
    mark = mark_of(proc)
    first_write(out, proc)
    proc.send_signal(sig)
    stderr = ended(proc, out)
    assert proc.returncode == 130, stderr
    assert f"interrupted ({sig.name}): partial results written" in stderr
    assert "Traceback" not in stderr
    r = scan_results.load(out)
    assert r.partial and r.stopped_by == "interrupted" and r.failure
    assert r.measurements[0].consumers == 1
    assert gone_within(mark, proc.pid) == []


# The scan itself, with a signal sent to it just after the first of a count's consumers started,
# before the second: a deterministic point in a window a signal at random hits now and then.
SIGNAL_AS_CONSUMERS_START = """
import os, signal, sys
from multiprocessing import process

start, sent = process.BaseProcess.start, []

def start_then_signal(self):
    consumer = getattr(self._target, "__module__", "") == "feedbench.scan.spawn"  # a consumer
    start(self)
    if consumer and not sent:
        sent.append(1)
        os.kill(os.getpid(), signal.SIGHUP)

if __name__ == "__main__":  # not in the consumers, which import this file as their main
    process.BaseProcess.start = start_then_signal
    sys.argv[0] = "feedbench"
    from feedbench.cli import main
    main()
"""


@pytest.mark.slow
def test_a_signal_while_consumers_start_ends_them_all(dataset, tmp_path):
    """Cut between two consumers' starts, the one started was left waiting for the other, and
    the scan's exit waited for it (multiprocessing joins its children at exit): forever."""
    driver = tmp_path / "driver.py"
    driver.write_text(SIGNAL_AS_CONSUMERS_START)
    out = tmp_path / "r.json"
    proc = start_scan(dataset / "images", out, "--consumers", "2", driver=driver)
    mark = mark_of(proc)
    try:
        stderr = ended(proc, out, timeout_s=45)
    finally:
        left = gone_within(mark, proc.pid)
    assert proc.returncode == 130, stderr
    assert "interrupted (SIGHUP)" in stderr and "Traceback" not in stderr
    assert left == []


@pytest.mark.slow
def test_a_file_written_mid_run_says_unfinished_and_the_run_dies_with_its_parent(
    dataset, tmp_path, cli
):
    """SIGKILL after the first of two counts: the file then on disk says partial (never
    complete), ``report`` says so, and every process of the run is gone within 2 s."""
    out = tmp_path / "r.json"
    proc = start_scan(dataset / "images", out, "--consumers", "1,2", "--read-latency", "0.1",
                      "--repeat", "3")  # fmt: skip
    mark = mark_of(proc)
    first_write(out, proc)
    # the second count's two consumers are reading (each leads a process group of its own);
    # orphaned, they would read on for seconds
    assert wait_until(lambda: len(consumers(mark, proc.pid)) == 2, 60)
    time.sleep(0.3)
    proc.kill()
    proc.wait(timeout=30)
    assert gone_within(mark, proc.pid) == []
    r = scan_results.load(out)
    assert r.partial and r.stopped_by == "unfinished"
    assert r.failure and r.failure.startswith("unfinished")
    assert {m.consumers for m in r.measurements} == {1}
    shown = cli("report", str(out))
    assert shown.code == 0 and "Partial results" in shown.out


@pytest.mark.slow
@pytest.mark.usefixtures("torchrun_logs")
def test_a_torchrun_rank_killed_is_one_error_line_and_a_partial_file(dataset, tmp_path):
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "feedbench", "consumer", str(dataset / "images"), "--stages", "read",
           "--workers", "0", "-b", "2", "--passes", "cold,warm", "--repeat", "3",
           "--read-latency", "0.05", "--json", str(out), "--no-plots"]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=env, start_new_session=True)  # fmt: skip
    first_write(out, proc)
    (rank1,) = [p for p in psutil.Process(proc.pid).children()
                if p.environ().get("RANK") == "1"]  # fmt: skip
    rank1.kill()
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0
    (line,) = error_lines(stdout + stderr)
    # rank 0 learns it from its collective, or from the agent's SIGTERM when that comes first
    assert line.startswith(("error: a rank left the job (killed or crashed) after",
                            "error: stopped by torchrun (SIGTERM) after")), line  # fmt: skip
    assert "[rank0]: Traceback" not in stderr
    r = scan_results.load(out)
    assert r.partial and r.stopped_by == "failed" and r.failure == line.removeprefix("error: ")


def check_results_file(out: Path, consumers: set[int], repeat: int) -> str:
    """What the results file left by a stopped run is: absent, partial (and valid), or complete
    (and valid: every planned measurement in it). Anything else fails the test."""
    if not out.exists():
        return "absent"
    r = scan_results.load(out)  # a valid results file, or FeedbenchError
    if r.partial:
        assert r.stopped_by in ("interrupted", "unfinished", "failed") and r.failure, r
        return "partial"
    assert r.stopped_by is None and r.failure is None
    assert sorted(m.consumers for m in r.measurements) == sorted(list(consumers) * repeat)
    return "complete"


class Run:
    """One scan to be stopped by ``sig`` a random delay after it reached ``phase``: "start",
    "consumers" (its consumer processes are up) or "written" (its results file's first write).
    A phase, not a fixed time, so that every state is reached whatever the machine's load."""

    def __init__(self, data: Path, out: Path, sig: signal.Signals, phase: str, delay_s: float):
        self.out, self.sig, self.phase, self.delay_s = out, sig, phase, delay_s
        self.mark = uuid.uuid4().hex
        # reads slowed: a consumer orphaned mid-count would read on for seconds
        self.proc = start_scan(data, out, "--consumers", "1,2", "--repeat", "2",
                               "--read-latency", "0.1", mark=self.mark)  # fmt: skip
        self.fire_at: float | None = None
        self.sent = False

    def reached(self) -> bool:
        if self.phase == "consumers":
            return bool(consumers(self.mark, self.proc.pid))
        return self.phase == "start" or self.out.exists()

    def step(self) -> bool:
        """Signal it when due; True once it was signalled or has ended by itself."""
        if self.sent or self.proc.poll() is not None:
            return True
        if self.fire_at is None:
            with contextlib.suppress(OSError):  # a process gone while looked at
                if self.reached():
                    self.fire_at = time.monotonic() + self.delay_s
        if self.fire_at is not None and time.monotonic() >= self.fire_at:
            self.proc.send_signal(self.sig)
            self.sent = True
        return self.sent


@pytest.mark.slow
def test_killed_at_random_leaves_no_process_and_an_honest_file(dataset, tmp_path):
    """9 runs at once, one per signal (SIGINT, SIGTERM, SIGKILL) and phase, each sent at a random
    (seeded) moment after its phase (they mostly sleep in their slowed reads): 2 s after the
    run's process has gone no process of it is left (none carrying its mark, none in its process
    group), and its results file is absent, partial or complete, and says which. (Every pair
    once: 20 random draws took 127 s of a 2-core CI run and could miss a pair.)"""
    rng = random.Random(25)
    signals = [signal.SIGINT, signal.SIGTERM, signal.SIGKILL]
    plans = [(sig, phase, rng.uniform(0.0, 1.5))
             for sig in signals for phase in ("start", "consumers", "written")]  # fmt: skip
    runs = [Run(dataset / "images", tmp_path / f"r{i}.json", *plan) for i, plan in enumerate(plans)]
    deadline = time.monotonic() + 180
    while not all([run.step() for run in runs]) and time.monotonic() < deadline:
        time.sleep(0.02)
    seen: list[str] = []
    for run in runs:
        stderr = ended(run.proc, run.out)
        assert gone_within(run.mark, run.proc.pid) == [], (run.sig.name, run.phase, stderr)
        seen.append(check_results_file(run.out, {1, 2}, 2))
    assert "partial" in seen  # some stopped mid-run, at least


# --- a full disk ----------------------------------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path):
    """A real file system of ``size`` bytes (tmpfs): ``small_fs("40k")`` mounts one, unmounted at
    teardown. Needs root (CAP_SYS_ADMIN): skipped without."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        where = tmp_path / f"fs{len(mounted)}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(where: Path) -> None:
    """Fill the file system at ``where`` to its last byte."""
    fd = os.open(where / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        for size in (65536, 4096, 512, 1):  # down to the last byte
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("error:")]


@pytest.mark.slow
def test_results_that_fit_are_kept_when_the_plots_do_not(dataset, small_fs):
    """40 KB: the results file fits (twice, for its atomic rewrite), the first plot not."""
    where = small_fs("40k")
    out = where / "r.json"
    cmd = [sys.executable, "-m", "feedbench", "scan", str(dataset / "images"), "--stages", "read",
           "-b", "4", "--workers", "0", "--json", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 4, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = error_lines(done.stderr)
    assert "measured, not all written" in line and "No space left on device" in line
    assert "r-scaling.png" in line
    r = scan_results.load(out)  # complete: the one output that fitted
    assert not r.partial and r.stopped_by is None and len(r.measurements) == 1
    assert sorted(p.name for p in where.iterdir()) == ["r.json"]  # no half-written plot
    assert "samples/s" in done.stdout  # the measurement shown


@pytest.mark.slow
def test_a_full_disk_mid_scan_says_measured_not_written(dataset, small_fs):
    """No byte free: the scan still measures every count and shows it; one error line, exit 4
    (not 2, which says nothing was measured)."""
    where = small_fs("64k")
    fill(where)
    out = where / "r.json"
    cmd = [sys.executable, "-m", "feedbench", "scan", str(dataset / "images"), "--stages", "read",
           "-b", "4", "--workers", "0", "--consumers", "1,2", "--json", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 4, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = error_lines(done.stderr)
    assert f"cannot write results to {out}: No space left on device" in line
    assert not out.exists()
    assert done.stdout.count("consumers") >= 1 and "results:" not in done.stdout


@pytest.fixture(scope="module")
def a_scan(tmp_path_factory, dataset) -> Path:
    """A real scan's results file (1 consumer, the read stage)."""
    out = tmp_path_factory.mktemp("scan") / "s.json"
    cmd = [sys.executable, "-m", "feedbench", "scan", str(dataset / "images"), "--stages", "read",
           "-b", "4", "--workers", "0", "--no-plots", "--json", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return out


@pytest.mark.parametrize("fmt", ["html", "md", "csv"])
def test_report_pages_on_a_full_disk(a_scan, small_fs, cli, fmt):
    where = small_fs("16k")
    fill(where)
    page = where / f"page.{fmt}"
    run = cli("report", str(a_scan), f"--{fmt}", str(page))
    assert run.code == 4, run.err
    (line,) = error_lines(run.err)
    assert f"cannot write {page}: No space left on device" in line
    assert not page.exists() and [p.name for p in where.iterdir()] == ["filler"]


def test_a_comparison_on_a_full_disk(a_scan, small_fs, cli):
    where = small_fs("16k")
    fill(where)
    run = cli("compare", str(a_scan), str(a_scan), "-L", "a", "-L", "b", "--json",
              str(where / "c.json"))  # fmt: skip
    assert run.code == 4, run.err
    (line,) = error_lines(run.err)
    assert "No space left on device" in line
