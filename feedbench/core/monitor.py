"""A background sampler of the machine's resources: CPU per core, memory, disk, network, GPU.

``Monitor`` runs one daemon thread that reads counters every ``interval_s`` and turns them into
:class:`~feedbench.core.timeline.MonitorSample` rows; :meth:`Monitor.stop` returns them as a
:class:`~feedbench.core.timeline.Timeline`. Measuring only: nothing here prints or renders.

What is counted (the defaults; pass ``disks=`` / ``nics=`` to name devices yourself):

- CPU: per logical core, busy share of the interval, computed as
  ``psutil.cpu_percent(percpu=True)`` does (busy = total − idle − iowait; guest time is already in
  user time on Linux) but from this monitor's own ``cpu_times`` snapshots, so another caller of
  ``psutil.cpu_percent`` in the same process cannot reset our interval.
- Memory: ``total − available`` (memory not available to new processes; reclaimable page cache is
  excluded, so reading a dataset through the cache does not look like memory pressure).
- Disk: reads of *physical* block devices, so each byte is counted once. On Linux a device counts
  when it is a whole disk (listed in ``/sys/block``; partitions are not), is not a ``loop*``,
  ``ram*`` or ``zram*`` device (their I/O is memory or lands again on a real disk), and is not
  stacked on other devices (``/sys/block/X/slaves`` empty: ``dm-*`` / ``md*`` I/O is counted on
  the disks below). If that leaves nothing (a container that sees only ``dm-0``, say), every
  reported device except ``loop*`` / ``ram*`` / ``zram*`` counts. Elsewhere: every reported disk
  except those names.
- Network: bytes received on non-loopback interfaces. On Linux, when any interface is backed by a
  device (``/sys/class/net/X/device``: a real or virtio NIC) only those count, which leaves out
  bridges, veths, bonds, VLANs and ``ifb*`` mirrors that would count the same packet twice;
  without such a device (inside a container) every non-loopback interface except ``ifb*`` counts.
- GPU: utilisation (%) and used memory (bytes) per device through NVML (``pynvml``), and the SM
  clock (MHz) and power draw (W) where the device reports them (a GPU that throttles under load
  shows as a lower clock). If NVML is missing or fails, the timeline says why in ``note`` and the
  GPU lists stay empty; if only the clock or power cannot be read, only those lists stay empty.

Rates are over the measured time between two readings (``time.monotonic``), not the nominal
interval. :meth:`Monitor.stop` takes a last reading, so a run shorter than one interval still has
one sample; a last interval shorter than half the nominal one is merged into the sample before it
(a few milliseconds of CPU ticks would be noise).
"""

from __future__ import annotations

import contextlib
import math
import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from feedbench.core.files import read_stripped
from feedbench.core.proctree import descendants
from feedbench.core.timeline import MonitorSample, Timeline

_SYS_BLOCK = Path("/sys/block")
_SYS_NET = Path("/sys/class/net")
_MEMORY_DISK = re.compile(r"^(loop|ram|zram)\d+$")
_ARPHRD_LOOPBACK = "772"


def physical_disks(names: list[str] | None = None) -> list[str]:
    """The block devices whose reads :class:`Monitor` sums by default (see the module docstring).

    ``names``: the devices to choose from; by default those ``psutil.disk_io_counters`` reports.
    """
    if names is None:
        names = list((psutil.disk_io_counters(perdisk=True) or {}).keys())
    candidates = [n for n in names if not _MEMORY_DISK.match(n)]
    if not sys.platform.startswith("linux") or not _SYS_BLOCK.is_dir():
        return sorted(candidates)
    chosen = []
    for name in candidates:
        dev = _SYS_BLOCK / name
        if not dev.is_dir():
            continue  # a partition (or unknown to sysfs)
        slaves = dev / "slaves"
        if slaves.is_dir() and any(slaves.iterdir()):
            continue  # dm-* / md*: its I/O is counted on the devices below it
        chosen.append(name)
    return sorted(chosen or candidates)


def external_nics(names: list[str] | None = None) -> list[str]:
    """The network interfaces whose received bytes :class:`Monitor` sums by default.

    ``names``: the interfaces to choose from; by default those ``psutil.net_io_counters`` reports.
    """
    if names is None:
        names = list(psutil.net_io_counters(pernic=True).keys())
    if not sys.platform.startswith("linux") or not _SYS_NET.is_dir():
        return sorted(n for n in names if not re.match(r"^lo\d*$", n))
    outside = [
        n for n in names if n != "lo" and read_stripped(_SYS_NET / n / "type") != _ARPHRD_LOOPBACK
    ]
    devices = [n for n in outside if (_SYS_NET / n / "device").exists()]
    return sorted(devices or [n for n in outside if not n.startswith("ifb")])


