"""The resource timeline a measurement records (the schema), and the one rule for reading it.

:func:`summarize` is how every command reads a timeline: time-weighted means over a window,
whole-machine CPU, the GPUs a run used, and the "under load" rule for GPU clocks and power (a
GPU's reading counts only while that GPU is at least ``LOADED_PERCENT`` busy: an idle GPU lowers
its clock by design, also beside a busy one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

LOADED_PERCENT = 50.0
# Steal (a VM's vCPUs kept waiting by the hypervisor) from this share of the machine's cores on
# is worth saying: a host-bound step (small batches) runs on two threads, and a vCPU that loses
# this share of its time loses it from the step.
STEAL_SAID = 0.01


def steal_said(steal_cores: float | None, cores: int) -> bool:
    """Whether ``steal_cores`` (a window's mean) is enough of ``cores`` to say (STEAL_SAID)."""
    return steal_cores is not None and cores > 0 and steal_cores >= STEAL_SAID * cores


@dataclass
class MonitorSample:
    """One reading of the machine's resources (rates are over the interval ending at ``t_s``)."""

    t_s: float  # seconds since the monitor started
    cpu_percent: list[float]  # per logical core, 0..100
    mem_used_bytes: int
    disk_read_bytes_per_s: float
    disk_read_iops: float
    net_recv_bytes_per_s: float
    gpu_util_percent: list[float] = field(default_factory=list)  # per GPU (NVML), empty without
    gpu_mem_used_bytes: list[int] = field(default_factory=list)
    # per GPU (NVML), empty where not readable: a clock below the GPU's usual under load, with
    # the power at its limit, is throttling
    gpu_sm_clock_mhz: list[float] = field(default_factory=list)
    gpu_power_w: list[float] = field(default_factory=list)
    # cores' worth of CPU used by the watched process tree (the scan's own processes); None
    # when no tree was watched: busy cores less this is what other processes used
    own_busy_cores: float | None = None
    # cores' worth used by processes outside that tree (steal and interrupts left out)
    other_busy_cores: float | None = None
    # cores' worth of time a VM's vCPUs wanted to run and the hypervisor ran something else
    # (steal; 0 on bare metal); counted as busy in cpu_percent. None: not reported, or an older
    # file
    steal_cores: float | None = None


@dataclass
class Timeline:
    """The monitor's readings during one measurement."""

    label: str  # e.g. "4 consumers, cold, repeat 1"
    interval_s: float
    samples: list[MonitorSample] = field(default_factory=list)
    gpu: str | None = None  # "nvml" when GPUs were read, else None
    note: str | None = None  # why something could not be read
    # the monitor's start (t_s = 0), seconds since the epoch: places the consumers' windows on
    # its clock; None in older files
    started_at: float | None = None


def _weights(samples: list[MonitorSample], start_s: float | None, end_s: float | None):
    """Each sample's weight: the part of its interval (previous ``t_s`` to its own) inside the
    window; the whole interval without one. Equal weights where every interval is empty."""
    lo = float("-inf") if start_s is None else start_s
    hi = float("inf") if end_s is None else end_s
    picked, prev = [], 0.0
    for s in samples:
        overlap = min(s.t_s, hi) - max(prev, lo)
        if overlap > 0:
            picked.append((s, overlap))
        prev = s.t_s
    if picked:
        return picked
    if start_s is None and end_s is None:
        return [(s, 1.0) for s in samples]
    # a window shorter than one reading: the reading nearest its end
    return [(min(samples, key=lambda s: abs(s.t_s - hi)), 1.0)]


def _mean(pairs: list[tuple[float, float]]) -> float:
    return sum(v * w for v, w in pairs) / sum(w for _, w in pairs)


def summarize(
    timeline: Timeline | None,
    start_s: float | None = None,
    end_s: float | None = None,
    gpus: list[int] | None = None,
) -> dict[str, float]:
    """Numbers about a timeline, over the window ``[start_s, end_s]`` (monitor clock; default
    the whole timeline): means weighted by each reading's time in the window.

    Keys (all floats): ``samples``, ``duration_s``; with readings ``cpu_percent_mean`` /
    ``_max`` (whole machine, 0..100), ``busy_cores_mean`` / ``_max`` (Σ per-core % / 100),
    ``cores_saturated`` (cores ≥ 90% busy on average), ``cores``, ``mem_used_bytes_max``,
    ``disk_read_mb_per_s_mean`` / ``_max``, ``disk_read_iops_mean``, ``net_recv_mb_per_s_mean``
    / ``_max``, where a process tree was watched ``own_busy_cores_mean`` and
    ``other_busy_cores_mean``, where steal was read ``steal_cores_mean``; with GPU readings (the
    GPUs in ``gpus``, default all) ``gpu_util_percent_mean`` / ``_max`` and
    ``gpu_mem_used_bytes_max``; under load (module docstring)
    ``gpu_sm_clock_mhz_min_loaded`` / ``_max_loaded``, ``gpu_power_w_mean_loaded`` /
    ``_max_loaded``. A key that is absent was not measured: it is not zero.
    """
    samples = timeline.samples if timeline is not None else []
    if not samples:
        return {"samples": 0.0, "duration_s": 0.0}
    picked = _weights(samples, start_s, end_s)
    lo = 0.0 if start_s is None else max(0.0, start_s)
    hi = samples[-1].t_s if end_s is None else min(end_s, samples[-1].t_s)
    out = {"samples": float(len(picked)), "duration_s": float(max(0.0, hi - lo))}
    out.update(_cpu_disk_net(picked))
    out.update(_gpu(picked, gpus))
    return out


def _cpu_disk_net(picked: list[tuple[MonitorSample, float]]) -> dict[str, float]:
    machine = [(sum(s.cpu_percent) / len(s.cpu_percent) if s.cpu_percent else 0.0, w)
               for s, w in picked]  # fmt: skip
    busy = [(sum(s.cpu_percent) / 100.0, w) for s, w in picked]
    cores = max(len(s.cpu_percent) for s, _ in picked)
    per_core = [
        _mean([(s.cpu_percent[i] if i < len(s.cpu_percent) else 0.0, w) for s, w in picked])
        for i in range(cores)
    ]
    disk = [(s.disk_read_bytes_per_s / 1e6, w) for s, w in picked]
    net = [(s.net_recv_bytes_per_s / 1e6, w) for s, w in picked]
    own = [(s.own_busy_cores, w) for s, w in picked if s.own_busy_cores is not None]
    other = [(s.other_busy_cores, w) for s, w in picked if s.other_busy_cores is not None]
    steal = [(s.steal_cores, w) for s, w in picked if s.steal_cores is not None]
    mine = {"own_busy_cores_mean": _mean(own)} if own else {}
    if other:
        mine["other_busy_cores_mean"] = _mean(other)
    if steal:
        mine["steal_cores_mean"] = _mean(steal)
    return mine | {
        "cpu_percent_mean": _mean(machine),
        "cpu_percent_max": max(v for v, _ in machine),
        "busy_cores_mean": _mean(busy),
        "busy_cores_max": max(v for v, _ in busy),
        "cores_saturated": float(sum(1 for p in per_core if p >= 90.0)),
        "cores": float(cores),
        "mem_used_bytes_max": float(max(s.mem_used_bytes for s, _ in picked)),
        "disk_read_mb_per_s_mean": _mean(disk),
        "disk_read_mb_per_s_max": max(v for v, _ in disk),
        "disk_read_iops_mean": _mean([(s.disk_read_iops, w) for s, w in picked]),
        "net_recv_mb_per_s_mean": _mean(net),
        "net_recv_mb_per_s_max": max(v for v, _ in net),
    }


def _gpu(picked: list[tuple[MonitorSample, float]], gpus: list[int] | None) -> dict[str, float]:
    def used(values: list) -> list:
        return list(values) if gpus is None else [values[i] for i in gpus if i < len(values)]

    out: dict[str, float] = {}
    util = [(sum(u) / len(u), w) for s, w in picked if (u := used(s.gpu_util_percent))]
    if util:
        out["gpu_util_percent_mean"] = _mean(util)
        out["gpu_util_percent_max"] = max(v for v, _ in util)
    mem = [m for s, _ in picked for m in used(s.gpu_mem_used_bytes)]
    if mem:
        out["gpu_mem_used_bytes_max"] = float(max(mem))
    clocks, watts = [], []  # under load only, GPU by GPU
    for s, w in picked:
        index = list(range(len(s.gpu_util_percent))) if gpus is None else gpus
        for i in index:
            if i < len(s.gpu_util_percent) and s.gpu_util_percent[i] >= LOADED_PERCENT:
                if i < len(s.gpu_sm_clock_mhz):
                    clocks.append(s.gpu_sm_clock_mhz[i])
                if i < len(s.gpu_power_w):
                    watts.append((s.gpu_power_w[i], w))
    if clocks:
        out["gpu_sm_clock_mhz_min_loaded"] = float(min(clocks))
        out["gpu_sm_clock_mhz_max_loaded"] = float(max(clocks))
    if watts:
        out["gpu_power_w_mean_loaded"] = _mean(watts)
        out["gpu_power_w_max_loaded"] = float(max(v for v, _ in watts))
    return out
