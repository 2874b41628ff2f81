"""What every backend shares: the epoch counter, the equal-length rule, the device and the output.

The length rule (every backend, every rank, every epoch): with ``N`` samples and ``W`` ranks, each
rank yields ``S = ceil(N / W)`` samples, DistributedSampler-style, in ``ceil(S / B)`` batches (only
the last may be smaller, and it has the same size on every rank), or ``S // B`` full batches with
``drop_last=True``. The ``W·S − N`` extra samples are repeats (padding); how each backend chooses
them is in its module docstring. The wds backend splits by whole shards, so its ``S`` is the
largest number of samples any rank's shards can hold (see :mod:`loaders.wds_backend`).
"""

from __future__ import annotations

import gc
import math
import threading
from collections.abc import Iterator

import torch

from loaders.data import SampleIndex, Skipped
from loaders.dist import DistInfo
from loaders.transforms import Normalize


def start_workers(dataloader) -> Iterator:
    """``iter(dataloader)``; where that forks worker processes (a DataLoader with workers and no
    live persistent ones), first collect this process's garbage (here, where finalizers can run)
    and freeze what is left while the workers fork. Any other iterable: plain ``iter``.

    A forked worker's collector would otherwise finalize garbage it inherited. A DALI pipeline
    left to the collector (say a loader in a reference cycle through a kept traceback) then runs
    its ``__del__`` in the worker, which waits for DALI's threads, or for a lock one of them held
    at the fork: threads only the parent has. The worker hangs, and the training loop with it
    (seen in this project's test suite: ``Pipeline._shutdown`` in a torch worker's init). Pinned
    batches left in a cycle (say by a kept traceback) would be freed there with a CUDA call that
    the child cannot make: the likely cause, unconfirmed, of a wds worker aborting with
    cudaErrorInitializationError on an H200.
    """
    forks = (
        getattr(dataloader, "num_workers", 0) > 0 and getattr(dataloader, "_iterator", None) is None
    )
    if not forks:  # no workers, or persistent ones already running
        return iter(dataloader)
    gc.collect()
    gc.freeze()  # the workers' collector leaves everything inherited alone
    try:
        return iter(dataloader)
    finally:
        gc.unfreeze()


def resolve_device(device: str | torch.device | None, local_rank: int) -> torch.device:
    """``None``: this rank's GPU (``cuda:LOCAL_RANK``) when CUDA is there, else the CPU."""
    if device is None:
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))
        return torch.device("cpu")
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))
    return d


class LoaderBase:
    """Iterable of ``(images, labels)`` (plus ``keys`` with ``return_keys``), equal length per rank.

    Subclasses implement :meth:`_epoch_batches` (yield the batches of one epoch) and set
    ``samples_per_rank``. ``iter()`` uses the epoch given to :meth:`set_epoch`, else the one after
    the last epoch iterated, so forgetting ``set_epoch`` does not repeat an order.
    """

    backend = "base"

    def __init__(
        self,
        index: SampleIndex,
        info: DistInfo,
        batch_size: int,
        *,
        train: bool,
        image_size: int,
        seed: int,
        device: torch.device,
        dtype: torch.dtype,
        channels_last: bool,
        drop_last: bool,
        return_keys: bool,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch size must be at least 1, got {batch_size}")
        self.index = index
        self.info = info
        self.batch_size = batch_size
        self.train = train
        self.image_size = image_size
        self.seed = seed
        self.device = device
        self.dtype = dtype
        self.channels_last = channels_last
        self.drop_last = drop_last
        self.return_keys = return_keys
        self.samples_per_rank = math.ceil(len(index) / info.world_size)
        self.epoch = -1  # the epoch being (or last) iterated
        self._next_epoch = 0
        self._skipped: list[Skipped] = list(index.skipped)
        self._lock = threading.Lock()
        self.normalize = Normalize(device, dtype, channels_last)

    # --- the public surface ---------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        """Distinct samples in the source (after skipping what listing found unusable)."""
        return len(self.index)

    @property
    def padding_per_epoch(self) -> int:
        """Repeated samples per epoch over all ranks: ``world · samples_per_rank − N``."""
        return self.info.world_size * self.samples_per_rank - len(self.index)

    @property
    def skipped(self) -> list[Skipped]:
        """Everything skipped so far: found when listing, and (torch, wds) when decoding."""
        with self._lock:
            return list(self._skipped)

    def __len__(self) -> int:
        if self.drop_last:
            return self.samples_per_rank // self.batch_size
        return math.ceil(self.samples_per_rank / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next iteration (also done automatically: epoch + 1 each time)."""
        if epoch < 0:
            raise ValueError(f"epoch must be ≥ 0, got {epoch}")
        self._next_epoch = int(epoch)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        epoch = self._next_epoch
        self._next_epoch = epoch + 1
        self.epoch = epoch
        for images, labels, keys in self._epoch_batches(epoch):
            yield (images, labels, keys) if self.return_keys else (images, labels)

    def close(self) -> None:
        """Release workers and pipelines (also done when the loader is garbage-collected)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- for subclasses ---------------------------------------------------------------------
    def _epoch_batches(
        self, epoch: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        raise NotImplementedError

    def _record_skipped(self, items: list[Skipped]) -> None:
        if items:
            with self._lock:
                self._skipped.extend(items)

    def __repr__(self) -> str:
        i = self.info
        return (
            f"{type(self).__name__}({self.index.kind} of {len(self.index)} samples, rank {i.rank}/"
            f"{i.world_size}, batch {self.batch_size}, {len(self)} batches/epoch, {self.device})"
        )
