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
import functools
import gzip
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
    # the control group's memory limit (a container's), when it is below memory_bytes: the most
    # page cache this client can hold (feedbench.core.cgroup)
    memory_limit_bytes: int | None = None

    @property
    def client_memory_bytes(self) -> int:
        """The memory this client can cache data in: its RAM, or its control group's limit."""
        if self.memory_limit_bytes is not None:
            return min(self.memory_bytes, self.memory_limit_bytes)
        return self.memory_bytes

    @staticmethod
    def current() -> HostInfo:
        import psutil

        from feedbench.core.cgroup import memory_limit

        ram = psutil.virtual_memory().total
        limit = memory_limit()
        return HostInfo(
            hostname=socket.gethostname(),
            platform=platform.platform(),
            python=sys.version.split()[0],
            cpu_count=os.cpu_count() or 1,
            memory_bytes=ram,
            torch=_torch_version(),
            cuda_devices=cuda_devices(),
            cpu_model=_cpu_model(),
            nics=_nics(),
            memory_limit_bytes=limit if limit is not None and limit < ram else None,
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


class SchemaMismatch(ValueError):
    """A results file's value that its dataclass field's type does not allow: where (a path
    like ``measurements[0].samples_per_s_mean``), and what was expected instead."""

    def __init__(self, where: str, expected: str, value: Any = None) -> None:
        said = expected if expected == "missing" else f"expected {expected}, got {_got(value)}"
        super().__init__(f"{where or 'the file'}: {said}")


def _got(value: Any) -> str:
    if value is None or isinstance(value, (dict, list)):
        return "null" if value is None else "an object" if isinstance(value, dict) else "a list"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_EXPECTED = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _build(tp: Any, value: Any, where: str = "") -> Any:
    """Rebuild a value of (possibly generic / optional / dataclass) type ``tp`` from JSON,
    checking it against ``tp`` on the way: the dataclasses' type hints are the results
    schema (one per kind and version, never apart from the code that writes it)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _build(rest[0], value, where)
        for arg in rest:
            with contextlib.suppress(SchemaMismatch):
                return _build(arg, value, where)
        raise SchemaMismatch(where, " or ".join(_expected(a) for a in rest), value)
    if tp is Any:
        return value
    if not isinstance(value, _json_type(tp)) or (tp in (int, float) and isinstance(value, bool)):
        raise SchemaMismatch(where, _expected(tp), value)
    if origin is tuple and ... not in typing.get_args(tp):  # tuple[X, Y]: a list of two
        args = typing.get_args(tp)
        if len(value) != len(args):
            raise SchemaMismatch(where, f"a list of {len(args)}", value)
        pairs = enumerate(zip(args, value, strict=True))
        return tuple(_build(a, v, f"{where}[{i}]") for i, (a, v) in pairs)
    if origin in (list, tuple):  # tuple[X, ...]: a list in JSON
        inner = (typing.get_args(tp) or (Any,))[0]
        if inner in _EXPECTED:  # a list of numbers or strings (per-step series): checked at once
            return origin(_scalars(inner, value, where))
        return origin(_build(inner, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        key, inner = typing.get_args(tp) or (str, Any)
        # JSON keys are strings: dict[int, ...] gets its int keys back
        return {_key(key, k, where): _build(inner, v, _at(where, k)) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise SchemaMismatch(where, _expected(tp), value) from None
    return float(value) if tp is float else value


def _scalars(tp: type, values: list, where: str) -> list:
    """``values`` as a list of ``tp`` (bool, int, float or str), as :func:`_build` would give
    them one by one, without its per-element dispatch: a results file holds lists of
    thousands of step times."""
    ok = (int, float) if tp is float else tp
    for i, v in enumerate(values):
        if not isinstance(v, ok) or (tp is not bool and isinstance(v, bool)):
            raise SchemaMismatch(f"{where}[{i}]", _expected(tp), v)
    return [float(v) for v in values] if tp is float else list(values)


def _json_type(tp: Any) -> type | tuple[type, ...]:
    """The JSON (Python) type a value of ``tp`` is read from."""
    origin = typing.get_origin(tp) or tp
    if dataclasses.is_dataclass(origin):
        return dict
    if isinstance(origin, type) and issubclass(origin, enum.Enum):
        return (str, int, float)
    return (int, float) if origin is float else list if origin is tuple else origin


def _expected(tp: Any) -> str:
    origin = typing.get_origin(tp) or tp
    if origin is type(None):
        return "null"
    if isinstance(origin, type) and issubclass(origin, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in origin)
    if origin in (list, tuple):
        return "a list"
    if origin is dict or dataclasses.is_dataclass(origin):
        return "an object"
    return _EXPECTED.get(origin, getattr(origin, "__name__", str(origin)))


def _at(where: str, key: Any) -> str:
    return f"{where}.{key}" if where else str(key)


def _key(tp: Any, key: str, where: str) -> Any:
    if tp is not int:
        return key
    try:
        return int(key)
    except ValueError:
        raise SchemaMismatch(_at(where, key), "an integer key", key) from None


@functools.cache
def _schema(cls: type) -> tuple[dict[str, Any], tuple[dataclasses.Field, ...]]:
    """A dataclass's resolved type hints and fields, once per class: resolving the hints
    (string annotations, compiled each time) was half the time of loading a results file."""
    return typing.get_type_hints(cls), dataclasses.fields(cls)


def from_dict(cls: type, data: dict[str, Any], where: str = "") -> Any:
    """An instance of the dataclass ``cls`` from its JSON object, every field checked against
    its type (:class:`SchemaMismatch` names the first that is not); keys it does not know are
    left out (a newer feedbench's additions)."""
    if not isinstance(data, dict):
        raise SchemaMismatch(where, "an object", data)
    hints, fields = _schema(cls)
    kwargs = {}
    for f in fields:
        if f.name in data:
            kwargs[f.name] = _build(hints[f.name], data[f.name], _at(where, f.name))
        elif f.init and _required(f):
            raise SchemaMismatch(_at(where, f.name), "missing")
    return cls(**kwargs)


def check_fields(
    hints: dict[str, Any], data: dict[str, Any], where: str, required: tuple[str, ...] = ()
) -> None:
    """Check a results file's object that is stored as a dict (a scan's ``config``) against
    the types it was made with (``typing.get_type_hints`` of its dataclass): each key that
    ``hints`` names, by its type; ``required``: the keys it must have (older files lack
    newer fields)."""
    for key in required:
        if key not in data:
            raise SchemaMismatch(_at(where, key), "missing")
    for key in hints.keys() & data.keys():
        _build(hints[key], data[key], _at(where, key))


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


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
        raw = Path(path).read_bytes()
        if raw[:2] == b"\x1f\x8b":  # gzipped, as benchmarks/ keeps the larger ones
            raw = gzip.decompress(raw)
        data = json.loads(raw.decode())
    except FileNotFoundError as e:
        raise FeedbenchError(f"no such results file: {path}") from e
    except (OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FeedbenchError(f"{path} is not a feedbench results file: {e}") from e
    if not isinstance(data, dict) or "schema_version" not in data:
        raise FeedbenchError(f"{path} is not a feedbench results file (no schema_version)")
    for key, tp in (("schema_version", int), ("kind", str)):
        if key in data and (not isinstance(data[key], tp) or isinstance(data[key], bool)):
            raise FeedbenchError(f"{path}: {SchemaMismatch(key, _expected(tp), data[key])}")
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
    except SchemaMismatch as e:
        raise FeedbenchError(f"{path}: {e}") from None
    except (TypeError, ValueError) as e:  # a dataclass's own check of the values it was given
        raise FeedbenchError(f"{path} does not match the {kind} results schema: {e}") from e
