"""What the DALI backend feeds its pipeline, and what it reads back, apart from the pipeline:
index files for webdataset shards (DALI's format v1.2, only the usable samples), the dealt file
order of a training tree (:class:`DealtFiles`, torch's order for DALI's external source),
ASCII label digits turned into labels on the device, and DALI's own reason in its error text.
No DALI import here: each piece is tested without a pipeline."""

from __future__ import annotations

import os
import re

import numpy as np
import torch

from loaders.data import SampleIndex, split_member_name
from loaders.dist import shard_indices


def write_dali_indexes(index: SampleIndex, folder: str) -> list[str]:
    """DALI webdataset index files (format v1.2) for our listing: only the usable samples."""
    assert index.shard_of is not None and index.names is not None
    assert index.offset is not None and index.size is not None
    assert index.label_offset is not None and index.label_size is not None
    paths = []
    for s in range(len(index.shards)):
        rows = np.flatnonzero(index.shard_of == s)
        lines = [f"v1.2 {len(rows)}"]
        for i in rows:
            name = index.names[int(i)]
            key, ext = split_member_name(name)
            lines.append(
                f"{ext} {index.offset[i]} {index.size[i]} {name} "
                f"cls {index.label_offset[i]} {index.label_size[i]} {key}.cls"
            )
        path = os.path.join(folder, f"{s:06d}.idx")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def parse_labels(digits: torch.Tensor) -> torch.Tensor:
    """ASCII decimal labels, zero-padded on the right (B×K uint8) → int64 labels, on device."""
    d = digits.to(torch.int64) - 48
    valid = (d >= 0) & (d <= 9)
    # only the leading run of digits counts ("12\n" → 12)
    run = torch.cumprod(valid.to(torch.int64), dim=1)
    length = run.sum(dim=1, keepdim=True)
    pos = torch.arange(d.shape[1], device=d.device).unsqueeze(0)
    power = (length - 1 - pos).clamp(min=0)
    return (d.clamp(min=0) * run * torch.pow(10, power)).sum(dim=1)


def dali_reason(text: str) -> str:
    """DALI's own reason in its multi-line error: the line after ``encountered:`` (without its
    ``Assert on "…" failed:`` prefix), else the first line that names an error."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    after = [b for a, b in zip(lines, lines[1:], strict=False) if a == "encountered:"]
    if after:
        return re.sub(r'^Assert on ".*?" failed:\s*', "", after[0])
    return next(
        (ln for ln in lines if "failure" in ln or "rror" in ln[:40]), lines[-1] if lines else ""
    )


class DealtFiles:
    """ORDER: the external source of a dealt pipeline (training on a tree). Batch ``b`` of
    epoch ``e`` is this rank's indices ``[b·B, (b+1)·B)`` of :func:`loaders.dist.shard_indices`
    (torch's DistributedSampler for ``seed`` and ``e``: the torch backend's order), as the
    files' encoded paths, then the indices (the batch's keys; unless ``keys=False``), then,
    given ``labels`` (each index's class), the labels. The epoch's last batch, when short, is
    filled with repeats of its last sample (trimmed by the loader, as DALI's FILL).

    The source never ends: after ``batches`` batches of an epoch come the next epoch's, so
    DALI prefetches across the boundary. DALI calls it with the pipeline's iteration (counted
    from ``start``, the ``(epoch, batch)`` the pipeline began at; restored with a checkpoint).

    DALI calls it on the training thread, once a step: the arrays are made ``BLOCK`` batches at
    a time and each call hands out views (issue 29: the host time of a small batch's step).
    """

    BLOCK = 32  # batches whose arrays are made at once

    def __init__(
        self, paths, n: int, rank: int, world: int, seed: int, batch: int, batches: int, start,
        labels=None, keys: bool = True,
    ) -> None:  # fmt: skip
        self.buffer, self.offsets = paths.buffer, paths.offsets
        self.n, self.rank, self.world, self.seed = n, rank, world, seed
        self.batch, self.batches, self.start = batch, batches, start
        self.labels = None if labels is None else np.asarray(labels, dtype=np.int64)
        self.keys = keys
        self._orders: dict[int, np.ndarray] = {}
        self._block: tuple[tuple[int, int], tuple[np.ndarray, ...]] | None = None

    def order(self, epoch: int) -> np.ndarray:
        """This rank's indices of ``epoch`` (the last two epochs asked for are kept)."""
        if epoch not in self._orders:
            if len(self._orders) >= 2:
                del self._orders[min(self._orders)]
            self._orders[epoch] = shard_indices(
                self.n, self.rank, self.world, seed=self.seed, epoch=epoch
            )
        return self._orders[epoch]

    def rows(self, epoch: int, first: int, count: int) -> np.ndarray:
        """The indices of batches ``first … first + count − 1`` of ``epoch``, ``count × B`` of
        them: a short last batch filled with repeats of its last sample."""
        rows = self.order(epoch)[first * self.batch : (first + count) * self.batch]
        want = count * self.batch
        if len(rows) < want:
            rows = np.concatenate([rows, np.full(want - len(rows), rows[-1])])
        return rows

    def __call__(self, info) -> tuple[np.ndarray, ...]:
        at = self.start[1] + info.iteration
        epoch, b = self.start[0] + at // self.batches, at % self.batches
        first = b - b % self.BLOCK
        if self._block is None or self._block[0] != (epoch, first):
            rows = self.rows(epoch, first, min(self.BLOCK, self.batches - first))
            arrays: tuple[np.ndarray, ...] = (self.paths(rows),)
            if self.keys:
                arrays += (rows.astype(np.int64).reshape(-1, 1),)
            if self.labels is not None:
                arrays += (self.labels[rows].reshape(-1, 1),)
            self._block = ((epoch, first), arrays)
        i = (b - first) * self.batch
        return tuple(a[i : i + self.batch] for a in self._block[1])

    def paths(self, rows: np.ndarray) -> np.ndarray:
        """The rows' encoded paths as one rows × longest array, NUL-padded (the file reader
        stops at the first NUL): DALI takes one array in a third of the time it takes a list of
        a batch of them, on the training thread (BENCHMARKS.md, "DALI's dealt paths")."""
        start, end = self.offsets[rows], self.offsets[rows + 1]
        cols = np.arange(int((end - start).max()))
        at = start[:, None] + cols[None, :]
        inside = at < end[:, None]
        return np.where(inside, self.buffer[np.minimum(at, len(self.buffer) - 1)], 0).astype(
            np.uint8
        )
