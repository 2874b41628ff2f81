"""Host batches → device batches, one batch ahead, on a side CUDA stream (normalise on the GPU,
after a user's ``batch_transform``: :class:`loaders.transforms.BatchOutput`)."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterable, Iterator

import torch

from loaders.transforms import BatchOutput, Normalize


class DevicePrefetcher:
    """Wrap an iterable of ``(uint8 N×H×W×3, labels, keys)`` host batches.

    On CUDA the next batch's copy (``non_blocking`` from pinned memory) and normalisation are issued
    on a side stream while the consumer works on the current one; the consumer's stream waits for
    them, and the tensors are recorded on it so the caching allocator does not reuse them early.
    On the CPU it normalises in place of the copy.

    ``staged``: the host batch is taken and its copy and normalisation issued on a thread of
    their own, ``lead`` batches ahead, so that the training thread's ``next()`` only hands over
    (a small batch's step is bound by that thread launching kernels: issue 29).
    """

    def __init__(
        self,
        batches: Iterable,
        device: torch.device,
        normalize: Normalize | BatchOutput,
        staged: bool = False,
        lead: int = 2,
    ) -> None:
        self.batches = batches
        self.device = device
        self.normalize = normalize
        self.staged = staged
        self.lead = lead

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        if self.staged:
            yield from self._staged()
            return
        if self.device.type != "cuda":
            for images, labels, keys in self.batches:
                yield self.normalize(images), labels, keys
            return
        stream = torch.cuda.Stream(device=self.device)
        it = iter(self.batches)

        def issue():
            try:
                images, labels, keys = next(it)
            except StopIteration:
                return None
            with torch.cuda.stream(stream):
                images = images.to(self.device, non_blocking=True)
                labels = labels.to(self.device, non_blocking=True)
                return self.normalize(images), labels, keys

        nxt = issue()
        while nxt is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(stream)
            images, labels, keys = nxt
            if isinstance(images, torch.Tensor):  # a user's batch_transform returns what it likes
                images.record_stream(current)
            labels.record_stream(current)
            nxt = issue()
            yield images, labels, keys

    def _staged(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """The stager thread fills a queue of (batch, event); the consumer's stream waits for each
        event. The host iterator is used (and closed) by the stager thread only."""
        ready: queue.Queue = queue.Queue(maxsize=self.lead)
        stop = threading.Event()
        stager = threading.Thread(
            target=self._stage, args=(ready, stop), name="feedbench-stager", daemon=True
        )
        stager.start()
        try:
            while True:
                kind, item = ready.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise item
                (images, labels, keys), done = item
                if done is not None:
                    current = torch.cuda.current_stream(self.device)
                    current.wait_event(done)
                    if isinstance(images, torch.Tensor):
                        images.record_stream(current)
                    labels.record_stream(current)
                yield images, labels, keys
        finally:
            stop.set()
            while stager.is_alive():  # it may be blocked on a full queue: make room until it ends
                with contextlib.suppress(queue.Empty):
                    ready.get(timeout=0.05)

    def _stage(self, ready: queue.Queue, stop: threading.Event) -> None:
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.set_device(self.device)  # (per thread)
            stream = torch.cuda.Stream(device=self.device)
        it = iter(self.batches)
        try:
            for images, labels, keys in it:
                if not cuda:
                    out, done = (self.normalize(images), labels, keys), None
                else:
                    with torch.cuda.stream(stream):
                        images = images.to(self.device, non_blocking=True)
                        labels = labels.to(self.device, non_blocking=True)
                        out = self.normalize(images), labels, keys
                        done = torch.cuda.Event()
                        done.record(stream)
                if stop.is_set():
                    return
                ready.put(("batch", (out, done)))
                if stop.is_set():
                    return
            ready.put(("end", None))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
            ready.put(("error", e))
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()
