import math
import os
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from feedbench.core.monitor import Monitor, external_nics, physical_disks
from feedbench.core.timeline import MonitorSample, Timeline, summarize
from feedbench.scan import cache


def _integral(timeline: Timeline, rate) -> float:
    """∫ rate dt over the timeline: each sample's rate times the span it covers."""
    total, prev = 0.0, 0.0
    for s in timeline.samples:
        total += rate(s) * (s.t_s - prev)
        prev = s.t_s
    return total


def _check_shape(timeline: Timeline) -> None:
    cores = psutil.cpu_count()
    prev = 0.0
    for s in timeline.samples:
        assert s.t_s > prev
        prev = s.t_s
        assert len(s.cpu_percent) == cores
        assert all(0.0 <= p <= 100.0 for p in s.cpu_percent)
        assert s.mem_used_bytes > 0
        for rate in (s.disk_read_bytes_per_s, s.disk_read_iops, s.net_recv_bytes_per_s):
            assert rate >= 0 and math.isfinite(rate)
        assert len(s.gpu_util_percent) == len(s.gpu_mem_used_bytes)
        # clock and power: for every GPU read, or none where the devices do not report them
        assert len(s.gpu_sm_clock_mhz) in (0, len(s.gpu_util_percent))
        assert len(s.gpu_power_w) == len(s.gpu_sm_clock_mhz)
        assert all(c > 0 for c in s.gpu_sm_clock_mhz) and all(w >= 0 for w in s.gpu_power_w)
    if timeline.gpu is None:  # no NVML here: the lists stay empty and the note says why
        assert all(not s.gpu_util_percent for s in timeline.samples)
        assert "GPU" in (timeline.note or "")


def test_a_busy_process_shows_as_busy_cores():
    with Monitor(interval_s=0.1, label="burn") as m:
        burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(1.0)
            burned = psutil.Process(burner.pid).cpu_times()
        finally:
            burner.kill()
            burner.wait()
    tl = m.timeline
    assert tl.label == "burn" and tl.interval_s == 0.1
    assert len(tl.samples) >= 5
    _check_shape(tl)
    burned_s = burned.user + burned.system
    assert burned_s > 0.3  # the burner ran (even on a crowded machine)
    # the monitor saw at least the CPU the burner used (other processes only add to it)
    seen_core_s = _integral(tl, lambda s: sum(s.cpu_percent) / 100)
    assert seen_core_s >= 0.8 * burned_s
    assert summarize(tl)["busy_cores_max"] >= 0.8


def test_the_watched_tree_is_counted_apart_from_other_processes():
    """A burner inside the watched tree is the tree's own CPU; one outside it is not."""
    burn = [sys.executable, "-c", "while True: pass"]
    root = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; "
                             f"subprocess.run({burn!r})"])  # fmt: skip
    outside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with Monitor(interval_s=0.1, watch_pid=root.pid) as inside:
            time.sleep(1.0)
        with Monitor(interval_s=0.1, watch_pid=outside.pid) as other:
            time.sleep(1.0)
    finally:
        for p in psutil.Process(root.pid).children(recursive=True) + [root, outside]:
            p.kill()
        root.wait()
        outside.wait()
    mine = summarize(inside.timeline)
    assert mine["own_busy_cores_mean"] >= 0.25  # the grandchild burner is the tree's
    theirs = summarize(other.timeline)  # (≥ 0.25: other tests may share the cores)
    assert theirs["own_busy_cores_mean"] < 0.1 and theirs["busy_cores_mean"] >= 0.25
    assert theirs["other_busy_cores_mean"] >= 0.2  # the burner, as another process
    assert summarize(Monitor(interval_s=0.1).start().stop()).get("own_busy_cores_mean") is None


