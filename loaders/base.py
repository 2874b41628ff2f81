"""What every backend shares: the epoch counter, the length rules, resumption, the output.

The training length rule (``train=True``; every backend, every rank, every epoch): with ``N``
samples and ``W`` ranks, each rank yields ``S = ceil(N / W)`` samples, DistributedSampler-style,
in ``ceil(S / B)`` batches (only the last may be smaller, and it has the same size on every rank),
or ``S // B`` full batches with ``drop_last=True``. The ``W·S − N`` extra samples are repeats
(padding); how each backend chooses them is in its module docstring. The wds backend splits by
whole shards, so its ``S`` is the largest number of samples any rank's shards can hold (see
:mod:`loaders.wds_backend`). Equal lengths are what DDP needs: every step all-reduces.

The evaluation rule (``train=False``): every sample exactly once over all ranks, no padding, no
shuffling; rank ``r`` reads the contiguous range :func:`loaders.dist.eval_indices` (``floor`` or
``ceil`` of ``N / W`` samples; the wds backend: its whole shards, so ranks may differ by more).
Lengths then differ between ranks, which is safe because evaluation runs no collective per step:
gather the metrics once at the end (sums and counts through ``all_reduce``). A rank may then
have no samples at all (fewer samples than ranks): it yields no batches.

Even evaluation (``train=False, even_batches=True``), for an evaluation loop that runs a
collective per step (Accelerate's ``gather_for_metrics``, an ``all_gather`` of each batch's
predictions): every rank yields the same number of batches of the same sizes, padded to the
most samples any rank reads with repeats, and each batch carries a last element ``valid``, a
bool tensor, False on the repeats: count only what is valid and the metrics stay exact
(docs/eval-and-small-data.md).

Resumption: :meth:`LoaderBase.state_dict` and :meth:`LoaderBase.load_state_dict`
(:mod:`loaders.resume`).
"""

from __future__ import annotations

import gc
import math
import threading
from collections.abc import Iterator

import torch

from loaders.affinity import cpu_list
from loaders.data import SampleIndex, Skipped
from loaders.dist import DistInfo, eval_indices
from loaders.dropin import EpochSampler
from loaders.resume import STATE_FORMAT, ResumePoint, check_state
from loaders.transforms import BatchOutput, Normalize, TransformSpec


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


