"""THE results schema: dataclasses ↔ JSON with ``schema_version``, written atomically.

Every command writes one such file; every table, plot, comparison and verdict is computed from it.
Numbers stay numbers (seconds, bytes, samples); units are chosen only when rendering.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import types
import typing
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from feedbench import __version__
from feedbench.errors import FeedbenchError

SCHEMA_VERSION = 2


@dataclass
class Percentiles:
    p50_s: float
    p95_s: float
    p99_s: float
    max_s: float


def percentiles(values) -> Percentiles | None:
    """p50/p95/p99 (linear interpolation) and max of a sequence of seconds; None when empty."""
    import numpy as np

    if len(values) == 0:
        return None
    a = np.asarray(values, dtype=np.float64)
    p50, p95, p99 = np.percentile(a, [50, 95, 99])
    return Percentiles(float(p50), float(p95), float(p99), float(a.max()))


def spread(values) -> dict[str, Any]:
    """Repeats summarised: ``n``, ``mean``, ``std`` (sample std; 0 for one value), ``min``,
    ``max`` and ``cv`` (std / mean) of the values that are not None (all None but ``n`` = 0 when
    there are none). The one summary of repeats for the scan's curve and the benchmark scripts."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return {"n": 0, "mean": None, "std": None, "min": None, "max": None, "cv": None}
    mean = statistics.fmean(vals)
    std = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return {
        "n": len(vals),
        "mean": mean,
        "std": std,
        "min": min(vals),
        "max": max(vals),
        "cv": std / mean if mean > 0 else 0.0,
    }


@dataclass
class StageStats:
    """One stage within a pass. ``samples_per_s`` is the stage's own rate: samples / busy s."""

    name: str
    samples: int
    busy_s: float
    in_bytes: int
    samples_per_s: float
    mb_per_s: float  # in_bytes / busy_s / 1e6
    share: float  # busy_s / sum of all stages' busy_s
    latency: Percentiles | None = None
    available: bool = True
    note: str | None = None


@dataclass
class SampleError:
    key: str
    stage: str
    message: str


@dataclass
class CacheState:
    mode: str  # "cold" (evicted before the pass) or "warm" (left as it was)
    resident_before: float | None  # fraction of dataset bytes in the page cache before the pass
    evict_failures: int = 0


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


@dataclass
class Timeline:
    """The monitor's readings during one measurement."""

    label: str  # e.g. "4 consumers, cold, repeat 1"
    interval_s: float
    samples: list[MonitorSample] = field(default_factory=list)
    gpu: str | None = None  # "nvml" when GPUs were read, else None
    note: str | None = None  # why something could not be read


@dataclass
class ConsumerStats:
    """One consumer (one emulated GPU / rank) in one measurement."""

    rank: int
    samples: int
    files: int
    read_bytes: int
    errors: int
    batches: int
    wall_s: float
    first_batch_s: float | None
    samples_per_s: float
    steady_samples_per_s: float | None
    stages: list[StageStats]
    step_s: float = 0.0  # emulated accelerator time over measured (post-warm-up) steps
    data_wait_s: float = 0.0  # time blocked waiting for the next batch, measured steps
    sync_wait_s: float = 0.0  # time waiting for the other consumers at the step barrier
    barrier_idle_s: float | None = None  # the barrier's own cost with no one late (median of 20)
    data_wait: Percentiles | None = None  # per-batch wait distribution
    au: float | None = None  # step / (step + data wait + sync wait); None without an emulated step


@dataclass
class Measurement:
    """One measured configuration: N consumers, one pass (cold/warm), one repeat."""

    consumers: int
    workers: int  # loader workers per consumer
    pass_name: str  # "cold" / "warm"
    repeat: int  # 1-based
    samples: int  # good samples through every chosen stage, all consumers
    files: int
    read_bytes: int  # bytes actually read from storage, all consumers
    errors: int
    batches: int
    wall_s: float  # common start (barrier) to the last consumer's end
    first_batch_s: float | None  # slowest consumer's first batch
    samples_per_s: float  # samples / wall_s
    steady_samples_per_s: float | None  # after warm-up batches, summed over consumers
    mb_per_s: float
    files_per_s: float
    stages: list[StageStats]  # summed over consumers and workers
    cache: CacheState
    per_consumer: list[ConsumerStats] = field(default_factory=list)
    au_mean: float | None = None
    au_min: float | None = None
    monitor: Timeline | None = None
    partial: bool = False


