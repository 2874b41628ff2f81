"""The host: cores, the data's mount and disk, versions, fio discovery, other load on the CPUs."""

from __future__ import annotations

import contextlib
import math
import os
import platform
import resource
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")
REPO = Path(__file__).resolve().parents[2]  # scripts/benchlib/machine.py -> the repository


def usable_cores() -> int:
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, math.ceil(int(quota) / int(period))))
    return n


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _block_device(dev: str) -> dict[str, Any]:
    """Model, rotational flag, readahead and scheduler of the disk behind ``/dev/...``."""
    name = os.path.basename(os.path.realpath(dev))
    sys_dir = Path("/sys/class/block") / name
    if (sys_dir / "partition").exists():
        name = sys_dir.resolve().parent.name
    block = Path("/sys/block") / name
    return {
        "name": name,
        "model": _read(block / "device" / "model"),
        "rotational": _read(block / "queue" / "rotational"),
        "read_ahead_kb": _read(block / "queue" / "read_ahead_kb"),
        "scheduler": _read(block / "queue" / "scheduler"),
        "size_bytes": int(_read(block / "size") or 0) * 512,
    }


def mount_of(path: str) -> dict[str, Any]:
    """The mount holding ``path`` (longest mount point prefix) and its block device, if any."""
    real = os.path.realpath(path)
    best: dict[str, Any] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            dev, mnt, fstype, opts = line.split()[:4]
            mnt = mnt.replace("\\040", " ")
            inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
            if inside and len(mnt) >= len(best.get("mount", "")):
                best = {"device": dev, "mount": mnt, "fstype": fstype, "options": opts}
    dev = best.get("device", "")
    if dev.startswith("/dev/"):
        best["block"] = _block_device(dev)
    with contextlib.suppress(OSError):
        st = os.statvfs(real)
        best["free_bytes"] = st.f_bavail * st.f_frsize
    return best


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


def _fio_version(fio: str | None) -> str | None:
    if not fio:
        return None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(
            [fio, "--version"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    return None


def _gpu_names() -> list[str]:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return [x.strip() for x in out.stdout.splitlines() if x.strip()]
    return []


def machine(data_dir: str, fio: str | None) -> dict[str, Any]:
    """The host as the report describes it: CPU, memory, kernel, versions, GPUs, the data's disk."""
    import PIL
    import psutil
    from PIL import features

    import feedbench

    return {
        "hostname": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cores": usable_cores(),
        "memory_bytes": psutil.virtual_memory().total,
        "kernel": platform.release(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "feedbench": feedbench.__version__,
        "pillow": PIL.__version__,
        "libjpeg_turbo": features.version("libjpeg_turbo"),
        "fio": _fio_version(fio),
        "gpus": _gpu_names(),
        "data_filesystem": mount_of(data_dir),
    }


def find_fio(given: str | None) -> tuple[str | None, str | None]:
    """fio on PATH, ``--fio``, or the bundle of scripts/fio_bundle.sh; checked by running it.

    Returns (fio, None), or (None, why) when there is no fio that runs: the caller then skips
    the fio comparison and says why.
    """
    bundled = REPO / ".xfer" / "fio" / "run-fio"
    if given:
        if not (os.path.isfile(given) and os.access(given, os.X_OK)):
            return None, f"fio not found at {given}: skipping the fio comparison"
        fio = os.path.abspath(given)
    elif shutil.which("fio"):
        fio = shutil.which("fio")
    elif bundled.is_file():
        fio = str(bundled)
    else:
        return None, "fio not found (apt-get install fio, or --fio PATH): skipping the fio part"
    try:
        proc = subprocess.run([fio, "--version"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{fio} does not run ({e}): skipping the fio comparison"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"{fio} does not run ({last}): skipping the fio comparison"
    return fio, None


# --- other load on the machine ------------------------------------------------------------------


def _cpu_busy_s() -> float | None:
    """Busy CPU seconds so far of the CPUs this process may run on (/proc/stat, per CPU)."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    mine = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    ticks = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        if mine is not None and int(name[3:]) not in mine:
            continue
        v = [int(x) for x in rest.split()[:8]]  # user nice system idle iowait irq softirq steal
        ticks += sum(v) - v[3] - v[4]
    return ticks / CLK_TCK


def _own_cpu_s() -> float:
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


PR_SET_CHILD_SUBREAPER = 36  # prctl(2): orphaned descendants are re-parented to us


def _adopt_orphans() -> bool:
    """Make this process the subreaper of its descendants (Linux), so that a run's processes
    whose parent exits first (a multiprocessing fork server and the consumers it forked) are
    reaped here and their CPU time counts as the run's, not as other load."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _reap_orphans(timeout_s: float = 10.0) -> int:
    """Wait for adopted descendants to exit (a fork server leaves once its parent has gone) and
    reap them; returns how many. Only for callers that start their runs one at a time."""
    reaped, deadline = 0, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break  # no children left
        if pid == 0:
            time.sleep(0.05)
        else:
            reaped += 1
    return reaped


class CpuMeter:
    """CPU used on our CPUs during a run by anything but this process and its descendants
    (``other_cores``), and by them (``own_cpu_s``, CPU seconds).

    A shared or noisy machine shows up here: ``other_cores`` is that CPU time / wall time. Kernel
    work for our own I/O (readahead, interrupts) counts as other, a few hundredths of a core.
    Descendants orphaned during the run are adopted and reaped (:func:`_adopt_orphans`): their
    CPU time is only known once they are.
    """

    def __enter__(self) -> CpuMeter:
        self.adopting = _adopt_orphans()
        self.b0, self.o0, self.t0 = _cpu_busy_s(), _own_cpu_s(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.adopting:
            _reap_orphans()
        wall = time.perf_counter() - self.t0
        b1 = _cpu_busy_s()
        self.own_cpu_s = _own_cpu_s() - self.o0  # the run's processes, once all are reaped
        self.other_cores = None
        if self.b0 is not None and b1 is not None and wall > 0:
            other = (b1 - self.b0) - self.own_cpu_s
            self.other_cores = max(0.0, other) / wall


def wait_quiet(threshold: float, max_wait_s: float) -> tuple[float, float | None]:
    """Wait (up to ``max_wait_s``) until other load on our CPUs is below ``threshold`` cores."""
    t0 = time.perf_counter()
    load = None
    while True:
        b0 = _cpu_busy_s()
        time.sleep(0.25)
        b1 = _cpu_busy_s()
        if b0 is None or b1 is None:
            return 0.0, None
        load = (b1 - b0) / 0.25
        waited = time.perf_counter() - t0
        if load < threshold or waited >= max_wait_s:
            return waited, load