def batch_output(loader: LoaderBase, batch_transform, normalize: bool) -> BatchOutput:
    """The torch and wds backends' last step: the user's ``batch_transform`` on the uint8 batch,
    then the loader's normalisation unless ``normalize=False`` (:class:`BatchOutput`)."""
    norm = loader.normalize if normalize else None
    return BatchOutput(norm, batch_transform, loader.channels_last)


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

    Subclasses implement :meth:`_epoch_batches` (yield the batches of one epoch, from a resume
    point if given) and set ``samples_per_rank``. ``iter()`` uses the epoch given to
    :meth:`set_epoch`, else the one after the last epoch COMPLETED (its last batch handed out),
    so forgetting ``set_epoch`` does not repeat an order, and a pass left before its end (a
    peek, ``next(iter(loader))``, or a ``break``) uses up no epoch: the next ``iter()`` starts
    that epoch over, as a DataLoader with a DistributedSampler would.

    What scripts written for a DataLoader read: ``sampler`` (``set_epoch``, ``len()``),
    ``dataset`` (``len()``, ``classes``, ``class_to_idx``), ``batch_size``, ``num_workers``,
    ``drop_last`` (:mod:`loaders.dropin`).
    """

    chosen_by: str | None = None  # backend="auto": the backend picked and why (build_loader)

    backend = "base"
    _worker_word = "workers"  # what ``workers`` counts, in settings()
    can_reshard = False  # whether an epoch can resume on another world size
    workers = 0  # DataLoader worker processes (torch, wds) or DALI CPU threads

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
        transform: TransformSpec | None = None,
        even_batches: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch size must be at least 1, got {batch_size}")
        if even_batches and train:
            raise ValueError(
                "even_batches is for evaluation (train=False): training batches are always "
                "even (padded as DistributedSampler pads)"
            )
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
        self.transform = transform or TransformSpec()
        self.transform.eval_resize(image_size)  # a resize smaller than the output is refused
        self.even_batches = even_batches
        # evaluation: this rank's own samples (the rest of samples_per_rank, if any, are repeats)
        self.eval_samples = len(eval_indices(len(index), info.rank, info.world_size))
        if train or even_batches:
            self.samples_per_rank = math.ceil(len(index) / info.world_size)
        else:
            self.samples_per_rank = self.eval_samples
        self.epoch = -1  # the epoch being (or last) iterated
        self._next_epoch = 0
        self._epoch_chosen = False  # set_epoch (or a loaded state) since the last iter()
        self._resume: ResumePoint | None = None  # from load_state_dict, for the next iteration
        # the epoch being iterated: where it started and the batches and samples handed out
        self._position: dict | None = None
        self._skipped: list[Skipped] = list(index.skipped)
        self._lock = threading.Lock()
        t = self.transform
        self.normalize = Normalize(device, dtype, channels_last, t.mean, t.std)

    # --- the public surface ---------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        """Distinct samples in the source (after skipping what listing found unusable)."""
        return len(self.index)

    @property
    def padding_per_epoch(self) -> int:
        """Repeated samples per epoch over all ranks: ``world · samples_per_rank − N`` (none in
        exact evaluation)."""
        if not self.train and not self.even_batches:
            return 0
        return self.info.world_size * self.samples_per_rank - len(self.index)

    @property
    def skipped(self) -> list[Skipped]:
        """Everything skipped so far: found when listing, and (torch, wds) when decoding."""
        with self._lock:
            return list(self._skipped)

    def skipped_since(self, count: int) -> list[Skipped]:
        """What was skipped after the first ``count`` (``len(loader.skipped)`` earlier): a
        caller counting skips batch by batch copies only the new ones."""
        with self._lock:
            return self._skipped[count:]

    @property
    def sampler(self) -> EpochSampler:
        """DistributedSampler's surface (``set_epoch``, ``len()``): :class:`EpochSampler`."""
        return EpochSampler(self)

    @property
    def num_workers(self) -> int:
        """Worker processes (torch, wds) or DALI CPU threads, as DataLoader's ``num_workers``."""
        return self.workers

    def settings(self) -> str:
        """What this loader runs with where its defaults chose, in words: where it decodes (on
        the CPU, torch and wds: with which library), its workers (DALI: threads) and the cores
        they may run on (``reserve_cores``). verify keeps it for each run: the defaults pick
        these from the batch, the GPU, the cores and what is installed."""
        return ", ".join(self._settings())

    def _settings(self) -> list[str]:
        decode = getattr(self, "decode", None)  # "cpu" or "gpu" in every backend of ours
        words = [f"decode on the {decode.upper()}"] if decode else []
        library = getattr(getattr(self, "decoder", None), "decoder", None)  # torch, wds: CpuDecoder
        if decode == "cpu" and library:  # "auto" falls back to pil (slower) without simplejpeg
            words[0] += f" ({library})"
        word = self._worker_word if self.workers != 1 else self._worker_word[:-1]
        words.append(f"{self.workers} {word}")
        cpus = getattr(self, "_loader_cpus", None)
        words.append(f"on cores {cpu_list(cpus)}" if cpus else "on every core")
        return words

    @property
    def next_epoch(self) -> int:
        """The epoch the next ``iter()`` starts (or resumes)."""
        return self._next_epoch

    def dealt_per_rank(self) -> int:
        """``len(loader.sampler)``: the samples of this rank's epoch in training; in evaluation
        the most any rank holds (see :class:`loaders.dropin.EpochSampler`)."""
        if self.train or self.even_batches:
            return self.samples_per_rank
        return math.ceil(len(self.index) / self.info.world_size)

    def __len__(self) -> int:
        if self.drop_last:
            return self.samples_per_rank // self.batch_size
        return math.ceil(self.samples_per_rank / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next iteration (also done automatically: epoch + 1 each time).

        After :meth:`load_state_dict`, setting the state's epoch keeps the resume point; another
        epoch drops it (that epoch starts from its beginning)."""
        if epoch < 0:
            raise ValueError(f"epoch must be ≥ 0, got {epoch}")
        self._next_epoch = int(epoch)
        self._epoch_chosen = True
        if self._resume is not None and self._resume.epoch != epoch:
            self._resume = None

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        epoch = self._next_epoch
        self._epoch_chosen = False
        self.epoch = epoch
        start = self._resume if self._resume is not None and self._resume.epoch == epoch else None
        self._resume = None
        point = start or ResumePoint(epoch)
        # skipped batches are full ones: only an epoch's last batch may be smaller
        done = point.batches * self.batch_size
        self._position = {"point": point, "batches": point.batches, "samples": done}
        last = self._part_length(point)
        for images, labels, keys in self._epoch_batches(epoch, start):
            out: tuple[torch.Tensor, ...] = (images, labels)
            if self.even_batches:
                keys, valid = self._mark_repeats(keys, self._position["samples"], len(labels))
            if self.return_keys:
                out += (keys,)
            if self.even_batches:
                out += (valid.to(labels.device, non_blocking=True),)
            # counted before the caller gets the batch: a state taken now includes it
            self._position["batches"] += 1
            self._position["samples"] += len(labels)
            if self._position["batches"] >= last and not self._epoch_chosen:
                self._next_epoch = epoch + 1  # its last batch: the epoch is used up
            yield out
        self._position = None
        if not self._epoch_chosen:  # (an epoch of no batches)
            self._next_epoch = epoch + 1

    def _mark_repeats(self, keys: torch.Tensor, done: int, n: int):
        """(keys, valid) of a batch of even evaluation whose first sample is this rank's
        ``done``-th of the epoch: the repeats come after the rank's own ``eval_samples``."""
        return keys, torch.arange(done, done + n) < self.eval_samples

    # --- resumption ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Where this loader is: the epoch, and the batches of it the caller has received.

        A plain dict (``torch.save`` it with the model). A loader built with the same arguments
        and given it by :meth:`load_state_dict` yields the rest of that epoch, the same batches
        in the same order as this loader would have, then the next epochs as this one would.
        Take it between batches (say every k steps, after the step). Batches prefetched beyond
        the last one received are not counted: the resumed loader makes them again. torch and
        wds: every rank's state is the same, one rank may save it; dali: each rank saves its own.
        """
        if self._resume is not None:  # loaded, not iterated yet
            point, batches = self._resume, self._resume.batches
            samples = batches * self.batch_size
        elif self._position is not None:
            point = self._position["point"]
            batches, samples = self._position["batches"], self._position["samples"]
        else:
            point, batches, samples = ResumePoint(self._next_epoch), 0, 0
        epoch, earlier = point.epoch, point.earlier
        if batches and batches >= self._part_length(point):  # the epoch is done: the next one
            epoch, batches, samples, earlier = epoch + 1, 0, 0, ()
        return {
            "format": STATE_FORMAT,
            "backend": self.backend,
            "epoch": epoch,
            "batches": batches,
            "samples": samples,  # received on this rank in this epoch (on this world size)
            "world_size": self.info.world_size,
            "rank": self.info.rank,
            "earlier_worlds": [list(p) for p in earlier],
            "num_samples": len(self.index),
            "batch_size": self.batch_size,
            "seed": self.seed,
            "train": self.train,
            "drop_last": self.drop_last,
            **self._backend_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume where ``state`` (from :meth:`state_dict`) was taken, at the next ``iter()``.

        ValueError when the loader was built with other arguments, or when the world size
        changed mid-epoch and this backend cannot deal the rest of an epoch to other ranks
        (only the torch backend can; every backend can from an epoch's start)."""
        check_state(state, self._state_identity())
        earlier = tuple((int(w), int(b)) for w, b in state.get("earlier_worlds", []))
        batches, world = state["batches"], state["world_size"]
        if world != self.info.world_size and (batches or earlier):
            if not self.can_reshard:
                raise ValueError(
                    f"the {self.backend} backend cannot resume an epoch on another world size "
                    f"(saved on {world} ranks, now {self.info.world_size}): resume on {world} "
                    "ranks, or from an epoch's start (only the torch backend can reshard)"
                )
            earlier, batches = (*earlier, (world, batches)), 0
        if earlier and not self.can_reshard:
            raise ValueError(f"the {self.backend} backend cannot resume a resharded epoch")
        self._resume = ResumePoint(state["epoch"], batches, earlier, self._extra_state(state))
        self._next_epoch = state["epoch"]
        self._epoch_chosen = True

    def _state_identity(self) -> dict:
        return {
            "backend": self.backend,
            "num_samples": len(self.index),
            "batch_size": self.batch_size,
            "seed": self.seed,
            "train": self.train,
            "drop_last": self.drop_last,
        }

    def _part_length(self, point: ResumePoint) -> int:
        """Batches of the epoch part that starts at ``point`` (its skipped batches included)."""
        return len(self)

    def _backend_state(self) -> dict:
        """A backend's own entries in :meth:`state_dict`."""
        return {}

    def _extra_state(self, state: dict) -> dict:
        """A backend's own part of a loaded ``state`` (checked), kept in the resume point."""
        return {}

    def close(self) -> None:
        """Release workers and pipelines (also done when the loader is garbage-collected)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- for subclasses ---------------------------------------------------------------------
    def _epoch_batches(
        self, epoch: int, start: ResumePoint | None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """The batches of ``epoch``; from ``start`` (skipping its ``batches``) when resuming."""
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
