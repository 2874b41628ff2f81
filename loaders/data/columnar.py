"""HDF5 and Parquet files as tables of samples (:mod:`loaders.data.records`), read in byte
ranges like every other record format.

Each file's metadata is read once, at listing, through its library (h5py, pyarrow); a sample is
then a byte range of the file, read by the data layer's bounded reads, and decoded from those
bytes alone:

* ``hdf5``: a sample is one index along the first axis of a dataset (``hdf5:NAME``; by default
  the file's largest, its name recorded); the dataset must be contiguous (h5py's default: no
  chunks, no compression), so row ``i`` lies at the dataset's offset + ``i`` × row bytes;
  decode = the row as a numpy array.
* ``parquet``: a sample is one row group, the bytes of all its column chunks; decode = pyarrow
  reading that row group from those bytes and the file's footer (kept from the listing, parsed
  once per process: :data:`FOOTERS`), as an Arrow table.
* ``parquet:rows=N``: a sample is N consecutive rows of a file (the file's last sample holds
  what is left: fewer rows, kept and counted as one sample); its bytes are the row group(s)
  holding those rows, read whole, and decode slices the N rows out. pyarrow does not read
  Parquet's page index (it writes one, and reads whole column chunks), so a reader through it
  cannot fetch less than a row group. Each sample reads its row groups again: with shuffled
  samples, two in a row rarely share a group, so a reader fetching N rows at random pays the
  group each time, and the bytes counted are those reads (more than the file when N is smaller
  than a row group: the layout's read amplification, which is what the scan should show).
"""

from __future__ import annotations

import bisect
import importlib
import io
import math
import os
from collections import OrderedDict

import numpy as np

from loaders.errors import LoaderError


def _require(module: str, fmt: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        package = module.split(".", 1)[0]
        raise LoaderError(
            f"format {fmt} needs {package}: pip install 'feedbench[formats]'"
        ) from None


def _open(path: str, opener):
    """A binary file object: a local file, or ``opener(path)`` for a URL."""
    return opener(path) if opener is not None else open(path, "rb")  # noqa: SIM115


def _largest_dataset(h5):
    found = []

    def visit(name, obj):
        if hasattr(obj, "shape") and obj.shape:
            found.append((obj.nbytes, name, obj))

    h5.visititems(visit)
    return max(found, key=lambda t: (t[0], t[1]))[2] if found else None


def index_hdf5(path: str, opener=None, dataset: str | None = None):
    """``(offsets, sizes, meta, why)``: each row's byte range in ``path`` of ``dataset`` (by
    default the largest), its name, dtype and row shape, and why the file gives no rows (or
    None)."""
    h5py = _require("h5py", "hdf5")
    with _open(path, opener) as f, h5py.File(f, "r") as h5:
        ds = _largest_dataset(h5) if dataset is None else h5.get(dataset)
        if not isinstance(ds, h5py.Dataset) or not ds.shape:
            what = "no dataset with rows" if dataset is None else f"no dataset {dataset} with rows"
            return [], [], None, f"{what} in it"
        start = ds.id.get_offset()
        if ds.chunks is not None or start is None:
            return [], [], None, f"dataset {ds.name} is chunked or not written (contiguous only)"
        row = ds.dtype.itemsize * math.prod(ds.shape[1:])
        meta = {"dataset": ds.name, "dtype": ds.dtype.str, "shape": list(ds.shape[1:])}
        n = ds.shape[0]
    return [start + i * row for i in range(n)], [row] * n, meta, None


def parquet_rows(option: str | None) -> int | None:
    """N of a ``parquet:rows=N`` option (None: a sample is a row group), or one clear error."""
    if option is None:
        return None
    key, _, value = option.partition("=")
    if key != "rows" or not (value.isascii() and value.isdigit()) or int(value) < 1:
        raise LoaderError(
            f"format 'parquet:{option}': write parquet:rows=N with N a whole number of rows "
            "≥ 1 (a sample of N rows), or parquet (a sample is a row group)"
        )
    return int(value)


def _group_span(rg) -> tuple[int, int]:
    """A row group's bytes: from its first column chunk's first page to its last's end."""
    spans = []
    for c in range(rg.num_columns):
        col = rg.column(c)
        first = col.data_page_offset
        if col.has_dictionary_page and col.dictionary_page_offset:
            first = min(first, col.dictionary_page_offset)
        spans.append((first, first + col.total_compressed_size))
    return min(s for s, _ in spans), max(e for _, e in spans)


def index_parquet(path: str, size: int, opener=None, rows: int | None = None):
    """``(offsets, sizes, meta, why)``: each sample's byte span in ``path`` (a row group, or
    with ``rows`` the row groups holding its rows), and what decoding needs: the file's tail
    (footer included), the row groups' starts and their first rows."""
    pq = _require("pyarrow.parquet", "parquet")
    with _open(path, opener) as f:
        md = pq.ParquetFile(f).metadata
        groups = [md.row_group(g) for g in range(md.num_row_groups)]
        spans = [_group_span(rg) for rg in groups]
        f.seek(size - 8)
        footer = int.from_bytes(f.read(8)[:4], "little")
        f.seek(size - footer - 8)  # the footer, its length and the magic: what decoding needs
        tail = f.read(footer + 8)
    first_rows = np.cumsum([0] + [rg.num_rows for rg in groups]).tolist()
    meta = {"size": size, "footer": tail, "starts": [s for s, _ in spans], "rows": rows,
            "first_rows": first_rows}  # fmt: skip
    if not spans:
        return [], [], None, "no row groups in it"
    if rows is None:
        return meta["starts"], [e - s for s, e in spans], meta, None
    if first_rows[-1] == 0:
        return [], [], None, "no rows in it"
    offsets, sizes = _row_samples(spans, first_rows, rows)
    return offsets, sizes, meta, None


def _row_samples(spans, first_rows: list[int], rows: int) -> tuple[list[int], list[int]]:
    """Each ``rows``-row sample's byte range: its first row group's start to its last's end (a
    writer lays row groups one after another, so this is the groups' bytes and no more)."""
    total = first_rows[-1]
    starts = np.arange(0, total, rows)
    g0 = np.searchsorted(first_rows, starts, side="right") - 1
    g1 = np.searchsorted(first_rows, np.minimum(starts + rows, total) - 1, side="right") - 1
    begin = [spans[g][0] for g in g0]
    return begin, [spans[g][1] - b for g, b in zip(g1, begin, strict=True)]


def short_tails(metas: list[dict | None]) -> list[str]:
    """A note on ``parquet:rows=N`` files whose row count is not a multiple of N (their last
    sample is short: kept, one sample), or none."""
    short = [m for m in metas if m and m.get("rows") and m["first_rows"][-1] % m["rows"]]
    if not short:
        return []
    n, files = short[0]["rows"], sum(m is not None for m in metas)
    left = ", ".join(str(m["first_rows"][-1] % n) for m in short[:3])
    more = ", …" if len(short) > 3 else ""
    return [
        f"parquet:rows={n}: the last sample of {len(short)} of {files} files holds fewer rows "
        f"({left}{more}): kept, each counted as one sample"
    ]


class _Known(io.RawIOBase):
    """A read-only file of ``size`` bytes of which only ``data``, at ``start``, is at hand:
    reading elsewhere is an error (a decode must not read storage)."""

    def __init__(self, size: int, start: int, data: bytes) -> None:
        self._size, self._start, self._data, self._pos = size, start, data, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._size}[whence]
        self._pos = base + pos
        return self._pos

    def readinto(self, b) -> int:
        want = min(len(b), max(0, self._size - self._pos))
        at = self._pos - self._start
        if want and not (at >= 0 and at + want <= len(self._data)):
            raise OSError(f"bytes {self._pos}..{self._pos + want} are outside the row group read")
        b[:want] = self._data[at : at + want]
        self._pos += want
        return want


