"""The loaders' public API: :func:`build_loader` and what it needs. ``import loaders`` loads
this module on the first use of one of its names (see :mod:`loaders`); import it from there."""

from __future__ import annotations

import os

import torch

from loaders.base import LoaderBase, resolve_device, start_workers
from loaders.data import SampleIndex, Skipped, open_index
from loaders.dist import DistInfo, default_workers, discover, shard_indices
from loaders.errors import LoaderError, MissingDependencyError
from loaders.index_once import obtain
from loaders.option_values import check_values
from loaders.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    TransformSpec,
    denormalize,
    resolve_dtype,
)

BACKENDS = ("torch", "dali", "wds")

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


CODE_OPTIONS = ("batch_transform", "dali_augment")  # take the caller's functions, not values


def backend_options(backend: str, *, values_only: bool = False) -> dict[str, object]:
    """The per-backend options ``build_loader`` takes for ``backend``, with their defaults;
    ``values_only``: without those that take a function (what a command line can set)."""
    import inspect

    if backend == AUTO:  # options belong to the backend it picks: pick that one to set them
        return {}
    skip = {"self", "index", "info", "batch_size", "workers"}
    if values_only:
        skip |= set(CODE_OPTIONS)
    return {
        name: p.default
        for name, p in inspect.signature(_backend_class(backend).__init__).parameters.items()
        if name not in skip and p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def _backend_class(backend: str) -> type[LoaderBase]:
    """The backend's loader class, imported only when asked for (DALI and WebDataset are
    optional)."""
    if backend == "torch":
        from loaders.torch_backend import TorchLoader

        return TorchLoader
    if backend == "wds":
        from loaders.wds_backend import WdsLoader

        return WdsLoader
    if backend == "dali":
        from loaders.dali_backend import DaliLoader

        return DaliLoader
    raise ValueError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")


def high_priority_stream(device: str | torch.device | None = None) -> torch.cuda.Stream | None:
    """A new CUDA stream at the device's highest priority (None without CUDA).

    Train on it when a GPU loader shares the GPU with training: DALI runs its kernels on its own
    streams at the default (lowest) priority, so the GPU's scheduler then serves training's
    kernels first. Whether it helps depends on the training step: with DDP's default per-step
    buffer broadcast it did, with ``broadcast_buffers=False`` the default stream did better;
    measure both (``feedbench verify --stream-priority high``; BENCHMARKS.md, "verify")::

        stream = loaders.high_priority_stream()
        with torch.cuda.stream(stream):
            for images, labels in loader:
                ...  # forward, backward, step: all on the high-priority stream
    """
    if not torch.cuda.is_available():
        return None
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else device
    _, highest = torch.cuda.Stream.priority_range()
    return torch.cuda.Stream(device=dev, priority=highest)


def check_options(backend: str, options: dict) -> None:
    """ValueError naming the backends, the options the backend takes, or what an option's
    value must be; nothing is built or listed (a command line checks its options with it)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    known = backend_options(backend) if options else {}
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(
            f"the {backend} backend takes no option {unknown[0]!r} "
            f"(its options: {', '.join(sorted(known)) or 'none'})"
        )
    check_values(options)


AUTO = "auto"
# Cores per rank from which ``backend="auto"`` decodes on the CPU, sized from the measured
# rates: ResNet-50 on an H200 asks ~4,500 img/s at 256 per GPU, a core decodes and crops ~270
# JPEGs/s (simplejpeg), 2 cores stay the training process's (``reserve_cores``). With 16, torch
# reached 0.97-0.99 of the ceiling with 14-15 cores busy, wds 0.98 twice and 0.85 once (stalls),
# DALI 0.97 (BENCHMARKS.md, run 14): 24 leaves room for the workers' stalls. DALI decides itself
# where it decodes (``decode="auto"``: on its CPU threads at 64 per GPU, and at 256 with ≥ 12).
AUTO_CPU_CORES = 24


def choose_backend(index: SampleIndex, device: torch.device, cores: int) -> tuple[str, str]:
    """``backend="auto"``: (the backend, why) for this source, device and this rank's share of
    the cores. The CPU loader is wds for shards (streamed) and torch for trees."""
    cpu = "wds" if index.kind == "shards" else "torch"
    if device.type != "cuda":
        return cpu, f"{cpu}: no GPU to decode on"
    if index.remote:
        return cpu, f"{cpu}: DALI reads local files only"
    if cores >= AUTO_CPU_CORES:
        return cpu, f"{cpu}: {cores} cores for this rank (≥ {AUTO_CPU_CORES}) decode on the CPU"
    if not _has_dali():
        return cpu, f"{cpu}: {cores} cores for this rank, but DALI is not installed"
    why = f"{cores} cores for this rank (< {AUTO_CPU_CORES}): DALI picks where to decode"
    return "dali", f"dali: {why}"


def _has_dali() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except (ImportError, ValueError):
        return False


def build_loader(
    source: str | os.PathLike[str] | SampleIndex,
    backend: str = "torch",
    batch_size: int = 256,
    *,
    train: bool = True,
    image_size: int = 224,
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    seed: int = 0,
    workers: int | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype = "float32",
    channels_last: bool = False,
    drop_last: bool = False,
    even_batches: bool = False,
    return_keys: bool = False,
    source_format: str = "auto",
    crop_scale: tuple[float, float] = (0.08, 1.0),
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3),
    flip: bool = True,
    mean: tuple[float, float, float] = IMAGENET_MEAN,
    std: tuple[float, float, float] = IMAGENET_STD,
    resize_size: int | None = None,
    index: str | os.PathLike[str] | None = None,
    **options,
) -> LoaderBase:
    """A loader over ``source`` for this rank. See the module docstring; per backend options:

    * all: ``prefetch`` (batches per worker, torch/wds; pipeline depth, dali),
    * torch, wds: ``decoder`` (``"auto"`` = simplejpeg, ``"simplejpeg-fast"``, ``"pil"``,
      ``"opencv"``),
      ``multiprocessing_context``, ``worker_nice`` (how many steps of niceness below this
      process the workers run, 0–19; 10 by default, so the training process's own thread is
      never kept waiting by a decoder), ``batch_transform`` (your callable on each uint8 N×3×H×W
      batch, on the output device, before the normalisation; ``normalize=False`` yields its
      output, or the uint8 batch, as it is: :class:`loaders.transforms.BatchOutput`),
    * torch, wds: ``slots`` (workers decode into batch slots of one buffer page-locked once,
      copied to the GPU from there: no pin thread, no new shared memory per batch; on by default
      where batches go to a GPU, ``False`` for DataLoader's pin thread; :mod:`loaders.slots`),
    * dali, wds: ``shuffle_buffer`` (samples; split among the workers for wds; dali: shards only,
      training on a tree takes torch's order),
    * dali: ``hw_decoder_load`` (share of JPEGs for the GPU's hardware decoder; 0.99),
      ``dont_use_mmap`` (plain reads instead of mapping files; default: plain reads for image
      trees, mapping for shards), ``pace`` (GPU: before each batch the host waits for the
      caller's stream, so training does not run ahead of DALI's GPU work; 1 by default; k lets
      the host be k - 1 steps ahead; 0 never waits), ``pace_lead_ms`` (with ``pace=1``: let
      the host go on this long before the previous step is due to end, at most a tenth of a
      step; 5 by default, 0 waits for the end: :mod:`loaders.pacing`), ``decode`` (auto, gpu
      or cpu; auto: on the CPU at ≤ 64 a batch, and above with ≥ 12 threads, else on the GPU),
      ``resize`` (auto: on the GPU where auto decodes a larger batch on the CPU, else where the
      decode runs; gpu: a CPU decode's crops resized on the GPU, half the CPU's work),
      ``dali_augment`` (your function of DALI DataNodes, called inside the pipeline definition
      on the uint8 HWC images at the output size, before flip and normalisation:
      :meth:`loaders.dali_backend.DaliLoader._augment`).

    An option the backend does not take is a ``ValueError`` naming the ones it does
    (:func:`backend_options`). ``backend="auto"`` picks one by :func:`choose_backend`'s rule
    (CPU decode with ≥ ``AUTO_CPU_CORES`` cores per rank, else DALI where it can run) and says
    which and why in ``loader.chosen_by``; options are checked against the backend it picks.

    ``source``: a folder, a ``.tar``, a brace list or glob of shards, a list of shard paths, a
    :class:`SampleIndex`, or the same at an ``s3://`` or ``http(s)://`` URL (torch: trees and
    shards, one GET per sample; wds: shards, streamed; dali: local files only). Remote shards
    are listed by streaming each one once: for many ranks, :func:`open_index` once and pass
    the index.

    Listing happens once per machine: with several ranks on it (torchrun), local rank 0 lists
    and the others load its index (:mod:`loaders.index_once`). ``index=PATH`` keeps the listing
    for later jobs, like DALI's ``file_list``: a file there holding this source's index (same
    path or URL and ``source_format``) is used instead of listing; no file there: the source is
    listed and its index written there (atomically), then reused on the next run. A file that
    is not an index, or is the index of another source, is a :class:`LoaderError`; delete it to
    list again (a tree that changed is not noticed: the index says what was there).

    ``workers`` is DataLoader worker processes (torch, wds) or DALI CPU threads; by default this
    rank's share of the cores. ``rank`` / ``world_size`` / ``local_rank`` come from the arguments,
    else torchrun's environment, else torch.distributed (:func:`loaders.dist.discover`).
    ``return_keys=True`` yields ``(images, labels, keys)``; keys are sample indices into
    ``loader.index``.

    Transforms, the same on every backend (:class:`loaders.transforms.TransformSpec`): training
    crops ``crop_scale`` of the area at aspect ratios ``crop_ratio`` and flips if ``flip``;
    evaluation resizes the shorter side to ``resize_size`` (default ``image_size / 0.875``) and
    center crops ``image_size``; both normalise with ``mean`` / ``std`` (RGB, on 0…1 pixels) to
    ``dtype``.

    ``train=False`` is exact evaluation: every sample once over all ranks, no padding, no shuffle,
    resize and center crop; lengths may then differ between ranks by a sample (wds: by what their
    whole shards hold), which is safe without a collective per step (see :mod:`loaders.base`);
    a rank may have no batches (fewer samples than ranks). ``even_batches=True`` (with
    ``train=False``) makes every rank yield the same number of batches of the same sizes, for an
    evaluation loop with a collective per step (Accelerate's ``gather_for_metrics``): padded with
    repeats, each batch then ends with ``valid``, a bool tensor that is False on the repeats
    (docs/eval-and-small-data.md).
    Resumption: :meth:`LoaderBase.state_dict` (torch: also on another world size midway through
    an epoch; wds and dali: on the same world size, or from an epoch's start).
    """
    if backend != AUTO:
        check_options(backend, options)  # before listing the source: a typo fails at once
    info = discover(rank, world_size, local_rank)
    index = obtain(source, source_format, info, path=index)  # (the argument: a file's path)
    chosen = None
    if backend == AUTO:
        device = resolve_device(device, info.local_rank)
        cores = default_workers(info.local_world_size)  # this rank's share of the cores
        backend, chosen = choose_backend(index, device, cores)
        check_options(backend, options)
    common = dict(
        train=train,
        image_size=image_size,
        seed=seed,
        device=resolve_device(device, info.local_rank),
        dtype=resolve_dtype(dtype),
        channels_last=channels_last,
        drop_last=drop_last,
        even_batches=even_batches,
        return_keys=return_keys,
        transform=TransformSpec(crop_scale, crop_ratio, flip, mean, std, resize_size),
    )
    if workers is None:
        workers = default_workers(info.local_world_size)
    if workers < 0:
        raise ValueError(f"workers must be ≥ 0, got {workers}")
    cls = _backend_class(backend)
    loader = cls(index, info, batch_size, workers=workers, **options, **common)
    loader.chosen_by = chosen  # backend="auto": which backend and why; else None
    return loader
