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
  reading that row group from those bytes and the file's footer (kept from the listing), as an
  Arrow table.
"""

from __future__ import annotations

import importlib
import io
import math
import os

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


def index_parquet(path: str, size: int, opener=None):
    """``(offsets, sizes, meta, why)``: each row group's byte span in ``path``, and the file's
    tail (footer included) and row-group starts that decoding needs."""
    pq = _require("pyarrow.parquet", "parquet")
    with _open(path, opener) as f:
        md = pq.ParquetFile(f).metadata
        starts, ends = [], []
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            spans = []
            for c in range(rg.num_columns):
                col = rg.column(c)
                first = col.data_page_offset
                if col.has_dictionary_page and col.dictionary_page_offset:
                    first = min(first, col.dictionary_page_offset)
                spans.append((first, first + col.total_compressed_size))
            starts.append(min(s for s, _ in spans))
            ends.append(max(e for _, e in spans))
        f.seek(size - 8)
        footer = int.from_bytes(f.read(8)[:4], "little")
        f.seek(size - footer - 8)  # the footer, its length and the magic: what decoding needs
        meta = {"size": size, "footer": f.read(footer + 8), "starts": starts}
    if not starts:
        return [], [], None, "no row groups in it"
    return starts, [e - s for s, e in zip(starts, ends, strict=True)], meta, None


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


def decode_hdf5(data, meta: dict) -> np.ndarray:
    return np.frombuffer(data, dtype=np.dtype(meta["dtype"])).reshape(meta["shape"])


def decode_parquet(data, meta: dict, offset: int):
    """The row group at ``offset`` as an Arrow table, from its bytes and the file's footer."""
    pq = _require("pyarrow.parquet", "parquet")
    footer = pq.read_metadata(io.BytesIO(b"PAR1" + meta["footer"]))
    known = _Known(meta["size"], offset, bytes(data))
    group = meta["starts"].index(offset)
    return pq.ParquetFile(known, metadata=footer, pre_buffer=False).read_row_group(group)
