"""Host batches → device batches, one batch ahead, on a side CUDA stream (normalise on the GPU,
after a user's ``batch_transform``: :class:`loaders.transforms.BatchOutput`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from loaders.transforms import BatchOutput, Normalize


class DevicePrefetcher:
    """Wrap an iterable of ``(uint8 N×H×W×3, labels, keys)`` host batches.

    On CUDA the next batch's copy (``non_blocking`` from pinned memory) and normalisation are issued
    on a side stream while the consumer works on the current one; the consumer's stream waits for
    them, and the tensors are recorded on it so the caching allocator does not reuse them early.
    On the CPU it normalises in place of the copy.
    """

    def __init__(
        self, batches: Iterable, device: torch.device, normalize: Normalize | BatchOutput,
        slots=None, decode=None,
    ) -> None:  # fmt: skip
        self.batches = batches
        self.device = device
        self.normalize = normalize
        self.slots = slots  # loaders.slots.BatchSlots the host batches are views of, if any
        # (host batch, labels, keys) → (uint8 images on the device, labels, keys): a batch of
        # JPEG bytes decoded on the device (loaders.gpu_decode) instead of copied
        self.decode = decode

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        if self.device.type != "cuda":
            for images, labels, keys in self.batches:
                if self.decode is not None:
                    images, labels, keys = self.decode(images, labels, keys)
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
                if self.decode is not None:
                    images, labels, keys = self.decode(images, labels, keys)
                images = images.to(self.device, non_blocking=True)
                labels = labels.to(self.device, non_blocking=True)
                if self.slots is not None:  # the slot goes back once this copy is done
                    self.slots.copied(stream)
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
