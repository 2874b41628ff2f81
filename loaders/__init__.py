"""Drop-in training loaders that keep DDP fed. Never imports feedbench.

``build_loader(source, backend, batch_size, ...)`` returns an iterable of ``(images, labels)``:
images ``B×3×H×W`` normalised (ImageNet mean/std) on this rank's GPU when there is one, else on the
CPU; in training the same ``len()`` on every rank and a new order every epoch (``set_epoch``, or
automatically after a completed pass: a peek uses up no epoch); with ``train=False`` every sample
exactly once over the ranks (exact evaluation). What scripts read from a DataLoader is there too:
``loader.sampler.set_epoch``, ``len(loader.dataset)``, ``dataset.classes``, … (docs/dropin.md).
``loader.state_dict()`` / ``load_state_dict()`` resume an epoch midway. Sources: a local image
tree or shards, or (torch, wds) an ``s3://`` or ``http(s)://`` URL (:mod:`loaders.data.remote`).
Backends: ``"torch"`` (tuned DataLoader, :mod:`loaders.torch_backend`), ``"dali"`` (NVIDIA DALI,
:mod:`loaders.dali_backend`) and ``"wds"`` (WebDataset, :mod:`loaders.wds_backend`). The length and
padding rule shared by all three is in :mod:`loaders.base`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "AUTO",
    "AUTO_CPU_CORES",
    "BACKENDS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "DistInfo",
    "LoaderBase",
    "LoaderError",
    "MissingDependencyError",
    "SampleIndex",
    "Skipped",
    "TransformSpec",
    "backend_options",
    "build_loader",
    "check_options",
    "choose_backend",
    "denormalize",
    "default_workers",
    "high_priority_stream",
    "discover",
    "open_index",
    "shard_indices",
    "start_workers",
]

if TYPE_CHECKING:
    from loaders.api import (
        AUTO,
        AUTO_CPU_CORES,
        BACKENDS,
        IMAGENET_MEAN,
        IMAGENET_STD,
        DistInfo,
        LoaderBase,
        LoaderError,
        MissingDependencyError,
        SampleIndex,
        Skipped,
        TransformSpec,
        backend_options,
        build_loader,
        check_options,
        choose_backend,
        default_workers,
        denormalize,
        discover,
        high_priority_stream,
        open_index,
        shard_indices,
        start_workers,
    )


def __getattr__(name: str) -> Any:
    """The API's names load on first use (PEP 562): its module imports torch, 2-3 s, which the
    parts that need none (``loaders.data``: listing, reading, URLs) and the command lines built
    on them should not pay."""
    if name.startswith("__"):
        raise AttributeError(name)
    api = importlib.import_module("loaders.api")
    try:
        return getattr(api, name)
    except AttributeError:
        raise AttributeError(f"module 'loaders' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
