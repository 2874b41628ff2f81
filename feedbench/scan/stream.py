"""The worker side of a consumer: :class:`StageStream` takes its units through the CPU stages,
timed stage by stage, in the consumer's loader workers; :class:`BatchTimes` is what a worker
measured for one batch, accounted by the consumer loop (:mod:`feedbench.scan.consumer`)."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from feedbench.scan import stages as st
from feedbench.scan.results import KEEP_NAMES
from feedbench.scan.sources import Source

KEEP_ERRORS = 20


@dataclass
class BatchTimes:
    """What a loader worker measured while making one batch (crosses the process boundary)."""

    samples: int = 0
    files: int = 0
    read_bytes: int = 0
    errors: int = 0
    failed_files: int = 0  # shards that ended in an error before their end (cut, corrupt)
    failed_names: list[str] = field(default_factory=list)  # the first KEEP_NAMES of them
    lost_samples: int = 0  # their samples after the error (by the index; 0 without one)
    busy_s: dict[str, float] = field(default_factory=dict)
    in_bytes: dict[str, int] = field(default_factory=dict)
    read_latencies: list[float] = field(default_factory=list)
    error_list: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, stage: str, seconds: float, nbytes: int = 0) -> None:
        self.busy_s[stage] = self.busy_s.get(stage, 0.0) + seconds
        self.in_bytes[stage] = self.in_bytes.get(stage, 0) + nbytes


def worker_share(
    units: np.ndarray, kind: str, batch_size: int, worker: int, workers: int
) -> np.ndarray:
    """The units loader worker ``worker`` of ``workers`` takes. Samples (images, data files'
    records) go by whole batches, batch k to worker k mod W, as a map-style DataLoader hands out
    its sampler's batches: only the consumer's last batch can be partial, where every W-th unit
    would leave each worker a partial batch (a step with fewer samples; unet3d's 21 files per
    rank in 4 workers were 4 steps of 5-6 instead of 3 of 7). Tar shards go every W-th (a
    shard's samples are one worker's)."""
    if kind == "shards":
        return units[worker::workers]
    batch_of = np.arange(len(units)) // batch_size
    return units[batch_of % workers == worker]


def _decoder(source: Source):
    """``decode(raw sample)`` for the source's samples: images, or a data file's format."""
    if source.kind == "records":
        return functools.partial(st.decode_record, source)
    return lambda raw: st.decode(raw.data)


class StageStream(IterableDataset):
    """Iterates a consumer's units through the CPU stages, yielding (payload, BatchTimes).

    With DataLoader workers each worker takes every W-th unit. The payload crosses the process
    boundary only when ``collate`` is a stage (a uint8 batch tensor, as a real loader passes);
    otherwise only the measurements do — no work is added that training would not do.
    """

    def __init__(
        self,
        source: Source,
        units: np.ndarray,
        stages: Sequence[str],
        batch_size: int,
        image_size: int,
        seed: int,
    ) -> None:
        self.source = source
        self.units = np.asarray(units, dtype=np.int64)
        self.stages = tuple(stages)
        self.batch_size = batch_size
        self.image_size = image_size
        self.seed = seed
        self._shard: str | None = None  # the shard being read (shards only)
        self._unit = 0  # its unit
        self._arrived = 0  # its samples read so far (failed ones too)

    def __iter__(self) -> Iterator[tuple[Any, BatchTimes]]:
        info = get_worker_info()
        units, wid = self.units, 0
        if info is not None:
            wid = info.id
            units = worker_share(units, self.source.kind, self.batch_size, wid, info.num_workers)
        torch.manual_seed(self.seed * 1000 + wid)
        augment = st.Augment(self.image_size) if "augment" in self.stages else None
        do_decode = "decode" in self.stages
        do_collate = "collate" in self.stages
        times = BatchTimes()
        batch: list[Any] = []
        per_file = self.source.sample_is_file()
        decode = _decoder(self.source)

        def flush() -> tuple[Any, BatchTimes]:
            nonlocal times
            payload: Any = None
            if do_collate and batch:
                t0 = time.perf_counter()
                payload = st.collate(batch)
                times.add("collate", time.perf_counter() - t0, payload.numel())
            out = (payload, times)
            times = BatchTimes()
            batch.clear()
            return out

        # views: each sample is done with (decoded, or counted and dropped) before the next
        for raw in self._samples(units):
            if raw is None:  # a shard read to its end: a file, in the batch that finished it
                times.files += 1
                continue
            self._arrived += 1
            times.read_bytes += raw.read_bytes
            if per_file:
                times.files += 1
            times.add("read", raw.read_s, raw.read_bytes)
            # a sample served from bytes an earlier read call brought (a shard's 1 MiB reads
            # hold several) waited on no read: its 0 s would be the median "read latency"
            if raw.read_s > 0:
                times.read_latencies.append(raw.read_s)
            if raw.error is not None or raw.data is None:
                times.errors += 1
                if raw.key == self._shard:  # the shard's own error: the rest of it is lost
                    self._shard_failed(times, raw.key)
                if len(times.error_list) < KEEP_ERRORS:
                    times.error_list.append((raw.key, "read", raw.error or "no data"))
                continue
            item: Any = raw.data
            if do_decode:
                t0 = time.perf_counter()
                try:
                    item = decode(raw)
                except st.DecodeError as e:
                    times.errors += 1
                    if len(times.error_list) < KEEP_ERRORS:
                        times.error_list.append((raw.key, "decode", str(e)))
                    continue
                times.add("decode", time.perf_counter() - t0, len(raw.data))
            if augment is not None:
                t0 = time.perf_counter()
                item = augment(item)
                times.add("augment", time.perf_counter() - t0)
            batch.append(item if do_collate else None)
            times.samples += 1
            if times.samples == self.batch_size:
                yield flush()
        if times.samples or times.files or times.errors:
            yield flush()

    def _shard_failed(self, times: BatchTimes, name: str) -> None:
        """The shard being read ended in an error: counted, named, and what it lost after the
        error counted by the index's count for it (the samples that arrived taken off)."""
        times.failed_files += 1
        if len(times.failed_names) < KEEP_NAMES:
            times.failed_names.append(name)
        expected = self.source.expected
        if expected is not None:  # (the error's own record is not one of its samples)
            times.lost_samples += max(0, int(expected[self._unit]) - (self._arrived - 1))

    def _samples(self, units: np.ndarray) -> Iterator[Any]:
        """The units' samples; for tar shards a None after each shard, when it was read to its
        end (counting it when it was opened put every file in the warm-up batch)."""
        if self.source.kind != "shards":
            yield from self.source.iter_samples(units, views=True)
            return
        for i in range(len(units)):
            self._unit, self._arrived = int(units[i]), 0
            self._shard = str(self.source.files()[self._unit])
            yield from self.source.iter_samples(units[i : i + 1], views=True)
            yield None
