"""The tuned torch backend: map-style dataset, DistributedSampler, DataLoader, CUDA-stream prefetch.

* Sharding is exactly torch's ``DistributedSampler`` (its indices for every epoch, computed in the
  main process, so persistent workers see it): every rank gets ``ceil(N / W)`` indices of a
  permutation seeded by ``seed + epoch``; the ``W·ceil(N/W) − N`` padding samples repeat the start
  of that permutation. Evaluation (``train=False``): the contiguous range
  :func:`loaders.dist.eval_indices`, no padding (``even_batches=True``: then the first samples
  again, up to ``ceil(N / W)``, marked as repeats by their position).
* Resumption (:meth:`LoaderBase.state_dict`): a resumed epoch starts at the batch it stopped at,
  with the same batch numbers (so the same augmentations); on another world size the samples not
  yet seen are dealt to the new ranks (:mod:`loaders.resume`).
* The dataset is map-style over numpy arrays (paths in one byte buffer, labels, shard offsets), so
  workers do not grow by copy-on-read of Python objects.
* A worker builds a whole batch (``__getitems__``): it decodes each image the fast way
  (:class:`loaders.decode.CpuDecoder`: crop first, DCT-scaled decode, uint8 resize) straight into
  shared memory, so handing it to the main process copies nothing. Where batches go to a GPU that
  memory is the worker's next batch slot (:mod:`loaders.slots`: one buffer the training process
  page-locked once; ``slots=False``: a new shared tensor per batch, pinned by DataLoader's pin
  thread). Augmentation randomness comes from ``(seed, epoch, rank, batch)``: the same whatever the
  number of workers.
* The DataLoader keeps workers alive (``persistent_workers``) and prefetches ``prefetch`` batches
  per worker, across epoch boundaries (one iterator over an endless batch sampler: the workers
  start epoch e + 1 while epoch e's last batches are used);
  :class:`loaders.prefetch.DevicePrefetcher` copies the next batch with ``non_blocking`` on a side
  stream and normalises it on the GPU.

Bad input: skipped and counted. A file that cannot be read or decoded (corrupt, zero bytes, not an
image) is left out of its batch, which is then smaller by one; it is listed in ``loader.skipped``.
The number of batches never changes, so ranks stay equal. A full batch none of whose samples
could be read or decoded is a :class:`~loaders.errors.LoaderError` naming one of them: an empty
batch cannot be trained on, and the data is then mostly unreadable.
"""

from __future__ import annotations

import atexit
import math
import os
import threading
import warnings
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from loaders.affinity import RESERVE_CORES, loader_cores, started_on
from loaders.base import LoaderBase, batch_output, start_workers
from loaders.data import SampleIndex, Skipped, remote
from loaders.decode import CpuDecoder, DecodeError
from loaders.dist import eval_indices, shard_indices
from loaders.dropin import SourceInfo
from loaders.errors import LoaderError
from loaders.gpu_decode import EncodedBatchMaker, GpuJpegDecoder, decode_where
from loaders.prefetch import DevicePrefetcher
from loaders.resume import ResumePoint, resumed_indices
from loaders.slots import SPARE, BatchSlots, SlotBatch, shm_free
from loaders.slots import nbytes as slot_bytes
from loaders.worker_clock import WorkerClock

# How far below the training process's priority the workers run (``worker_nice``; 0: the same).
WORKER_NICE = 10


class _EpochBatchSampler:
    """This rank's indices in batches, each tagged ``(epoch, batch number, indices)``.

    ``order(epoch, point)`` gives this rank's indices of an epoch (or of the part of it that
    starts at a resume point); batch numbers count from the epoch's (part's) start, so a resumed
    epoch's batches have the numbers, and so the augmentations, of the uninterrupted run.
    """

    def __init__(self, order: Callable[[int, ResumePoint], np.ndarray], batch_size, drop_last):
        self.order = order
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.start = ResumePoint(0)

    def count(self, n: int) -> int:
        """Batches of ``n`` indices."""
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self):
        """Endless: the batches of ``self.start``'s epoch from there, then of every next epoch.

        The DataLoader's workers therefore go on into epoch e + 1 while the last batches of epoch
        e are still being used, instead of idling until the next ``iter()`` (see TorchLoader).
        """
        point = self.start
        while True:
            idx = self.order(point.epoch, point)
            batches = self.count(len(idx))
            if batches == 0 and not point.earlier:
                # every whole epoch has as many batches: none ever (a rank with no samples, or
                # fewer than a batch with drop_last); looking on for one would never return
                return
            for b in range(point.batches, batches):
                yield (point.epoch, b, idx[b * self.batch_size : (b + 1) * self.batch_size])
            point = ResumePoint(point.epoch + 1)


