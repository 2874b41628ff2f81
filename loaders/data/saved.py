"""A listing saved to one file: numpy arrays and a JSON header in an uncompressed ``.npz``.

A listing (:class:`~loaders.data.index.SampleIndex`, or scan's
:class:`~loaders.data.layout.Layout`) is made once per job and handed to every process that
reads the data, or kept by the user and reused across jobs, as DALI's ``file_list`` or
LitData's ``index.json``. The file is an ``.npz`` written by ``numpy.savez`` (no compression),
one member per array plus ``header``: UTF-8 JSON saying the format, its version, what was
listed (the path and format asked for) and the small fields (root, classes, shards, skipped).

Reading it never unpickles (``allow_pickle`` is never given: a file from anywhere cannot run
code) and maps each array straight from the file (``numpy.memmap`` at the member's offset): a
1.28 M-sample index is loaded in milliseconds, and forked loader workers share its pages
through the page cache instead of each holding a copy.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import struct
import tempfile
import zipfile
from typing import Any

import numpy as np

from loaders.data.layout import Layout, Skipped
from loaders.data.records import RecordTable
from loaders.errors import LoaderError

FORMAT = "feedbench-index"
VERSION = 1
HEADER = "header"
_LOCAL_HEADER = struct.Struct("<4s22sHH")  # signature, (fixed fields), name length, extra length


def write(path: str | os.PathLike[str], header: dict, arrays: dict[str, np.ndarray]) -> None:
    """``header`` and ``arrays`` to ``path``, atomically (a temporary file in the same folder,
    then a rename): a reader sees the whole file or none."""
    target = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(target))
    head = dict(header, format=FORMAT, version=VERSION)
    text = json.dumps(head, default=_bytes_out, ensure_ascii=False).encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=".index-", suffix=".npz.tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **{HEADER: np.frombuffer(text, dtype=np.uint8)}, **arrays)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read(path: str | os.PathLike[str]) -> tuple[dict, dict[str, np.ndarray]]:
    """The header and the arrays (read-only, mapped from the file) of a saved listing; one
    :class:`LoaderError` for a file that is not one, is damaged, or is of another version."""
    target = os.fspath(path)
    try:
        arrays = _map_members(target)
        header = json.loads(arrays.pop(HEADER).tobytes().decode("utf-8"), object_hook=_bytes_in)
    except FileNotFoundError:
        raise LoaderError(f"no index file at {target}") from None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, struct.error) as e:
        raise LoaderError(f"{target} is not a feedbench index file ({_why(e)})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise LoaderError(f"{target} is not a feedbench index file (no {FORMAT} header)")
    if header.get("version") != VERSION:
        raise LoaderError(
            f"{target} is a feedbench index of version {header.get('version')}, this version "
            f"reads version {VERSION}: list the data again (delete the file)"
        )
    return header, arrays


def _why(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _map_members(path: str) -> dict[str, np.ndarray]:
    """Every ``.npy`` member of the (uncompressed) zip at ``path``, mapped in place."""
    out: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for info in z.infolist():
            if info.compress_type != zipfile.ZIP_STORED or not info.filename.endswith(".npy"):
                raise ValueError(f"unexpected member {info.filename!r}")
            f.seek(info.header_offset)
            sig, _, name_len, extra_len = _LOCAL_HEADER.unpack(f.read(_LOCAL_HEADER.size))
            if sig != b"PK\x03\x04":
                raise ValueError(f"member {info.filename!r}: bad local header")
            f.seek(info.header_offset + _LOCAL_HEADER.size + name_len + extra_len)
            out[info.filename[:-4]] = _map_array(f, path, info)
    if HEADER not in out:
        raise KeyError("no header")
    return out


def _map_array(f, path: str, info: zipfile.ZipInfo) -> np.ndarray:
    start = f.tell()
    version = np.lib.format.read_magic(f)
    read_header = (
        np.lib.format.read_array_header_1_0
        if version == (1, 0)
        else np.lib.format.read_array_header_2_0
    )
    shape, fortran, dtype = read_header(f)  # a literal parsed, never unpickled
    if dtype.hasobject:
        raise ValueError(f"member {info.filename!r} holds Python objects")
    count = int(np.prod(shape, dtype=np.int64))
    offset = f.tell()
    if offset - start + count * dtype.itemsize != info.file_size:
        raise ValueError(f"member {info.filename!r} is cut off or damaged")
    if count == 0:  # (mmap cannot map zero bytes)
        return np.empty(shape, dtype=dtype)
    order = "F" if fortran else "C"
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order=order)


def _bytes_out(value: Any):
    """JSON for bytes (a Parquet file's footer, kept for decoding)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"__bytes__": base64.b64encode(bytes(value)).decode("ascii")}
    raise TypeError(f"{type(value).__name__} cannot be saved in an index header")


def _bytes_in(obj: dict):
    return base64.b64decode(obj["__bytes__"]) if set(obj) == {"__bytes__"} else obj


def save_layout(layout: Layout, path: str | os.PathLike[str], listed: str) -> None:
    """Scan's listing (``listed``: what was listed, as :func:`~loaders.data.index.listed_as`
    says) to ``path``: a tree's, shards' or data files' layout, their record table included."""
    from loaders.data.index import StringTable

    files = StringTable(layout.files)
    header = {"listing": "layout", "listed": listed, "kind": layout.kind, "root": layout.root}
    header |= {"remote": layout.remote, "classes": layout.classes, "notes": layout.notes}
    header |= {"fmt": layout.fmt, "skipped": [list(s) for s in layout.skipped]}
    arrays = {"files.buffer": files.buffer, "files.offsets": files.offsets}
    arrays["sizes"] = np.asarray(layout.sizes, dtype=np.int64)
    if layout.labels is not None:
        arrays["labels"] = np.asarray(layout.labels, dtype=np.int64)
    table = layout.table
    if table is not None:
        header["meta"] = table.meta
        arrays |= {"table.file_of": table.file_of, "table.offset": table.offset}
        arrays["table.size"] = table.size
        if table.row is not None:
            arrays["table.row"] = table.row
    write(path, header, arrays)


def load_layout(path: str | os.PathLike[str], listed: str) -> Layout:
    """The layout :func:`save_layout` wrote to ``path`` for ``listed``; one
    :class:`LoaderError` for a file that is not one, or one of another source."""
    from loaders.data.index import StringTable

    target = os.fspath(path)
    header, arrays = read(target)
    if header.get("listing") != "layout":
        raise LoaderError(f"{target} is not a scan's listing (it holds a loader's index)")
    if header.get("listed") != listed:
        raise LoaderError(f"{target} is the listing of {header.get('listed')}, not of {listed}")
    try:
        files = StringTable.from_arrays(arrays["files.buffer"], arrays["files.offsets"])
        table = None
        if "table.file_of" in arrays:
            table = RecordTable(
                arrays["table.file_of"], arrays["table.offset"], arrays["table.size"],
                header.get("meta"), arrays.get("table.row"),
            )  # fmt: skip
        return Layout(
            header["kind"], header["root"], files, arrays["sizes"], header["remote"],  # type: ignore[arg-type]
            labels=arrays.get("labels"), classes=list(header["classes"]),
            skipped=[Skipped(str(p), str(r)) for p, r in header["skipped"]],
            notes=list(header["notes"]), fmt=header["fmt"], table=table,
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as e:
        raise LoaderError(f"{target} is a damaged feedbench listing ({e})") from None
