"""What training scripts written for torch's ``DataLoader`` read from it, on every backend.

``loader.sampler`` stands in for the ``DistributedSampler`` such a script made (and often keeps:
``train_sampler.set_epoch(epoch)`` every epoch); ``loader.dataset`` for its ``ImageFolder``
(``len()``, ``classes``, ``class_to_idx``). docs/dropin.md has the table and the PyTorch
ImageNet example's diff.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loaders.base import LoaderBase
    from loaders.data import SampleIndex


class EpochSampler:
    """``loader.sampler``: ``set_epoch(e)`` sets the loader's epoch; ``len()`` is the samples
    dealt to a rank per epoch, as ``DistributedSampler``'s ``len()``.

    Training: this rank's samples (the same on every rank, padding included). Evaluation: the
    most any rank holds (``ceil(N / W)``; wds: the largest rank's whole shards), so that
    ``len(sampler) * world_size >= len(loader.dataset)`` and a script that evaluates the
    samples beyond that product itself (PyTorch's ImageNet example) finds none left: the
    exact evaluation already gave each sample to one rank. ``loader.samples_per_rank`` is
    this rank's own count.
    """

    def __init__(self, loader: LoaderBase) -> None:
        self.loader = loader

    def set_epoch(self, epoch: int) -> None:
        """The loader's :meth:`~loaders.base.LoaderBase.set_epoch`."""
        self.loader.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the next pass over the loader will be."""
        return self.loader.next_epoch

    def __len__(self) -> int:
        return self.loader.dealt_per_rank()

    def __repr__(self) -> str:
        return f"EpochSampler({len(self)} samples per rank, epoch {self.epoch})"


class SourceInfo:
    """What scripts read from a DataLoader's dataset, from ``self.index``: ``len()`` (the
    source's samples, over all ranks), ``classes`` and ``class_to_idx`` (ImageFolder's: the
    class folders, sorted; shards: the labels as text, "0", "1", …)."""

    index: SampleIndex

    def __len__(self) -> int:
        return len(self.index)

    @property
    def classes(self) -> list[str]:
        return list(self.index.classes)

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.index.classes)}


class SourceView(SourceInfo):
    """``loader.dataset`` where the backend has no dataset object of its own (dali)."""

    def __init__(self, index: SampleIndex) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"SourceView({self.index.kind} of {len(self)} samples, {len(self.classes)} classes)"
