"""Batch slots: one shared, page-locked buffer that DataLoader workers decode batches into.

Without slots every batch a worker makes is a new shared-memory segment, which the training
process maps, copies into pinned memory on DataLoader's pin thread and unmaps: at 64 images of
224² a step that is ~10 MB of page faults, a copy and an ``munmap`` in the process whose own thread
launches the kernels. On an H200 host that work alone, done by a thread of the training process
once a step, made ResNet-50's 64-image step 17% slower (BENCHMARKS.md, run 12). With slots the
training process maps and page-locks the buffer once; a worker writes a batch's images and labels
into its next slot and sends back only the slot's number; the batch is copied to the GPU straight
from the slot and the slot handed back once that copy is done.

Slots are per worker (``per_worker`` each, taken in turn). DataLoader keeps at most
``prefetch_factor`` batches outstanding per worker and yields them in order, so a worker's slot
comes round again only ``per_worker - prefetch`` of its own batches after the training process
took that batch; ``per_worker = prefetch + 2`` leaves the training process two of the worker's
turns to finish the copy. It hands back every slot whose copy it issued before it waits for
another batch (:meth:`BatchSlots.hand_back`), so a worker never waits on a training process that
waits on it; a worker still checks that its slot is free (a lost hand-back would otherwise
overwrite a batch being copied) and fails after ``WAIT_S``.
"""

from __future__ import annotations

import collections
import os
import time
import warnings
import weakref

import torch
from torch.utils.data import get_worker_info

# A worker waiting longer than this for its next slot fails: the hand-back protocol is broken.
WAIT_S = 60.0
# Slots per worker beyond its prefetched batches (see the module docstring).
SPARE = 2
_PORTABLE = 1  # cudaHostRegisterPortable


