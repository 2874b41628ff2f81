"""A training loader inside a consumer (``feedbench scan --loader``): ours or the user's, timed
end to end. :class:`TrainingLoader` hands its batches to the consumer loop pass after pass, each
counted (:func:`count_samples`) with the bytes read from storage meanwhile (:class:`IoMeter`),
and counts how many batches the loader yields in a pass, to its end (unequal counts across ranks
hang DDP)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from feedbench.core.proctree import descendants
from feedbench.scan.factory import UserLoaderError, epoch_owner
from feedbench.scan.stream import KEEP_ERRORS, BatchTimes
from loaders import start_workers


def count_samples(batch: Any) -> int | None:
    """Samples in a batch: a tensor's or array's first dimension; the first countable element
    of a tuple or list (else its length); the first countable value of a dict; else ``len()``.
    None when nothing is countable (a scalar, a string, a 0-d tensor, an object without len)."""
    shape = getattr(batch, "shape", None)
    if isinstance(shape, tuple):  # torch.Size is a tuple; so are numpy's, pandas', arrow's
        return int(shape[0]) if shape else None
    if isinstance(batch, (str, bytes, bytearray)):
        return None
    if isinstance(batch, Mapping):
        return _first_count(batch.values())
    if isinstance(batch, (list, tuple)):
        n = _first_count(batch)
        return n if n is not None else len(batch)
    try:
        return len(batch)
    except TypeError:
        return None


def _first_count(items: Iterable[Any]) -> int | None:
    for item in items:
        countable = isinstance(getattr(item, "shape", None), tuple) or isinstance(
            item, (Mapping, list, tuple)
        )
        n = count_samples(item) if countable else None
        if n is not None:
            return n
    return None


def _synchronize(batch: Any) -> None:
    """A batch on the GPU counts as delivered when its copies have finished, so the data wait
    includes what training would wait for."""
    if isinstance(batch, (list, tuple)) and batch:
        batch = batch[0]
    elif isinstance(batch, Mapping):
        batch = next(iter(batch.values()), None)
    if isinstance(batch, torch.Tensor) and batch.is_cuda:
        torch.cuda.current_stream(batch.device).synchronize()


class IoMeter:
    """Bytes this process and its children (the loader's workers) read from storage, from the
    kernel's I/O counters (page-cache hits count nothing).

    A reaped child's counts move into its parent's, so the sum only ever grows; a high-water mark
    keeps a child caught between exit and reaping from being counted twice. The counters are
    read at most every ``every_s`` and the children listed at most every second, from /proc
    (psutil where the kernel does not list children): their cost is paid inside the data wait."""

    def __init__(self, every_s: float = 0.02) -> None:
        self.pid = os.getpid()
        self.every_s = every_s
        self.children: list[int] = []
        self.t_listed = self.t_read = 0.0
        self.high = self._total()

    def _total(self) -> int:
        now = time.monotonic()
        if now - self.t_listed >= 1.0:
            self.children = descendants(self.pid)
            self.t_listed = now
        self.t_read = now
        return sum(read_bytes(pid) for pid in (self.pid, *self.children))

    def delta(self, final: bool = False) -> int:
        """Bytes read since the last call that counted (0 while within ``every_s``, unless
        ``final``)."""
        if not final and time.monotonic() - self.t_read < self.every_s:
            return 0
        total = self._total()
        grown = max(0, total - self.high)
        self.high = max(self.high, total)
        return grown


def read_bytes(pid: int) -> int:
    """The storage bytes process ``pid`` has read (0 when it is gone or will not say)."""
    try:
        with open(f"/proc/{pid}/io", "rb") as f:
            for line in f:
                if line.startswith(b"read_bytes:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class SkipCounter:
    """The samples a loader left out (ours: ``loader.skipped``, a file it could not read or
    decode) since the pass began, counted as the scan's own errors batch by batch. Those found
    when the loader listed the data are left to the listing; a loader without ``skipped`` (a
    user's) reports none."""

    def __init__(self, loader: Any) -> None:
        self.since = getattr(loader, "skipped_since", None)
        self.seen = len(loader.skipped) if self.since is not None else 0

    def add_to(self, times: BatchTimes) -> None:
        if self.since is None:
            return
        new = self.since(self.seen)
        self.seen += len(new)
        times.errors += len(new)
        room = KEEP_ERRORS - len(times.error_list)
        times.error_list.extend((s.path, "loader", s.reason) for s in new[: max(0, room)])


class TrainingLoader:
    """A training loader's batches for the consumer loop, pass after pass.

    ``loader``: what a factory returned (or ``build_loader``); ``name`` names it in errors.
    ``guard(e, what)``, when given, turns an exception of the loader's own code into the error
    to raise (the user's frames). ``remake(epoch)``, when given, builds the loader again: a one-
    shot iterator (a generator) is made anew for every pass after the first. ``close_each_pass``:
    the loader has a ``close()`` that stops its workers running ahead (ours). ``sync_batches``:
    wait for a batch's copies to the GPU before counting it delivered; off when the step is
    queued on the GPU (``--emulate gpu``), whose clock orders the copy before the step, and
    where a synchronize would wait for the previous step too.
    """

    def __init__(
        self,
        loader: Iterable[Any],
        name: str,
        *,
        guard: Callable[[BaseException, str], Exception] | None = None,
        remake: Callable[[int], Iterable[Any]] | None = None,
        close_each_pass: bool = False,
        sync_batches: bool = True,
        settings: str | None = None,
    ) -> None:
        self.loader, self.name = loader, name
        self.settings = settings  # ours: what it chose (LoaderBase.settings), kept in the stats
        self.sync_batches = sync_batches
        self.guard, self.remake, self.close_each_pass = guard, remake, close_each_pass
        self.used = False
        self.yielded = 0  # batches the loader yielded in the current pass

    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch``: the first ``set_epoch`` of the loader, its sampler (a DataLoader
        over a DistributedSampler) or its dataset (over a Hugging Face IterableDataset); a used
        one-shot iterator (a generator) is made anew."""
        if self.used and self.remake is not None and isinstance(self.loader, Iterator):
            self.loader = self.remake(epoch)
            return
        owner = epoch_owner(self.loader)
        if owner is not None:
            self._run(lambda: owner.set_epoch(epoch), "set_epoch")

    def batches(self) -> Iterator[tuple[Any, BatchTimes]]:
        """One pass: ``(None, BatchTimes(samples, read_bytes))`` per batch, as the loop takes
        them; the loader's workers start at the first ``next()``, with the consumer's clock."""
        self.used, self.yielded = True, 0
        meter, skips = IoMeter(), SkipCounter(self.loader)
        it = self._run(lambda: start_workers(self.loader), "iter()")
        while True:
            batch = self._run(lambda: next(it, _END), "next()")
            if batch is _END:
                tail = BatchTimes(read_bytes=meter.delta(final=True))
                skips.add_to(tail)
                if tail.read_bytes or tail.errors:  # the pass's end: an errors-only tail
                    yield None, tail
                return
            self.yielded += 1
            n = count_samples(batch)
            if n is None:
                raise UserLoaderError(
                    f"the loader {self.name} yields batches of type {type(batch).__name__} "
                    "without a countable size: yield tensors or arrays (first dimension = "
                    "samples), a tuple, list or dict of them, or objects with len()"
                )
            if self.sync_batches:
                _synchronize(batch)
            times = BatchTimes(samples=n, read_bytes=meter.delta())
            skips.add_to(times)
            yield None, times

    def finish(self, pass_batches: Iterator[Any], beat: Callable[[], None] | None = None) -> int:
        """Batches the loader yields in this pass: those the loop took and, after a synced stop
        (another rank ran out), the rest, counted without measuring."""
        for _ in pass_batches:
            if beat is not None:
                beat()
        return self.yielded

    def close(self) -> None:
        if self.close_each_pass:
            self.loader.close()  # type: ignore[attr-defined]

    def _run(self, call: Callable[[], Any], what: str) -> Any:
        if self.guard is None:
            return call()
        try:
            return call()
        except Exception as e:
            raise self.guard(e, what) from None


_END = object()