@dataclass
class CurvePoint:
    """Repeats of one (consumers, pass) summarised: the scaling curve is a list of these."""

    consumers: int
    pass_name: str
    repeats: int
    samples_per_s_mean: float
    samples_per_s_std: float
    samples_per_s_min: float
    samples_per_s_max: float
    cv: float  # std / mean
    mb_per_s_mean: float
    efficiency: float | None  # throughput(N) / (N * throughput(1)); None without an N=1 point
    au_mean: float | None = None
    au_min: float | None = None
    rate_basis: str = "steady"  # "steady": after warm-up batches; "pass": whole pass incl. start


@dataclass
class Verdict:
    bound: str  # limiting stage: read/decode/augment/collate/transfer, or "accelerator", "sync"
    resource: str  # storage, cpu, pcie, gpu, none
    text: str  # one sentence for humans
    evidence: list[str] = field(default_factory=list)
    supported_consumers: int | None = None  # largest N with AU >= target (when a step is emulated)
    feeds_accelerators: float | None = None  # throughput / accelerator appetite


@dataclass
class DatasetInfo:
    path: str
    format: str  # "tree" / "shards"
    files: int
    bytes: int
    samples: int | None  # known up front for trees; counted during the scan for shards


@dataclass
class HostInfo:
    hostname: str
    platform: str
    python: str
    cpu_count: int
    memory_bytes: int
    torch: str
    cuda_devices: list[str]

    @staticmethod
    def current() -> HostInfo:
        import psutil
        import torch

        gpus = []
        if torch.cuda.is_available():
            gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        return HostInfo(
            hostname=socket.gethostname(),
            platform=platform.platform(),
            python=sys.version.split()[0],
            cpu_count=os.cpu_count() or 1,
            memory_bytes=psutil.virtual_memory().total,
            torch=torch.__version__,
            cuda_devices=gpus,
        )


@dataclass
class ScanResult:
    kind: str
    created_utc: str
    command: list[str]
    config: dict[str, Any]
    host: HostInfo
    dataset: DatasetInfo
    measurements: list[Measurement] = field(default_factory=list)
    curve: list[CurvePoint] = field(default_factory=list)
    accelerator: dict[str, Any] | None = None  # the emulated step: profile, step_s, rate, source
    verdict: Verdict | None = None
    errors: list[SampleError] = field(default_factory=list)  # the first few, for the report
    warnings: list[str] = field(default_factory=list)
    partial: bool = False
    schema_version: int = SCHEMA_VERSION
    tool_version: str = __version__


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def to_dict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj)


def _build(tp: Any, value: Any) -> Any:
    """Rebuild a value of (possibly generic / optional / dataclass) type ``tp`` from JSON."""
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _build(args[0], value) if len(args) == 1 else value
    if origin is list:
        (inner,) = typing.get_args(tp) or (Any,)
        return [_build(inner, v) for v in value]
    if origin is dict:
        key, inner = typing.get_args(tp) or (str, Any)
        # JSON keys are strings: dict[int, ...] gets its int keys back
        return {(int(k) if key is int else k): _build(inner, v) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value)
    if tp is float and isinstance(value, int):
        return float(value)
    return value


def from_dict(cls: type, data: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: _build(hints[k], v) for k, v in data.items() if k in names}
    return cls(**kwargs)


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` via a temp file in the same folder and a rename."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save(result: Any, path: str | os.PathLike[str]) -> None:
    """Write any results dataclass (scan, verify) as JSON, atomically."""
    try:
        write_atomic(path, json.dumps(to_dict(result), indent=2) + "\n")
    except OSError as e:
        raise FeedbenchError(f"cannot write results to {path}: {e.strerror or e}") from e


def read(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A results file's JSON, of any kind (``data["kind"]``, default "scan"), or one clear error."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError as e:
        raise FeedbenchError(f"no such results file: {path}") from e
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FeedbenchError(f"{path} is not a feedbench results file: {e}") from e
    if not isinstance(data, dict) or "schema_version" not in data:
        raise FeedbenchError(f"{path} is not a feedbench results file (no schema_version)")
    return data


def load(
    path: str | os.PathLike[str],
    kind: str = "scan",
    cls: type | None = None,
    data: dict[str, Any] | None = None,
) -> Any:
    """Read a results file of ``kind`` into ``cls`` (default: :class:`ScanResult`); ``data``:
    its JSON when already :func:`read`."""
    cls = cls or ScanResult
    if data is None:
        data = read(path)
    if data.get("kind", "scan") != kind:
        raise FeedbenchError(f"{path} holds {data.get('kind')!r} results, not {kind} results")
    if data["schema_version"] != SCHEMA_VERSION:
        raise FeedbenchError(
            f"{path} has schema_version {data['schema_version']}; "
            f"this feedbench reads {SCHEMA_VERSION}"
        )
    try:
        return from_dict(cls, data)
    except (TypeError, KeyError, ValueError) as e:
        raise FeedbenchError(f"{path} does not match the {kind} results schema: {e}") from e