def _align(n: int, to: int) -> int:
    return -(-n // to) * to


def _layout(count: int, batch_size: int, image_size: int) -> tuple[int, int, int, int]:
    """Where things lie in the buffer of ``count`` slots: (a slot's labels after its images, a
    slot's bytes, the flags after every slot, the buffer's bytes)."""
    label_at = _align(batch_size * image_size * image_size * 3, 64)
    slot_bytes = _align(label_at + 8 * batch_size, 4096)
    flags_at = count * slot_bytes  # a byte per slot: 1 while the trainer has it
    return label_at, slot_bytes, flags_at, flags_at + _align(count, 4096)


def nbytes(workers: int, per_worker: int, batch_size: int, image_size: int) -> int:
    """The shared memory :class:`BatchSlots` of these dimensions take."""
    return _layout(workers * per_worker, batch_size, image_size)[3]


def shm_free() -> int | None:
    """Bytes free in /dev/shm, where shared tensors live (None: cannot tell)."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


class SlotBatch:
    """What a worker sends back instead of a batch: its slot, how many samples it holds (a batch
    with unreadable files left out is shorter), their keys (numpy: pickled, no shared memory),
    the files skipped, and (wds) the epoch it belongs to."""

    __slots__ = ("slot", "n", "keys", "skipped", "epoch")

    def __init__(self, slot: int, n: int, keys, skipped, epoch: int | None = None) -> None:
        self.slot, self.n, self.keys, self.skipped, self.epoch = slot, n, keys, skipped, epoch

    def __reduce__(self):
        return SlotBatch, (self.slot, self.n, self.keys, self.skipped, self.epoch)


class BatchSlots:
    """``workers × per_worker`` slots of ``batch_size`` uint8 images (H×W×3, ``image_size``²) and
    int64 labels, in one shared buffer; picklable (spawned workers map the same memory)."""

    def __init__(self, workers: int, per_worker: int, batch_size: int, image_size: int) -> None:
        self.workers, self.per_worker = workers, per_worker
        self.shape = (batch_size, image_size, image_size, 3)
        self.count = workers * per_worker
        self.label_at, self.slot_bytes, self.flags_at, size = _layout(
            self.count, batch_size, image_size
        )
        self.buffer = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(size))
        self._taken = 0  # in a worker: its batches so far (its slots are taken in turn)
        self.last_wait_s = 0.0  # in a worker: how long its last claim waited for the slot
        self._main_state()

    def _main_state(self) -> None:
        # a view of the buffer's flag bytes, made once (its storage outlives it)
        self._flags = self.buffer[self.flags_at : self.flags_at + self.count].numpy()
        self._pending: collections.deque = collections.deque()  # (slot, copy done event | None)
        self._events: list | None = None  # a CUDA event per slot, made once (see copied)
        # each slot's (images, labels) views, made once: a batch is then no tensor operation
        # on the training thread but a slice when it is short
        self._views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._last: int | None = None  # the slot taken last, whose copy is issued next
        self._pinned: weakref.finalize | None = None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for name in ("_flags", "_pending", "_events", "_views", "_last", "_pinned"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._main_state()

    def _slot(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        if slot in self._views:
            return self._views[slot]
        start = slot * self.slot_bytes
        n, h, w, c = self.shape
        images = self.buffer[start : start + n * h * w * c].view(self.shape)
        at = start + self.label_at
        labels = self.buffer[at : at + 8 * n].view(torch.int64)
        self._views[slot] = images, labels
        return images, labels

    # --- in a worker ------------------------------------------------------------------------
    def claim(self) -> tuple[int, torch.Tensor, torch.Tensor]:
        """This worker's next slot once the training process has handed it back: (slot, its
        images, its labels), to fill."""
        info = get_worker_info()
        worker = info.id if info is not None else 0
        slot = worker * self.per_worker + self._taken % self.per_worker
        self._taken += 1
        flags, t0 = self._flags, time.monotonic()
        while flags[slot]:
            if time.monotonic() - t0 > WAIT_S:
                raise RuntimeError(f"batch slot {slot} not handed back within {WAIT_S:.0f} s")
            time.sleep(1e-4)
        self.last_wait_s = time.monotonic() - t0
        images, labels = self._slot(slot)
        return slot, images, labels

    # --- in the training process ----------------------------------------------------------
    def take(self, batch: SlotBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """A worker's batch as views of its slot, which is the training process's until
        :meth:`copied` and :meth:`hand_back` (or :meth:`release` at once)."""
        self._flags[batch.slot] = 1
        self._last = batch.slot
        images, labels = self._slot(batch.slot)
        if batch.n < len(labels):
            return images[: batch.n], labels[: batch.n]
        return images, labels

    def unpack(self, batch: SlotBatch, copy: bool) -> tuple[torch.Tensor, ...]:
        """(images, labels, keys) of a worker's batch: views of its slot, to be copied to the GPU
        (:class:`loaders.prefetch.DevicePrefetcher` reports the copy), or with ``copy`` copies
        on the host and the slot handed back at once."""
        images, labels = self.take(batch)
        if copy:
            images, labels = images.clone(), labels.clone()
            self.release(batch.slot)
        return images, labels, torch.from_numpy(batch.keys)

    def release(self, slot: int) -> None:
        """Hand ``slot`` back now (its contents were copied on the host)."""
        self._flags[slot] = 0
        if self._last == slot:
            self._last = None

    def copied(self, stream) -> None:
        """The last slot taken is being copied to the GPU on ``stream`` (None: copied on the
        host already). The slot's own event, recorded there, completes with the copy: one event
        per slot, reused, since a slot is copied again only after :meth:`hand_back` waited for
        its event (a new event a batch is a Python object and a driver call more a step)."""
        if self._last is None:
            return
        event = None
        if stream is not None:
            if self._events is None:
                self._events = [torch.cuda.Event() for _ in range(self.count)]
            event = self._events[self._last]
            event.record(stream)
        self._pending.append((self._last, event))
        self._last = None

    def hand_back(self) -> None:
        """Every slot whose copy was issued, once the copy is done: called before waiting for
        another batch. The copies were issued a step or more ago on a stream of their own, so
        the wait is for the last of them at most. A slot taken and never copied is handed back
        too: its batch was dropped (a resumed epoch's skipped batches), since a taken batch is
        copied before the next one is asked for."""
        flags = self._flags
        while self._pending:
            slot, event = self._pending.popleft()
            if event is not None:
                event.synchronize()
            flags[slot] = 0
        if self._last is not None:
            self.release(self._last)

    def pin(self) -> None:
        """Page-lock the buffer for the current CUDA device's copies (once; undone when this
        object goes): copies from a slot are then asynchronous DMA, as from pinned memory."""
        if self._pinned is not None or not torch.cuda.is_available():
            return
        storage = self.buffer.untyped_storage()
        ptr, size = storage.data_ptr(), storage.nbytes()
        # portable: page-locked for every device's context, whichever is current here
        err = int(torch.cuda.cudart().cudaHostRegister(ptr, size, _PORTABLE))
        if err != 0:  # still correct, slower: the driver stages each copy through its own buffer
            warnings.warn(
                f"the loader's batch slots ({size / 2**30:.1f} GiB) could not be page-locked "
                f"(cudaHostRegister error {err}): copies to the GPU go through pageable memory",
                stacklevel=3,
            )
            return
        self._pinned = weakref.finalize(self, _unregister, ptr, storage, os.getpid())

    def close(self) -> None:
        """Wait for copies in flight, hand every slot back, and unpin."""
        self.hand_back()
        if self._pinned is not None:
            self._pinned()


def _unregister(ptr: int, storage, pid: int) -> None:
    # ``storage`` is held here so the memory stays mapped until it is unregistered; a forked
    # worker inherits this finalizer but may make no CUDA call
    if os.getpid() == pid:
        torch.cuda.cudart().cudaHostUnregister(ptr)