def test_reading_an_evicted_file_shows_disk_reads(tmp_path):
    path = tmp_path / "blob.bin"
    size = 64 * 2**20
    with open(path, "wb") as f:
        for _ in range(size // 2**20):
            f.write(os.urandom(2**20))
    cache.evict([str(path)])
    if cache.residency([str(path)]).fraction > 0.1:
        pytest.skip("this filesystem keeps the file in the page cache after fadvise DONTNEED")
    with Monitor(interval_s=0.1) as m, open(path, "rb") as f:
        while f.read(2**20):
            pass
    tl = m.timeline
    _check_shape(tl)
    read = _integral(tl, lambda s: s.disk_read_bytes_per_s)
    if read == 0:
        pytest.skip(
            f"disk counters of {m.disks or 'no disk'} did not move while reading 64 MB from "
            "disk: this system (e.g. a container without block stats) does not report block I/O"
        )
    assert max(s.disk_read_bytes_per_s for s in tl.samples) > 0
    assert read >= 0.5 * size
    assert _integral(tl, lambda s: s.disk_read_iops) >= 1
    assert summarize(tl)["disk_read_mb_per_s_max"] > 0


def _loopback_transfer(nbytes: int) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    got = []

    def serve():
        conn, _ = server.accept()
        with conn:
            n = 0
            while chunk := conn.recv(2**20):
                n += len(chunk)
            got.append(n)

    t = threading.Thread(target=serve)
    t.start()
    with socket.create_connection(server.getsockname()) as c:
        c.sendall(b"\0" * nbytes)
    t.join()
    server.close()
    assert got == [nbytes]


@pytest.mark.net
def test_loopback_traffic_is_not_network_traffic_by_default():
    nbytes = 64 * 2**20
    assert "lo" not in external_nics()
    with Monitor(interval_s=0.1) as default:
        _loopback_transfer(nbytes)
    assert "lo" not in default.nics
    seen = _integral(default.timeline, lambda s: s.net_recv_bytes_per_s)
    assert seen < 0.25 * nbytes  # whatever else arrived meanwhile, not our 64 MB
    if "lo" not in psutil.net_io_counters(pernic=True):
        pytest.skip("no interface named lo to count explicitly")
    with Monitor(interval_s=0.1, nics=["lo"]) as lo:
        _loopback_transfer(nbytes)
    assert lo.nics == ["lo"]
    assert _integral(lo.timeline, lambda s: s.net_recv_bytes_per_s) >= 0.9 * nbytes


def test_default_devices_leave_out_memory_disks_and_partitions():
    disks = physical_disks()
    assert not [d for d in disks if d.startswith(("loop", "ram", "zram"))]
    if os.path.isdir("/sys/block"):
        assert all(os.path.isdir(f"/sys/block/{d}") for d in disks)
    # the names it chooses from can be given; partitions and memory disks go
    if os.path.isdir("/sys/block/loop0") and disks:
        assert physical_disks(["loop0", disks[0], disks[0] + "1"]) == [disks[0]]


def test_named_devices_that_do_not_exist_are_noted_not_fatal():
    with Monitor(interval_s=0.05, disks=["no-such-disk"], nics=["no-such-nic"]) as m:
        time.sleep(0.12)
    tl = m.timeline
    assert tl.samples and m.disks == [] and m.nics == []
    assert "no such disk: no-such-disk" in tl.note
    assert "no such network interface: no-such-nic" in tl.note
    assert all(s.disk_read_bytes_per_s == 0 and s.net_recv_bytes_per_s == 0 for s in tl.samples)


def test_stop_without_start_returns_an_empty_timeline():
    m = Monitor(interval_s=0.5, label="never")
    tl = m.stop()
    assert tl.samples == [] and tl.label == "never" and tl.note == "monitor was never started"
    assert m.stop() is tl
    assert summarize(tl) == {"samples": 0.0, "duration_s": 0.0}


def test_a_run_shorter_than_one_interval_has_one_sample():
    m = Monitor(interval_s=5.0)
    before = time.time()
    m.start()
    tl = m.stop()
    assert tl.started_at is not None and before <= tl.started_at <= time.time()  # its t_s = 0
    assert len(tl.samples) == 1
    _check_shape(tl)
    assert 0 < tl.samples[0].t_s < 1.0
    assert m.stop() is tl
    with pytest.raises(RuntimeError):
        m.start()


def test_a_short_tail_is_merged_not_a_noisy_extra_sample():
    m = Monitor(interval_s=0.2).start()
    time.sleep(0.45)
    tl = m.stop()
    _check_shape(tl)
    spans = [b.t_s - a.t_s for a, b in zip(tl.samples, tl.samples[1:], strict=False)]
    assert all(span >= 0.1 for span in [tl.samples[0].t_s, *spans])


def test_interval_must_be_positive():
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError):
            Monitor(interval_s=bad)


def _s(t, cpu, disk=0.0, iops=0.0, net=0.0, gpu=(), mem=1, clock=(), power=()):
    return MonitorSample(
        t_s=t,
        cpu_percent=list(cpu),
        mem_used_bytes=mem,
        disk_read_bytes_per_s=disk,
        disk_read_iops=iops,
        net_recv_bytes_per_s=net,
        gpu_util_percent=list(gpu),
        gpu_mem_used_bytes=[0] * len(gpu),
        gpu_sm_clock_mhz=list(clock),
        gpu_power_w=list(power),
    )