class Footers:
    """Parsed Parquet footers keyed by their bytes, the least recently used dropped once the
    footers held pass ``budget`` bytes (a footer larger than that is parsed and not kept).

    Keyed by content, not by path: the same bytes are the same metadata, so nothing goes stale
    and a copy of the listing (pickled to a consumer, inherited by a forked loader worker) finds
    the same entries. One per process, used by one thread at a time (a consumer or a loader
    worker decodes in one). It holds metadata only: a sample's bytes are always read."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._held: OrderedDict[bytes, object] = OrderedDict()
        self.held_bytes = 0
        self.parsed = 0  # footers parsed so far (cache misses)

    def get(self, footer: bytes):
        """``footer``'s metadata (a ``pyarrow.parquet.FileMetaData``), parsed if not held."""
        md = self._held.get(footer)  # bytes cache their hash: a hit does not rehash the footer
        if md is not None:
            self._held.move_to_end(footer)
            return md
        pq = _require("pyarrow.parquet", "parquet")
        md = pq.read_metadata(io.BytesIO(b"PAR1" + footer))
        self.parsed += 1
        if len(footer) <= self.budget:
            self._held[footer] = md
            self.held_bytes += len(footer)
            while self.held_bytes > self.budget:
                old, _ = self._held.popitem(last=False)
                self.held_bytes -= len(old)
        return md

    def clear(self) -> None:
        self._held.clear()
        self.held_bytes = self.parsed = 0


# Bounded by footer bytes, since a listing may hold thousands of files: parsed, a footer takes
# several times its bytes (BENCHMARKS.md), in every consumer and loader worker.
FOOTERS = Footers(budget=4 << 20)


def decode_hdf5(data, meta: dict) -> np.ndarray:
    return np.frombuffer(data, dtype=np.dtype(meta["dtype"])).reshape(meta["shape"])


def _group_at(starts: list[int], offset: int) -> int:
    """The row group starting at ``offset``: a binary search of the footer's group offsets, in
    file order (a file of 10,000 groups would otherwise be scanned per sample)."""
    i = bisect.bisect_left(starts, offset)
    if i < len(starts) and starts[i] == offset:
        return i
    return starts.index(offset)  # not sorted after all, or not a group's start: ValueError


def decode_parquet(data, meta: dict, offset: int, row: int = 0):
    """The sample at ``offset`` as an Arrow table, from its bytes and the file's footer: its row
    group, or (``parquet:rows=N``) the N rows from ``row`` sliced out of the groups read."""
    pq = _require("pyarrow.parquet", "parquet")
    footer = FOOTERS.get(meta["footer"])  # parsed once per process, not once per sample
    known = _Known(meta["size"], offset, bytes(data))
    reader = pq.ParquetFile(known, metadata=footer, pre_buffer=False)
    group = _group_at(meta["starts"], offset)
    if meta["rows"] is None:
        return reader.read_row_group(group)
    first = meta["first_rows"]
    end = min(row + meta["rows"], first[-1])
    last = bisect.bisect_right(first, end - 1) - 1
    return reader.read_row_groups(range(group, last + 1)).slice(row - first[group], end - row)
