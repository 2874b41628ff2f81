"""THE results convention: dataclasses ↔ JSON with ``schema_version``, written atomically.

Every command writes one results file whose envelope says what it is (``kind``,
``schema_version``, ``tool_version``), when (``created_utc``), how it was asked for
(``command``, credentials redacted) and where it ran (``host``); every table, plot, comparison
and verdict is computed from such a file. Numbers stay numbers (seconds, bytes, samples); units
are chosen only when rendering.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import socket
import sys
import types
import typing
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from feedbench.core.errors import FeedbenchError, NotWritten
from feedbench.core.files import write_atomic
from feedbench.core.system import SystemUnderTest
from feedbench.version import __version__

SCHEMA_VERSION = 2


@dataclass
class SkippedFile:
    """A file listing left out (an image outside a class folder, a file of another format, an
    unreadable one), and why."""

    path: str
    reason: str


@dataclass
class DatasetInfo:
    path: str
    format: str  # "tree" / "shards"
    files: int
    bytes: int
    samples: int | None  # known up front for trees; counted during the scan for shards
    skipped_files: int = 0  # files listing left out, wholly or in part (a cut-off TFRecord tail)
    skipped: list[SkippedFile] = field(default_factory=list)  # the first few of them


@dataclass
class HostInfo:
    hostname: str
    platform: str
    python: str
    cpu_count: int
    memory_bytes: int
    torch: str
    cuda_devices: list[str]
    cpu_model: str | None = None
    nics: list[str] = field(default_factory=list)  # "eth0: 25,000 Mb/s, MTU 9000", up ones

    @staticmethod
    def current() -> HostInfo:
        import psutil

        return HostInfo(
            hostname=socket.gethostname(),
            platform=platform.platform(),
            python=sys.version.split()[0],
            cpu_count=os.cpu_count() or 1,
            memory_bytes=psutil.virtual_memory().total,
            torch=_torch_version(),
            cuda_devices=cuda_devices(),
            cpu_model=_cpu_model(),
            nics=_nics(),
        )


def _torch_version() -> str:
    """torch.__version__ (with its build, e.g. 2.14.1+cu130), read without importing torch: from
    torch/version.py, which the wheel writes; else the package's metadata (no build suffix)."""
    if "torch" in sys.modules:
        return sys.modules["torch"].__version__
    spec = importlib.util.find_spec("torch")
    if spec is None:
        return "not installed"
    for folder in spec.submodule_search_locations or []:
        with contextlib.suppress(OSError):
            text = (Path(folder) / "version.py").read_text()
            found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", text, re.MULTILINE)
            if found:
                return found.group(1)
    return importlib.metadata.version("torch")


def cuda_devices() -> list[str]:
    """The GPUs torch sees. A process that has not imported torch imports it for this only where
    the driver (NVML) reports a GPU: on a machine without one, writing a results file (compare,
    report, a scan's parent) then costs no torch import, seconds on a small VM."""
    if "torch" not in sys.modules and not _nvml_gpu_count():
        return []
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def _nvml_gpu_count() -> int:
    """GPUs the NVIDIA driver reports; 0 without the driver or nvidia-ml-py."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # ImportError, or NVMLError: no driver, no library
        return 0


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or None


def _nics() -> list[str]:
    """The machine's network interfaces that are up (as the monitor counts them), with speed."""
    import psutil

    from feedbench.core.monitor import external_nics

    stats = psutil.net_if_stats()
    out = []
    for name in external_nics(list(stats)):
        st = stats[name]
        if st.isup:
            speed = f"{st.speed:,} Mb/s" if st.speed else "speed unknown"
            out.append(f"{name}: {speed}, MTU {st.mtu}")
    return out


@dataclass(kw_only=True)
class Envelope:
    """What every results file says about itself; each kind adds its own fields."""

    kind: str
    created_utc: str
    command: list[str]  # as typed, credentials redacted
    config: dict[str, Any]
    host: HostInfo | None = None
    system: SystemUnderTest | None = None  # where the data's bytes come from
    warnings: list[str] = field(default_factory=list)
    partial: bool = False  # the run did not do all it planned (see stopped_by)
    # None: complete; "interrupted" (a signal), "failed", or "unfinished": written mid-run, the
    # run had not ended then (a file that stays so: the run was killed, or its disk filled)
    stopped_by: str | None = None
    schema_version: int = SCHEMA_VERSION
    tool_version: str = __version__


def envelope(kind: str, config: dict[str, Any], data: str | None = None) -> dict[str, Any]:
    """The envelope's fields for a new results file of ``kind`` made by this process; ``data``:
    the path or URL measured (described as the system under test)."""
    from feedbench.core.system import describe

    return {
        "kind": kind,
        "created_utc": now_utc(),
        "command": redact_command(["feedbench", *sys.argv[1:]]),
        "config": config,
        "host": HostInfo.current(),
        "system": describe(data) if data is not None else None,
    }


def unfinished(result: Any) -> Any:
    """A copy of ``result`` for a write made while the run goes on: it says partial and
    unfinished until the run's last write replaces it (so a run killed meanwhile leaves a file
    that says so)."""
    if result.partial:
        return result
    marks: dict[str, Any] = {"partial": True, "stopped_by": "unfinished"}
    if hasattr(result, "failure"):
        marks["failure"] = "unfinished: the run had not ended when this file was written"
    return dataclasses.replace(result, **marks)


def redact_command(argv: list[str]) -> list[str]:
    """A command line as it may be recorded: no URL password or signature, no secret value."""
    from feedbench.core.redact import scrub_text

    return [scrub_text(a) for a in argv]


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
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if tp is float and isinstance(value, int):
        return float(value)
    return value


def from_dict(cls: type, data: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: _build(hints[k], v) for k, v in data.items() if k in names}
    return cls(**kwargs)


def save(result: Any, path: str | os.PathLike[str]) -> None:
    """Write any results dataclass as JSON, atomically, credentials masked
    (:mod:`feedbench.core.redact`)."""
    from feedbench.core.redact import scrub

    try:
        write_atomic(path, json.dumps(scrub(to_dict(result)), indent=2) + "\n")
    except OSError as e:
        raise NotWritten(f"cannot write results to {path}: {e.strerror or e}") from e


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
    kind: str,
    cls: type,
    data: dict[str, Any] | None = None,
) -> Any:
    """Read a results file of ``kind`` into ``cls``; ``data``: its JSON when already
    :func:`read`."""
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
