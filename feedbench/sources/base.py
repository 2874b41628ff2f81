"""The source contract: list once, then yield timed raw samples for a chosen set of units."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass


@dataclass
class RawSample:
    """One sample's bytes as read from storage, or why it could not be read."""

    key: str  # file path, or "shard.tar:key" for shards
    data: bytes | memoryview | None  # a memoryview only with iter_samples(views=True)
    label: int | None
    read_bytes: (
        int  # bytes actually read from storage for this sample (payload + container overhead)
    )
    read_s: float
    error: str | None = None


class Source(ABC):
    """A dataset listed once. Units are what is sharded across consumers: files or tar shards."""

    kind: str  # "tree" or "shards"
    root: str
    direct: bool = False  # read with O_DIRECT (no page cache)
    latency_s: float = 0.0  # emulated extra latency per file opened (slower storage)
    remote: bool = False  # read over the network (fsspec): no page cache to control here
    read_ahead: int = 0  # bytes the kernel is asked to read ahead of a shard's read position
    read_thread: bool = False  # local shards: a reading thread keeps one read call in flight

    def set_options(
        self,
        *,
        direct: bool = False,
        latency_s: float = 0.0,
        read_ahead: int = 0,
        read_thread: bool = False,
    ) -> None:
        self.direct, self.latency_s, self.read_ahead = direct, latency_s, read_ahead
        self.read_thread = read_thread

    @abstractmethod
    def units(self) -> int:
        """Number of shardable units (files for a tree, .tar files for shards)."""

    @abstractmethod
    def files(self) -> Sequence[str]:
        """Every file the source reads (for cache control)."""

    @abstractmethod
    def total_bytes(self) -> int:
        """Sum of file sizes as listed."""

    @abstractmethod
    def samples_hint(self) -> int | None:
        """Number of samples if known without reading (tree), else None (shards)."""

    @abstractmethod
    def iter_samples(self, unit_indices: Sequence[int], views: bool = False) -> Iterator[RawSample]:
        """Read the given units in order, yielding one record per sample (or per failure).

        ``views=True``: a sample's ``data`` may be a memoryview that is valid only until the next
        sample is asked for (no copy out of a read buffer); for consumers done with each sample
        before taking the next."""