def _as_is(batch):
    return batch


def _new_uint8(shape: tuple[int, ...], pin: bool) -> torch.Tensor:
    """A uint8 tensor in shared memory inside a worker (no copy on the way out), else pinned."""
    if get_worker_info() is not None:
        storage = torch.UntypedStorage._new_shared(math.prod(shape))
        return torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)
    return torch.empty(shape, dtype=torch.uint8, pin_memory=pin)


class ImageDataset(SourceInfo, Dataset):
    """Map-style: ``__getitems__((epoch, batch, indices))`` → one decoded uint8 batch; also
    ``loader.dataset`` (:class:`loaders.dropin.SourceInfo`)."""

    def __init__(
        self, index: SampleIndex, decoder: CpuDecoder, seed: int, rank: int, pin: bool = False,
        slots: BatchSlots | None = None, encode: bool = False, clock: WorkerClock | None = None,
    ) -> None:  # fmt: skip
        self.index = index
        self.clock = clock  # each worker's time making batches (loaders.worker_clock)
        self.decoder = decoder
        self.seed = seed
        self.rank = rank
        self.pin = pin
        self.slots = slots  # workers decode into these (loaders.slots)
        # decode="gpu": workers send bytes and crops (loaders.gpu_decode), made per process
        self.encode = encode
        self._maker: EncodedBatchMaker | None = None
        self._fds: dict[int, int] = {}
        self._pid = -1

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int):
        images, labels, keys, _ = self.__getitems__((0, 0, np.array([i])))
        return images[0], labels[0]

    def _read(self, i: int) -> bytes:
        ix = self.index
        if ix.remote:  # one GET (a shard's member: a ranged one) through the data layer
            return ix.read(i)
        if ix.kind == "tree":
            assert ix.paths is not None
            with open(ix.paths[i], "rb") as f:
                return f.read()
        if self._pid != os.getpid():  # descriptors are per process (workers fork or spawn)
            self._fds, self._pid = {}, os.getpid()
        assert ix.shard_of is not None and ix.size is not None and ix.offset is not None
        s = int(ix.shard_of[i])
        fd = self._fds.get(s)
        if fd is None:
            fd = self._fds[s] = os.open(ix.shards[s], os.O_RDONLY)
        return os.pread(fd, int(ix.size[i]), int(ix.offset[i]))

    def __getitems__(self, request):
        if self.clock is None:
            return self._make(request)
        return self.clock.timed(lambda: self._make(request), self.slots)  # None with decode="gpu"

    def _make(self, request):
        epoch, batch, indices = request
        size = self.decoder.size
        rng = np.random.default_rng([self.seed, epoch, self.rank, batch])
        if self.encode:
            return self._encoded(indices, rng)
        if self.slots is not None and get_worker_info() is not None:
            slot, images, labels = self.slots.claim()
        else:
            slot, images = None, _new_uint8((len(indices), size, size, 3), self.pin)
        out = images.numpy()
        keep, skipped = self._each(
            indices, lambda data, n: self.decoder.decode_into(data, out[n], rng)
        )
        if slot is not None:  # the slot's number and small arrays (pickled, no shared memory)
            labels[: len(keep)] = torch.from_numpy(self.index.labels[keep].astype(np.int64))
            return SlotBatch(slot, len(keep), np.asarray(keep, dtype=np.int64), skipped)
        return (images[: len(keep)], *self._labels_keys(keep), skipped)

    def _encoded(self, indices, rng):
        """decode="gpu": the batch's bytes and crops (:class:`EncodedBatch`) for the GPU."""
        if self._maker is None:
            self._maker = EncodedBatchMaker(self.decoder)
        maker = self._maker
        keep, skipped = self._each(indices, lambda data, n: maker.add(data, rng))
        encoded = maker.batch(lambda shape: _new_uint8(shape, False))
        return (encoded, *self._labels_keys(keep), skipped)

    def _each(self, indices, put) -> tuple[list[int], list[Skipped]]:
        """Read each sample and ``put(data, n)`` it (n: the samples kept so far); what cannot
        be read or decoded is skipped and said why. (kept indices, skipped)"""
        keep: list[int] = []
        skipped: list[Skipped] = []
        for i in indices:
            i = int(i)
            try:
                put(self._read(i), len(keep))
            except OSError as e:
                skipped.append(Skipped(self.index.describe(i), remote.reason(e)))
                continue
            except DecodeError as e:
                skipped.append(Skipped(self.index.describe(i), str(e) or type(e).__name__))
                continue
            keep.append(i)
        return keep, skipped

    def _labels_keys(self, keep: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        keys = torch.tensor(keep, dtype=torch.int64)
        labels = torch.from_numpy(self.index.labels[keep]) if keep else keys.clone()
        return labels, keys


def worker_options(workers: int, prefetch: int, multiprocessing_context, nice: int) -> dict:
    """DataLoader options shared by the torch and wds backends: persistent, prefetching workers,
    ``nice`` steps below the training process's priority."""
    if workers <= 0:
        return {}
    return dict(
        persistent_workers=True,
        prefetch_factor=prefetch,
        worker_init_fn=_WorkerStart(nice),
        multiprocessing_context=multiprocessing_context,
    )


class _WorkerStart:
    """A worker's first acts (picklable, for spawned workers): lower its priority by ``nice``,
    and have its exit wait for its result queue (:func:`_let_the_feeder_finish`).

    With a worker per core the decoders and the training process's own thread (kernel launches,
    the optimizer, DDP's hooks) compete for the same cores, and a preempted launch thread idles
    the GPU. At a lower priority the workers still take every core the training process leaves
    idle, but yield at once when it wakes. BENCHMARKS.md: "Loader workers at a lower priority".
    """

    def __init__(self, nice: int) -> None:
        self.nice = nice

    def __call__(self, worker_id: int) -> None:
        if self.nice:
            os.nice(self.nice)
        atexit.register(_let_the_feeder_finish)
        _worker_init(worker_id)


def _let_the_feeder_finish(timeout_s: float = 2.0) -> None:
    """At a spawned worker's exit (a forked one ends by ``os._exit``, without this): wait for its
    result queue's feeder thread, which torch's worker loop leaves running
    (``cancel_join_thread``). Caught by the interpreter's shutdown while it pickles a batch
    (torch's C++ sharing code, the GIL released), that thread is unwound through C++ frames and
    aborts the worker ("terminate called without an active exception"), and the parent's
    ``close()`` raises. BENCHMARKS.md: "Spawned loader workers that abort at exit"."""
    for thread in threading.enumerate():
        if thread.name == "QueueFeederThread" and thread is not threading.current_thread():
            thread.join(timeout_s)


def _worker_init(_: int) -> None:
    try:
        import cv2

        cv2.setNumThreads(1)
    except ImportError:
        pass


class WorkersAcrossEpochs:
    """One DataLoader iterator that runs on across epochs (the torch and wds backends).

    Its workers go on into epoch e + 1 while epoch e's last items are used, instead of idling
    until the training loop's next ``iter()``. It is restarted (in-flight items dropped) when the
    epoch asked for is not the one it is on, e.g. after an epoch left midway or ``set_epoch`` to
    another epoch; ``close()`` stops the workers.
    """

    dataloader: DataLoader
    _iter: Iterator | None = None  # the DataLoader's iterator, across epochs
    _ready_epoch: int | None = None  # the epoch it yields next, from that epoch's start
    _loader_cpus: set[int] | None = None  # where its workers run (loaders.affinity)
    slots: BatchSlots | None = None  # what its workers decode into (loaders.slots)
    clock: WorkerClock | None = None  # its workers' time making batches (loaders.worker_clock)
    gpu_decoder: GpuJpegDecoder | None = None  # decode="gpu" (loaders.gpu_decode)
    # the samples a worker skipped of the batch _decoded takes next (torch; wds replaces them)
    _host_skips = 0

    def _epoch_items(
        self, epoch: int, count: int, start: Callable[[], None], restart: bool = False
    ) -> Iterator:
        """The ``count`` items of ``epoch``; ``start()`` tells the sampler or the workers where
        to begin before a (re)started iterator forks them. ``restart``: start over even when
        the running iterator is at the epoch's start (to resume midway)."""
        if count == 0:  # nothing to take: no iterator (nor workers) to start
            return
        if restart or self._iter is None or self._ready_epoch != epoch:
            start()
            self._hand_back()
            with started_on(self._loader_cpus):  # the workers and the pin-memory thread
                self._iter = start_workers(self.dataloader)
        self._ready_epoch = None  # midway until every item of the epoch is taken
        for _ in range(count):
            self._hand_back()  # before waiting on the workers, who may wait on a slot
            yield next(self._iter)
        self._ready_epoch = epoch + 1

    def _batch_slots(
        self, slots: bool | None, workers: int, prefetch: int, pin: bool
    ) -> BatchSlots | None:
        """The workers' batch slots (:mod:`loaders.slots`): by default wherever batches go to a
        GPU from worker processes; ``slots=True`` also on the CPU (each batch then copied out)."""
        if workers <= 0 or not (pin if slots is None else slots):
            return None
        need = slot_bytes(workers, prefetch + SPARE, self.batch_size, self.image_size)
        free = shm_free()
        if free is not None and need > free // 2:  # the in-flight batches of DataLoader's own
            # way need room there too; a full /dev/shm is a bus error, not an exception
            warnings.warn(
                f"batch slots need {need / 2**30:.1f} GiB of shared memory and /dev/shm has "
                f"{free / 2**30:.1f} GiB free: using DataLoader's pin thread instead (a larger "
                "/dev/shm, e.g. docker run --shm-size, or fewer workers or prefetch)",
                stacklevel=4,
            )
            return None
        made = BatchSlots(workers, prefetch + SPARE, self.batch_size, self.image_size)
        if pin:
            made.pin()
        return made

    def _decoded(self, encoded, labels, keys):
        """decode="gpu": a worker's :class:`EncodedBatch` decoded on the device (on the
        prefetcher's stream); what nvJPEG and the CPU both fail on is skipped and counted."""
        assert self.gpu_decoder is not None
        images, failed, why = self.gpu_decoder(encoded)
        if failed:
            skipped = [
                Skipped(self.index.describe(int(keys[p])), w)
                for p, w in zip(failed, why, strict=True)
            ]
            self._record_skipped(skipped)
            n = len(failed) + self._host_skips  # the batch's samples that failed
            if len(failed) == len(keys) and n >= self.batch_size:
                raise _nothing_decoded(skipped[0], n, self.info.rank, self.backend)
            keep = np.setdiff1d(np.arange(len(keys)), failed)
            labels, keys = labels[keep], keys[keep]
        return images, labels, keys

    def _copied_out(self, batch: SlotBatch) -> bool:
        """Whether a worker's batch is copied out of its slot on the host, the slot back at once
        (on the CPU), rather than copied to the GPU straight from it."""
        return self.device.type != "cuda"

    def _hand_back(self) -> None:
        """Batch slots whose copies are done go back to the workers (:mod:`loaders.slots`)."""
        if self.slots is not None:
            self.slots.hand_back()

    def close(self) -> None:
        self._iter, self._ready_epoch = None, None
        it = getattr(self.dataloader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self.dataloader._iterator = None
        if self.slots is not None:
            self.slots.close()


def _nothing_decoded(one: Skipped, n: int, rank: int, backend: str) -> LoaderError:
    """Why a whole batch of ``n`` is refused: an empty batch cannot be trained on (its mean
    loss is NaN, which DDP's all-reduce would hand every rank), and a full batch of bad files
    means the data is, in the main, unreadable. A bad file alone is skipped, as ever."""
    return LoaderError(
        f"rank {rank}: every sample of a batch failed ({n} of {n}), e.g. {one.path}: "
        f"{one.reason} (the {backend} backend skips a bad file, not a whole batch)"
    )


class TorchLoader(WorkersAcrossEpochs, LoaderBase):
    """torch DataLoader backend; see the module docstring for what it does and guarantees."""

    backend = "torch"

    def __init__(
        self,
        index: SampleIndex,
        info,
        batch_size: int,
        *,
        workers: int,
        prefetch: int = 4,
        decoder: str = "auto",
        decode: str = "auto",
        multiprocessing_context=None,
        worker_nice: int = WORKER_NICE,
        reserve_cores: int = RESERVE_CORES,
        batch_transform=None,
        normalize: bool = True,
        slots: bool | None = None,
        **common,
    ) -> None:
        super().__init__(index, info, batch_size, **common)
        self.can_reshard = not self.even_batches  # its repeats are marked by position alone
        self._loader_cpus = loader_cores(reserve_cores, info.local_rank, info.local_world_size)
        self.output = batch_output(self, batch_transform, normalize)
        self.workers = workers
        self.decode = decode_where(decode, self.device)
        on_gpu = self.decode == "gpu"
        pin = self.device.type == "cuda" and not on_gpu  # JPEG bytes go through nvJPEG's own
        self.slots = None if on_gpu else self._batch_slots(slots, workers, prefetch, pin)
        self.clock = WorkerClock(workers) if workers > 0 else None
        self.decoder = CpuDecoder(self.image_size, self.train, decoder, self.transform)
        self.gpu_decoder = GpuJpegDecoder(self.decoder, self.device) if on_gpu else None
        self.dataset = ImageDataset(
            index,
            self.decoder,
            self.seed,
            info.rank,
            pin=pin,
            slots=self.slots,
            encode=on_gpu,
            clock=self.clock,
        )
        self.batch_sampler = _EpochBatchSampler(self._rank_indices, batch_size, self.drop_last)
        kwargs = worker_options(workers, prefetch, multiprocessing_context, worker_nice)
        self.dataloader = DataLoader(
            self.dataset,
            batch_sampler=self.batch_sampler,
            num_workers=workers,
            collate_fn=_as_is,
            pin_memory=pin and workers > 0 and self.slots is None,
            **kwargs,
        )

    can_reshard = True

    def _rank_indices(self, epoch: int, point: ResumePoint) -> np.ndarray:
        """This rank's indices of ``epoch`` (DistributedSampler's, or the eval range), or of the
        part of it after a resume point's earlier parts on other world sizes."""
        n, rank, world = len(self.index), self.info.rank, self.info.world_size
        if not point.earlier:
            if self.train:
                return shard_indices(n, rank, world, seed=self.seed, epoch=epoch)
            own = eval_indices(n, rank, world)
            if not self.even_batches:
                return own
            # even evaluation: repeats of the first samples after the rank's own (base.py)
            return np.concatenate([own, np.arange(self.samples_per_rank - len(own)) % n])
        # the epoch's whole order: DistributedSampler's permutation does not depend on the world
        order = shard_indices(n, 0, 1, seed=self.seed, epoch=epoch) if self.train else np.arange(n)
        return resumed_indices(order, point, rank, world, self.batch_size, self.train)

    def _part_length(self, point: ResumePoint) -> int:
        if not point.earlier:
            return len(self)
        return self.batch_sampler.count(len(self._rank_indices(point.epoch, point)))

    def _host_batches(self, epoch: int, start: ResumePoint | None):
        """Epoch ``epoch``'s batches from the one DataLoader iterator that runs across epochs.

        The iterator goes on into the next epoch (:class:`_EpochBatchSampler` is endless), so its
        workers never wait for the training loop to start the next epoch, and DataLoader's fixed
        turn of workers runs on instead of restarting (which gave the first workers the extra
        batch of every epoch; BENCHMARKS.md, "torch backend across epoch boundaries"). It is
        restarted (in-flight batches dropped) when the epoch asked for is not the one it is on,
        e.g. after an epoch left midway or ``set_epoch`` to another epoch
        (:class:`WorkersAcrossEpochs`), and to resume midway.
        """
        point = start or ResumePoint(epoch)

        def begin() -> None:
            self.batch_sampler.start = point

        count = self._part_length(point) - point.batches
        for item in self._epoch_items(epoch, count, begin, restart=start is not None):
            if isinstance(item, SlotBatch):
                assert self.slots is not None
                item = (*self.slots.unpack(item, copy=self._copied_out(item)), item.skipped)
            images, labels, keys, skipped = item
            self._record_skipped(skipped)
            if not len(keys) and len(skipped) >= self.batch_size:
                raise _nothing_decoded(skipped[0], len(skipped), self.info.rank, self.backend)
            self._host_skips = len(skipped)  # decode="gpu": _decoded takes this batch next
            yield images, labels, keys

    def _epoch_batches(self, epoch: int, start: ResumePoint | None):
        yield from DevicePrefetcher(
            self._host_batches(epoch, start), self.device, self.output, slots=self.slots,
            decode=self._decoded if self.gpu_decoder is not None else None,
        )  # fmt: skip