@dataclass
class _Reading:
    """Raw cumulative counters at one instant."""

    t: float  # time.monotonic()
    cpu: list[tuple[float, float]]  # per core: (busy s, total s)
    disk_bytes: int
    disk_ops: int
    net_bytes: int
    own_cpu_s: float | None = None  # CPU seconds of the watched process tree
    no_process_s: float = 0.0  # CPU seconds no process owns: steal, interrupts (all cores)
    steal_s: float | None = None  # CPU seconds the hypervisor gave elsewhere (all cores)


def _tree_cpu_s(pid: int) -> float | None:
    """CPU seconds used by ``pid`` and its descendants, the reaped children's included; None
    when ``pid`` is gone."""
    try:
        root = psutil.Process(pid)
        t = root.cpu_times()
    except psutil.Error:
        return None
    total = t.user + t.system + t.children_user + t.children_system
    for child in descendants(pid):
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(child).cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


def _cpu_busy_total(times: Any) -> tuple[float, float]:
    total = sum(times)
    if sys.platform.startswith("linux"):
        total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    busy = total - times.idle - getattr(times, "iowait", 0.0)
    return busy, total


class Monitor:
    """Samples CPU, memory, disk, network and GPU in a background thread.

    >>> m = Monitor(interval_s=0.25, label="4 consumers, cold, repeat 1")
    >>> m.start()
    >>> ...  # the work to watch
    >>> timeline = m.stop()

    or ``with Monitor(...) as m: ...`` and then ``m.timeline``. ``disks`` / ``nics`` name the
    devices to sum (e.g. ``["nvme0n1"]``, ``["eth0"]``); ``None`` picks them as
    :func:`physical_disks` and :func:`external_nics` do. After :meth:`start`, ``self.disks`` and
    ``self.nics`` hold the names counted. ``watch_pid``: the root of a process tree (say the
    benchmark's own processes) whose CPU use each sample records apart, so that what other
    processes used is known.
    """

    def __init__(
        self,
        interval_s: float = 0.25,
        label: str = "",
        disks: list[str] | None = None,
        nics: list[str] | None = None,
        watch_pid: int | None = None,
    ) -> None:
        if not interval_s > 0 or not math.isfinite(interval_s):
            raise ValueError(f"interval_s must be a positive number of seconds, not {interval_s!r}")
        self.interval_s = float(interval_s)
        self.label = label
        self._want_disks = list(disks) if disks is not None else None
        self._want_nics = list(nics) if nics is not None else None
        self._watch = watch_pid
        self.disks: list[str] = []
        self.nics: list[str] = []
        self.timeline: Timeline | None = None
        self._notes: list[str] = []
        self._samples: list[MonitorSample] = []
        self._thread: threading.Thread | None = None
        self._started = False
        self._stop_event = threading.Event()
        self._t0 = 0.0
        self._started_at: float | None = None
        self._prev: _Reading | None = None
        self._before_prev: _Reading | None = None  # the reading the last sample started from
        self._failed = False
        self._nvml: Any = None
        self._clock_power = True  # cleared when the GPUs do not report clock or power
        self._gpu_handles: list[Any] = []

    # --- public -------------------------------------------------------------------------------

    def start(self) -> Monitor:
        if self._started:
            raise RuntimeError("a Monitor can be started once")
        self._started = True
        self._t0 = time.monotonic()
        self._started_at = time.time()
        if self._guarded(self._first_reading):
            self._thread = threading.Thread(target=self._run, name="feedbench-monitor", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> Timeline:
        """Stop sampling; take a last reading; return (and keep in ``self.timeline``) the timeline.

        Calling it again returns the same timeline; calling it without :meth:`start` returns an
        empty timeline whose note says so.
        """
        if self.timeline is not None:
            return self.timeline
        if not self._started:
            self.timeline = Timeline(
                label=self.label, interval_s=self.interval_s, note="monitor was never started"
            )
            return self.timeline
        self._stop_event.set()
        if self._thread is not None:
            self._thread.join()
        if not self._failed:
            self._guarded(self._final_sample)
        self._close_nvml()
        self.timeline = Timeline(
            label=self.label,
            interval_s=self.interval_s,
            samples=list(self._samples),
            gpu="nvml" if any(s.gpu_util_percent for s in self._samples) else None,
            note="; ".join(self._notes) or None,
            started_at=self._started_at,
        )
        return self.timeline

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- sampling -----------------------------------------------------------------------------

    def _run(self) -> None:
        tick = 1
        while True:
            delay = self._t0 + tick * self.interval_s - time.monotonic()
            if self._stop_event.wait(max(0.0, delay)):
                return
            if not self._guarded(self._sample):
                return
            # after a stall, skip the ticks already past instead of sampling in a burst
            tick = max(tick + 1, int((time.monotonic() - self._t0) / self.interval_s) + 1)

    def _guarded(self, fn: Any) -> bool:
        """Run one sampling step; a failure ends sampling and is told in the note, never raised.

        The monitor watches a benchmark: a counter that cannot be read must not end the benchmark.
        """
        try:
            fn()
            return True
        except Exception as e:  # noqa: BLE001 - see the docstring
            self._failed = True
            t = time.monotonic() - self._t0
            self._notes.append(f"sampling stopped at {t:.2f} s: {type(e).__name__}: {e}")
            return False

    def _first_reading(self) -> None:
        self._choose_devices()
        self._open_nvml()
        self._prev = self._reading()
        self._t0 = self._prev.t

    def _sample(self) -> None:
        cur = self._reading()
        assert self._prev is not None
        self._samples.append(self._make_sample(self._prev, cur))
        self._before_prev, self._prev = self._prev, cur

    def _final_sample(self) -> None:
        cur = self._reading()
        assert self._prev is not None
        short = cur.t - self._prev.t < self.interval_s / 2
        if self._samples and short and self._before_prev is not None:
            self._samples[-1] = self._make_sample(self._before_prev, cur)
        else:
            self._samples.append(self._make_sample(self._prev, cur))
        self._before_prev, self._prev = self._prev, cur

    def _reading(self) -> _Reading:
        cpu = [_cpu_busy_total(t) for t in psutil.cpu_times(percpu=True)]
        disk_bytes = disk_ops = 0
        if self.disks:
            per_disk = psutil.disk_io_counters(perdisk=True) or {}
            for name in self.disks:
                c = per_disk.get(name)
                if c is not None:
                    disk_bytes += c.read_bytes
                    disk_ops += c.read_count
        net_bytes = 0
        if self.nics:
            per_nic = psutil.net_io_counters(pernic=True)
            for name in self.nics:
                c = per_nic.get(name)
                if c is not None:
                    net_bytes += c.bytes_recv
        own = _tree_cpu_s(self._watch) if self._watch is not None else None
        t = psutil.cpu_times()
        no_process = sum(getattr(t, k, 0.0) for k in ("steal", "irq", "softirq"))
        steal = getattr(t, "steal", None)  # Linux; 0 on bare metal
        return _Reading(
            time.monotonic(), cpu, disk_bytes, disk_ops, net_bytes, own, no_process, steal
        )

    def _make_sample(self, a: _Reading, b: _Reading) -> MonitorSample:
        dt = b.t - a.t
        per_s = 1.0 / dt if dt > 0 else 0.0
        cpu = []
        # strict=False: should a core be hot-plugged between readings, keep the common ones
        for (busy0, total0), (busy1, total1) in zip(a.cpu, b.cpu, strict=False):
            d_total = total1 - total0
            share = (busy1 - busy0) / d_total if d_total > 0 else 0.0
            cpu.append(round(min(100.0, max(0.0, 100.0 * share)), 2))
        vm = psutil.virtual_memory()
        util, mem = self._gpu_reading()
        clock, power = self._gpu_clock_power() if util else ([], [])
        return MonitorSample(
            t_s=b.t - self._t0,
            cpu_percent=cpu,
            mem_used_bytes=int(vm.total - vm.available),
            disk_read_bytes_per_s=max(0, b.disk_bytes - a.disk_bytes) * per_s,
            disk_read_iops=max(0, b.disk_ops - a.disk_ops) * per_s,
            net_recv_bytes_per_s=max(0, b.net_bytes - a.net_bytes) * per_s,
            gpu_util_percent=util,
            gpu_mem_used_bytes=mem,
            gpu_sm_clock_mhz=clock,
            gpu_power_w=power,
            own_busy_cores=_own_cores(a, b, dt),
            other_busy_cores=_other_cores(a, b, dt, sum(cpu) / 100.0),
            steal_cores=_steal_cores(a, b, dt),
        )

    # --- devices ------------------------------------------------------------------------------

    def _choose_devices(self) -> None:
        try:
            per_disk = psutil.disk_io_counters(perdisk=True) or {}
        except (OSError, RuntimeError) as e:
            per_disk = {}
            self._notes.append(f"disk counters unreadable: {e}")
        if self._want_disks is None:
            self.disks = physical_disks(list(per_disk))
            if not self.disks:
                self._notes.append("no disk counters on this system: disk reads read as 0")
        else:
            self.disks = [d for d in self._want_disks if d in per_disk]
            missing = [d for d in self._want_disks if d not in per_disk]
            if missing:
                self._notes.append(f"no such disk: {', '.join(missing)}")
        try:
            per_nic = psutil.net_io_counters(pernic=True)
        except (OSError, RuntimeError) as e:
            per_nic = {}
            self._notes.append(f"network counters unreadable: {e}")
        if self._want_nics is None:
            self.nics = external_nics(list(per_nic))
        else:
            self.nics = [n for n in self._want_nics if n in per_nic]
            missing = [n for n in self._want_nics if n not in per_nic]
            if missing:
                self._notes.append(f"no such network interface: {', '.join(missing)}")

    def _open_nvml(self) -> None:
        try:
            import pynvml
        except ImportError:
            self._notes.append(
                "no GPU readings: pynvml is not installed (pip install nvidia-ml-py)"
            )
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            self._notes.append(f"no GPU readings: NVML unavailable ({e})")
            return
        try:
            count = pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except pynvml.NVMLError as e:
            self._notes.append(f"no GPU readings: NVML could not list GPUs ({e})")
            pynvml.nvmlShutdown()
            return
        if not handles:
            self._notes.append("no GPU readings: NVML reports no GPUs")
            pynvml.nvmlShutdown()
            return
        self._nvml, self._gpu_handles = pynvml, handles

    def _gpu_reading(self) -> tuple[list[float], list[int]]:
        if self._nvml is None:
            return [], []
        nvml = self._nvml
        try:
            util = [float(nvml.nvmlDeviceGetUtilizationRates(h).gpu) for h in self._gpu_handles]
            mem = [int(nvml.nvmlDeviceGetMemoryInfo(h).used) for h in self._gpu_handles]
        except nvml.NVMLError as e:
            t = time.monotonic() - self._t0
            self._notes.append(f"GPU readings stopped at {t:.2f} s: NVML failed ({e})")
            self._close_nvml()
            return [], []
        return util, mem

    def _gpu_clock_power(self) -> tuple[list[float], list[float]]:
        """SM clock (MHz) and power (W) per GPU; a device that does not report them stops only
        these readings (noted), not utilisation and memory."""
        if self._nvml is None or not self._clock_power:
            return [], []
        nvml = self._nvml
        try:
            clock = [
                float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)) for h in self._gpu_handles
            ]
            power = [nvml.nvmlDeviceGetPowerUsage(h) / 1000.0 for h in self._gpu_handles]
        except nvml.NVMLError as e:
            self._notes.append(f"no GPU clock / power readings: NVML says {e}")
            self._clock_power = False
            return [], []
        return clock, power

    def _close_nvml(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()
            self._nvml, self._gpu_handles = None, []


def _own_cores(a: _Reading, b: _Reading, dt: float) -> float | None:
    """Cores' worth of CPU the watched tree used between two readings (a process that ended
    unreaped takes its time with it: never below 0)."""
    if a.own_cpu_s is None or b.own_cpu_s is None or dt <= 0:
        return None
    return round(max(0.0, b.own_cpu_s - a.own_cpu_s) / dt, 3)


def _steal_cores(a: _Reading, b: _Reading, dt: float) -> float | None:
    """Cores' worth of CPU time the hypervisor ran something else while this machine's vCPUs
    wanted to run (the kernel's steal), between two readings; None where it is not reported."""
    if a.steal_s is None or b.steal_s is None or dt <= 0:
        return None
    return round(max(0.0, b.steal_s - a.steal_s) / dt, 3)


def _other_cores(a: _Reading, b: _Reading, dt: float, busy_cores: float) -> float | None:
    """Cores' worth of CPU that processes outside the watched tree used: the busy cores less
    the tree's own and less what no process owns (a VM's steal time, interrupt handling for
    the tree's own I/O)."""
    own = _own_cores(a, b, dt)
    if own is None:
        return None
    no_process = max(0.0, b.no_process_s - a.no_process_s) / dt
    return round(max(0.0, busy_cores - own - no_process), 3)