# (samples, expected subset of summarize()) — numbers worked out by hand
SUMMARIES = [
    pytest.param(
        [_s(1.0, [100, 0], disk=2e6, iops=10, net=1e6, mem=5)],
        {
            "samples": 1.0,
            "duration_s": 1.0,
            "cpu_percent_mean": 50.0,
            "cpu_percent_max": 50.0,
            "busy_cores_mean": 1.0,
            "busy_cores_max": 1.0,
            "cores_saturated": 1.0,
            "cores": 2.0,
            "mem_used_bytes_max": 5.0,
            "disk_read_mb_per_s_mean": 2.0,
            "disk_read_mb_per_s_max": 2.0,
            "disk_read_iops_mean": 10.0,
            "net_recv_mb_per_s_mean": 1.0,
            "net_recv_mb_per_s_max": 1.0,
        },
        id="one-sample",
    ),
    pytest.param(
        # spans 1 s and 3 s: means weigh the second sample three times
        [
            _s(1.0, [100, 100, 0, 0], disk=4e6, iops=100, net=0, mem=3),
            _s(4.0, [100, 80, 40, 0], disk=0, iops=20, net=8e6, mem=7),
        ],
        {
            "samples": 2.0,
            "duration_s": 4.0,
            "cpu_percent_mean": (50 * 1 + 55 * 3) / 4,  # 53.75
            "cpu_percent_max": 55.0,
            "busy_cores_mean": (2.0 * 1 + 2.2 * 3) / 4,  # 2.15
            "busy_cores_max": 2.2,
            "cores_saturated": 1.0,  # core 0 at 100; core 1 at (100 + 240) / 4 = 85
            "cores": 4.0,
            "mem_used_bytes_max": 7.0,
            "disk_read_mb_per_s_mean": 1.0,
            "disk_read_mb_per_s_max": 4.0,
            "disk_read_iops_mean": 40.0,
            "net_recv_mb_per_s_mean": 6.0,
            "net_recv_mb_per_s_max": 8.0,
        },
        id="time-weighted",
    ),
    pytest.param(
        [
            _s(0.5, [90, 90], gpu=[100, 50]),
            _s(1.0, [90, 89], gpu=[0, 50]),
        ],
        {
            "cores_saturated": 1.0,  # core 1 averages 89.5: below 90
            "busy_cores_mean": 1.795,
            "gpu_util_percent_mean": 50.0,  # (75 + 25) / 2
            "gpu_util_percent_max": 75.0,
        },
        id="gpu-and-the-90-percent-line",
    ),
    pytest.param(
        [
            _s(0.5, [50], gpu=[10, 20], clock=[345, 345], power=[80, 80]),  # idle: not counted
            _s(1.0, [50], gpu=[95, 97], clock=[1980, 1755], power=[610, 700]),
            _s(1.5, [50], gpu=[96, 40], clock=[1980, 1980], power=[560, 300]),  # GPU 1 not
        ],
        {
            "gpu_sm_clock_mhz_min_loaded": 1755.0,
            "gpu_sm_clock_mhz_max_loaded": 1980.0,
            "gpu_power_w_max_loaded": 700.0,
        },
        id="clock-and-power-under-load",
    ),
    pytest.param(
        # one GPU busy, its neighbour idle at its idle clock (the H200 host, 2026-11-30): the
        # idle one is not "under load" even though the mean of the two is 50%
        [_s(1.0, [50], gpu=[100, 0], clock=[1980, 345], power=[691, 79])],
        {
            "gpu_sm_clock_mhz_min_loaded": 1980.0,
            "gpu_sm_clock_mhz_max_loaded": 1980.0,
            "gpu_power_w_max_loaded": 691.0,
        },
        id="idle-gpu-beside-a-busy-one",
    ),
    pytest.param(
        # every sample at t = 0 (hand-made): equal weights instead of dividing by zero
        [_s(0.0, [20]), _s(0.0, [40])],
        {"cpu_percent_mean": 30.0, "busy_cores_mean": 0.3, "duration_s": 0.0},
        id="zero-spans",
    ),
]


@pytest.mark.parametrize(("samples", "expected"), SUMMARIES)
def test_summarize(samples, expected):
    got = summarize(Timeline(label="t", interval_s=1.0, samples=samples))
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-12), key
    assert all(isinstance(v, float) for v in got.values())
    if not any(s.gpu_util_percent for s in samples):
        assert "gpu_util_percent_mean" not in got  # not measured is not zero
    if not any(s.gpu_sm_clock_mhz for s in samples):
        assert "gpu_sm_clock_mhz_min_loaded" not in got


def test_steal_is_read_time_weighted_and_absent_where_unread():
    """The hypervisor's steal, cores' worth (a VM's): weighed by each reading's span like the
    other means; a timeline without it (bare counters unread, an older file) has no key."""
    a, b = _s(1.0, [50, 50]), _s(4.0, [50, 50])
    a.steal_cores, b.steal_cores = 0.4, 0.0
    got = summarize(Timeline(label="t", interval_s=1.0, samples=[a, b]))
    assert got["steal_cores_mean"] == pytest.approx(0.1)  # (0.4 × 1 + 0 × 3) / 4
    plain = summarize(Timeline(label="t", interval_s=1.0, samples=[_s(1.0, [50])]))
    assert "steal_cores_mean" not in plain


def test_steal_between_two_readings_is_cores_worth():
    from feedbench.core.monitor import _Reading, _steal_cores

    def reading(t, steal):
        return _Reading(t, [], 0, 0, 0, steal_s=steal)

    assert _steal_cores(reading(10.0, 5.0), reading(12.0, 6.0), 2.0) == 0.5
    assert _steal_cores(reading(10.0, 6.0), reading(12.0, 5.0), 2.0) == 0.0  # never below 0
    assert _steal_cores(reading(10.0, None), reading(12.0, 6.0), 2.0) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="steal is a Linux counter")
def test_a_linux_monitor_records_steal():
    with Monitor(interval_s=0.1) as m:
        time.sleep(0.35)
    assert m.timeline.samples and all(s.steal_cores is not None for s in m.timeline.samples)
    assert all(0 <= s.steal_cores <= len(s.cpu_percent) for s in m.timeline.samples)
