"""The loaders ``feedbench verify`` trains with, behind one small interface.

Every loader here is an iterable of ``(images, labels)`` already on the training device, with
``len()`` equal on every rank (batches per epoch) and ``set_epoch(e)``:

* ``synthetic``: one random batch made once on the device and yielded again and again; the
  compute + communication ceiling (no data work at all).
* ``baseline``: the stock PyTorch recipe, as in PyTorch's ImageNet example: torchvision
  ``ImageFolder`` (PIL decode) with ``RandomResizedCrop`` + flip + ``ToTensor`` + ``Normalize`` in
  the workers, ``DistributedSampler``, ``DataLoader(pin_memory=True)``, and the copy
  ``images.cuda(non_blocking=True)`` on the training stream. Persistent workers, so a small
  dataset's frequent epoch ends do not restart every worker.
* ``dali-example``: NVIDIA DALI wired as in DALI's own PyTorch ResNet-50 example
  (``docs/examples/use_cases/pytorch/resnet50``): file reader sharded by rank, ``mixed`` (GPU) JPEG
  decode with random crop, GPU resize, crop-mirror-normalize to float CHW, 4 CPU threads by
  default. GPU only. Full batches only (``LastBatchPolicy.DROP``), like the baseline.
* ``torch``, ``dali``, ``wds``: :func:`loaders.build_loader` (imported lazily: an unavailable
  backend is a :class:`~feedbench.core.errors.FeedbenchError` that says what to install).
* the user's own, ``FILE.py:FUNCTION`` or ``MODULE:FUNCTION``: a factory called as ``feedbench
  scan --loader`` calls it (:mod:`feedbench.scan.factory`), its batches made ``(images, labels)``
  on the device (:class:`UserLoader`).
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
from collections.abc import Iterator
from typing import Any

from feedbench.core.choices import option_value
from feedbench.core.errors import FeedbenchError
from feedbench.scan import factory
from feedbench.scan.config import check_library_values
from feedbench.scan.factory import STANDARD, UserLoaderError

SYNTHETIC = "synthetic"
BASELINE = "baseline"
DALI_EXAMPLE = "dali-example"
LIBRARY = ("torch", "dali", "wds", "auto")  # auto: build_loader picks one (not a default run)
LOADERS = (SYNTHETIC, BASELINE, DALI_EXAMPLE, *LIBRARY)
GPU_ONLY = (DALI_EXAMPLE,)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


_NO_DALI = "it needs NVIDIA DALI: pip install 'feedbench[dali]'"
_CHOOSE = f"choose from {', '.join(LOADERS)}, or give FILE.py:FUNCTION or MODULE:FUNCTION"


def is_user(name: str) -> bool:
    """A user's factory (``FILE.py:FUNCTION``, ``MODULE:FUNCTION``) rather than one of ours."""
    return ":" in name and name not in LOADERS


def parse_loaders(text: str) -> tuple[str, ...]:
    """``--loader`` → names: ours lower-cased, the user's factories as written (paths keep their
    case); the first occurrence kept."""
    items = [x.strip() for x in str(text).split(",")]
    if not text.strip() or any(not x for x in items):
        raise FeedbenchError(f"--loader takes a comma-separated list like baseline,torch "
                             f"(got {text!r})")  # fmt: skip
    return tuple(dict.fromkeys(x if is_user(x) else x.lower() for x in items))


def file_label(name: str) -> str:
    """``name`` fit for a file name: a factory's spec without its folders, ``:`` as ``-``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name.rsplit("/", 1)[-1].rsplit(os.sep, 1)[-1])


def _has_dali() -> bool:
    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except (ImportError, ValueError):
        return False


def unavailable(name: str) -> str | None:
    """Why loader ``name`` cannot run here (what to install), or None when it can."""
    if is_user(name):
        return None  # its code is checked where it is resolved
    if name not in LOADERS:
        raise FeedbenchError(f"unknown loader {name!r}: {_CHOOSE}")
    if name in (SYNTHETIC, BASELINE):
        return None
    if name == DALI_EXAMPLE:
        return None if _has_dali() else _NO_DALI
    if name == "dali" and not _has_dali():
        return _NO_DALI
    if name == "wds" and importlib.util.find_spec("webdataset") is None:
        return "it needs webdataset: pip install webdataset"
    return None


class VerifyLoader:
    """What the training loop sees: iterate, ``len()``, ``set_epoch``, ``close``."""

    name = "base"
    workers: int | None = None
    settings: str | None = None  # the library loader's: where it decodes, workers, cores

    def __len__(self) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def __iter__(self) -> Iterator[tuple[Any, Any]]:  # pragma: no cover - interface
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        pass

    def skipped(self) -> list:
        """The samples it left out while loading (``loaders.Skipped``: path, reason); none known
        for loaders that keep no such list."""
        return []

    def worker_times(self) -> Any:
        """Its workers' running totals (a ``workers × 3`` array: batches, seconds making them,
        seconds of those waiting for a batch slot; :mod:`loaders.worker_clock`), or None."""
        return None

    def close(self) -> None:
        pass


class SyntheticLoader(VerifyLoader):
    """One random batch on the device, made once (the data is "already on the GPU")."""

    name = SYNTHETIC

    def __init__(
        self, batch_size: int, image_size: int, num_classes: int, device, dtype,
        channels_last: bool, batches_per_epoch: int, seed: int = 0,
    ) -> None:  # fmt: skip
        import torch

        g = torch.Generator(device="cpu").manual_seed(seed)
        images = torch.randn(batch_size, 3, image_size, image_size, generator=g)
        labels = torch.randint(0, num_classes, (batch_size,), generator=g)
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        self.images = images.to(device=device, dtype=dtype).contiguous(memory_format=fmt)
        self.labels = labels.to(device)
        self.batches = max(1, batches_per_epoch)

    def __len__(self) -> int:
        return self.batches

    def __iter__(self):
        for _ in range(self.batches):
            yield self.images, self.labels


class StockLoader(VerifyLoader):
    """The stock DataLoader recipe (see the module docstring): the baseline to beat."""

    name = BASELINE

    def __init__(
        self, root: str, batch_size: int, *, rank: int, world_size: int, image_size: int,
        workers: int, seed: int, device, train: bool = True,
    ) -> None:  # fmt: skip
        import torch
        from torch.utils.data import DataLoader
        from torch.utils.data.distributed import DistributedSampler
        from torchvision import datasets, transforms

        if train:
            tf = [transforms.RandomResizedCrop(image_size), transforms.RandomHorizontalFlip()]
        else:
            tf = [transforms.Resize(int(image_size * 256 / 224)), transforms.CenterCrop(image_size)]
        tf += [transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
        try:
            self.dataset = datasets.ImageFolder(root, transforms.Compose(tf))
        except (FileNotFoundError, OSError) as e:
            raise FeedbenchError(f"baseline: {root} is not an image tree (ImageFolder): {e}") from e
        self.sampler = DistributedSampler(
            self.dataset, num_replicas=world_size, rank=rank, shuffle=train, seed=seed
        )
        self.device = device
        self.cuda = torch.device(device).type == "cuda"
        self.workers = workers
        self.loader = DataLoader(
            self.dataset,
            batch_size=batch_size,
            sampler=self.sampler,
            num_workers=workers,
            pin_memory=self.cuda,
            drop_last=True,  # every batch full: ranks stay equal, steps comparable
            persistent_workers=workers > 0,
        )

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self):
        for images, labels in self.loader:
            # as in the ImageNet example: the copy is queued on the training stream
            yield (
                images.to(self.device, non_blocking=True),
                labels.to(self.device, non_blocking=True),
            )

    def close(self) -> None:
        it = getattr(self.loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self.loader._iterator = None


def stock_loader(
    path: str, batch_size: int, rank: int, world_size: int, local_rank: int, workers: int,
    seed: int, epoch: int = 0, image_size: int = 224,
) -> StockLoader:  # fmt: skip
    """verify's ``baseline`` as a ``feedbench scan --loader`` factory
    (``--loader feedbench.verify.loaders:stock_loader``): the same recipe, batches on this
    consumer's GPU (or CPU), so that scan's prediction for it can be set beside verify's run."""
    import torch

    device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    loader = StockLoader(
        path, batch_size, rank=rank, world_size=world_size, image_size=image_size,
        workers=workers, seed=seed, device=device,
    )  # fmt: skip
    loader.set_epoch(epoch)
    return loader


class DaliExampleLoader(VerifyLoader):
    """DALI as wired in DALI's PyTorch ResNet-50 example (see the module docstring)."""

    name = DALI_EXAMPLE

    def __init__(
        self, root: str, batch_size: int, *, rank: int, world_size: int, local_rank: int,
        image_size: int, workers: int, seed: int,
    ) -> None:  # fmt: skip
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types
        from nvidia.dali.pipeline import pipeline_def
        from nvidia.dali.plugin.pytorch import DALIClassificationIterator, LastBatchPolicy

        @pipeline_def
        def pipeline():
            images, labels = fn.readers.file(
                file_root=root,
                shard_id=rank,  # the example passes the local rank: the same on one node
                num_shards=world_size,
                random_shuffle=True,
                pad_last_batch=True,
                name="Reader",
            )
            images = fn.decoders.image_random_crop(
                images,
                device="mixed",
                output_type=types.RGB,
                device_memory_padding=211025920,
                host_memory_padding=140544512,
                random_aspect_ratio=[0.8, 1.25],
                random_area=[0.1, 1.0],
                num_attempts=100,
            )
            images = fn.resize(
                images,
                device="gpu",
                resize_x=image_size,
                resize_y=image_size,
                interp_type=types.INTERP_TRIANGULAR,
            )
            images = fn.crop_mirror_normalize(
                images.gpu(),
                dtype=types.FLOAT,
                output_layout="CHW",
                crop=(image_size, image_size),
                mean=[m * 255 for m in IMAGENET_MEAN],
                std=[s * 255 for s in IMAGENET_STD],
                mirror=fn.random.coin_flip(probability=0.5),
            )
            return images, labels.gpu()

        self.workers = workers
        pipe = pipeline(
            batch_size=batch_size, num_threads=workers, device_id=local_rank, seed=12 + seed + rank
        )
        pipe.build()
        self.iterator = DALIClassificationIterator(
            pipe, reader_name="Reader", last_batch_policy=LastBatchPolicy.DROP, auto_reset=True
        )

    def __len__(self) -> int:
        return len(self.iterator)

    def __iter__(self):
        for data in self.iterator:
            yield data[0]["data"], data[0]["label"].squeeze(-1).long()


class LibraryLoader(VerifyLoader):
    """:func:`loaders.build_loader` for backend ``torch``, ``dali`` or ``wds``."""

    def __init__(self, name: str, inner: Any, workers: int | None) -> None:
        self.name = name
        self.inner = inner
        self.workers = workers
        self.settings = inner.settings() if hasattr(inner, "settings") else None
        self.listed_skips = len(inner.skipped)  # left out by the listing, before any decode

    def __len__(self) -> int:
        return len(self.inner)

    def skipped(self) -> list:
        return self.inner.skipped_since(self.listed_skips)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.inner, "set_epoch"):
            self.inner.set_epoch(epoch)

    def __iter__(self):
        for batch in self.inner:
            yield batch[0], batch[1]

    def worker_times(self) -> Any:
        clock = getattr(self.inner, "clock", None)
        return clock.snapshot() if clock is not None else None

    def close(self) -> None:
        if hasattr(self.inner, "close"):
            self.inner.close()


class UserLoader(VerifyLoader):
    """The user's factory (``FILE.py:FUNCTION`` or ``MODULE:FUNCTION``), called with the keywords
    it takes, as ``feedbench scan --loader`` calls it, plus its options; made anew per epoch when
    it returns a one-shot iterator (a generator), else moved by its ``set_epoch`` (or its
    sampler's or dataset's). Each batch becomes ``(images, labels)`` on the device
    (:meth:`adapt`); ``synthesised`` tells whether labels had to be made up, ``image_hw`` the
    images' size."""

    def __init__(
        self, spec: str, source: str, batch_size: int, *, rank: int, world_size: int,
        local_rank: int, workers: int, seed: int, device, num_classes: int,
        options: dict | None = None,
    ) -> None:  # fmt: skip
        import torch

        self.name, self.workers = spec, workers
        self.f = factory.resolve(spec)
        self.options = options or {}
        self.standard = dict(rank=rank, world_size=world_size, local_rank=local_rank,
                             batch_size=batch_size, workers=workers, seed=seed, epoch=0,
                             path=source)  # fmt: skip
        self.device, self.num_classes = device, num_classes
        self.labels = torch.Generator().manual_seed(seed + rank)
        self.synthesised = False
        self.image_hw: tuple[int, int] | None = None  # of the first batch
        self.used = False
        self.loader = self._make(0)

    def _make(self, epoch: int) -> Any:
        kwargs = factory.call_kwargs(self.f, self.standard | {"epoch": epoch}, self.options)
        return factory.make(self.f, kwargs)

    def __len__(self) -> int:
        """Batches per epoch, where the loader knows (TypeError otherwise, as ``len()``)."""
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        if self.used and isinstance(self.loader, Iterator):
            self.loader = self._make(epoch)
            return
        owner = factory.epoch_owner(self.loader)
        if owner is not None:
            self._guarded(lambda: owner.set_epoch(epoch), "set_epoch")

    def __iter__(self):
        self.used = True
        it = self._guarded(lambda: iter(self.loader), "iter()")
        end = object()
        while (batch := self._guarded(lambda: next(it, end), "next()")) is not end:
            yield self.adapt(batch)

    def adapt(self, batch: Any) -> tuple[Any, Any]:
        """``(images, labels)``, ``[images, labels, ...]`` or images alone (labels made up, at
        random over the classes) → float images N×3×H×W (integers scaled to [0, 1]) and class
        indices below ``num_classes``, on the device."""
        import torch

        images, labels = _split(batch, self.name)
        if not (isinstance(images, torch.Tensor) and images.dim() == 4 and images.shape[1] == 3):
            shape = tuple(images.shape) if isinstance(images, torch.Tensor) else None
            raise UserLoaderError(
                f"the loader {self.name} yields images of {_what(images, shape)}: verify trains "
                "on N×3×H×W tensors"
            )
        n = images.shape[0]
        self.image_hw = self.image_hw or (int(images.shape[2]), int(images.shape[3]))
        if labels is None:
            labels = torch.randint(0, self.num_classes, (n,), generator=self.labels)
            self.synthesised = True
        labels = torch.as_tensor(labels)
        if labels.shape[:1] != (n,):
            raise UserLoaderError(
                f"the loader {self.name} yields {n} images with labels of shape "
                f"{tuple(labels.shape)}: give one class index per image"
            )
        images = images.to(self.device, non_blocking=True)
        if not images.is_floating_point():
            images = images.float().div_(255)
        return images, labels.to(self.device, non_blocking=True).long() % self.num_classes

    def _guarded(self, call, what: str) -> Any:
        try:
            return call()
        except Exception as e:
            raise factory.user_error(e, self.f.root, f"the loader {self.name} ({what})") from None


def _split(batch: Any, name: str) -> tuple[Any, Any]:
    """A batch's images and labels (None: images alone)."""
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[0], batch[1]
    if isinstance(batch, (tuple, list)) and len(batch) == 1:
        return batch[0], None
    if getattr(batch, "shape", None) is not None:
        return batch, None
    raise UserLoaderError(
        f"the loader {name} yields {type(batch).__name__} batches: verify trains on "
        "(images, labels) or on images alone"
    )


def _what(images: Any, shape: tuple | None) -> str:
    return f"shape {shape}" if shape is not None else f"type {type(images).__name__}"


def loader_options(items: tuple[str, ...] | list[str], names: list[str]) -> dict[str, dict]:
    """``--loader-option`` values (``[LOADER:]KEY=VALUE``) → options per library loader or user
    factory in ``names``. Without ``LOADER:`` an option goes to every loader of the run that
    takes it (a factory: a keyword it names, any with ``**kwargs``, never one feedbench passes
    itself); an option no loader of the run takes is an error, as is one its named loader does
    not take, or a keyword a factory needs that no option gives."""
    run = [n for n in names if n in LIBRARY or is_user(n)]
    known = {n: _option_keys(n) for n in run}
    out: dict[str, dict] = {n: {} for n in run}
    for item in items:
        key, targets, value = _option_targets(item, known)
        takers = [n for n in targets if _takes(known[n], key)]
        if not takers:
            offered = sorted({k for n in targets for k in known[n] or ()})
            raise FeedbenchError(
                f"--loader-option {item!r}: no loader of this run takes {key!r} "
                f"(they take: {', '.join(offered) or 'nothing'})"
            )
        for n in takers:
            out[n][key] = option_value(value)
    for n in run:
        if is_user(n):
            factory.check_options(factory.resolve(n), out[n])
        elif n != "auto":  # auto's options belong to the backend it picks (none can be set)
            check_library_values(n, out[n])
    return {n: o for n, o in out.items() if o}


def _option_targets(item: str, known: dict[str, Any]) -> tuple[str, list[str], str]:
    """One ``[LOADER:]KEY=VALUE`` → (key, the loaders it may go to, value)."""
    head, eq, value = item.partition("=")
    loader, colon, key = head.partition(":")
    if not colon:
        loader, key = "", head
    key = key.strip().replace("-", "_")
    if not eq or not key:
        raise FeedbenchError(f"--loader-option takes [LOADER:]KEY=VALUE (got {item!r})")
    loader = loader.strip().lower()
    if not loader:
        return key, list(known), value
    if loader not in LIBRARY:
        raise FeedbenchError(
            f"--loader-option {item!r}: options go to the library loaders "
            f"({', '.join(LIBRARY)}) or, without LOADER:, to your factory; not {loader!r}"
        )
    if loader not in known:
        raise FeedbenchError(f"--loader-option {item!r}: loader {loader} is not in this run")
    return key, [loader], value


def _option_keys(name: str) -> tuple[str, ...] | None:
    """The option keys loader ``name`` takes; None: any (a factory with ``**kwargs``)."""
    if not is_user(name):
        from loaders import backend_options

        return tuple(backend_options(name, values_only=True))
    f = factory.resolve(name)
    return None if f.accepts_all else tuple(k for k in f.params if k not in STANDARD)


def _takes(keys: tuple[str, ...] | None, key: str) -> bool:
    return key not in STANDARD if keys is None else key in keys


def build_library_loader(
    name: str, source: str, batch_size: int, *, rank: int, world_size: int, local_rank: int,
    image_size: int, workers: int | None, seed: int, device, dtype, channels_last: bool,
    options: dict | None = None,
) -> LibraryLoader:  # fmt: skip
    why = unavailable(name)
    if why:
        raise FeedbenchError(f"loader {name} is unavailable: {why}")
    from loaders import LoaderError, build_loader

    try:
        inner = build_loader(
            source, name, batch_size, train=True, image_size=image_size, rank=rank,
            world_size=world_size, local_rank=local_rank, seed=seed, workers=workers,
            device=device, drop_last=True, dtype=dtype, channels_last=channels_last,
            **(options or {}),
        )  # fmt: skip
    except (LoaderError, ImportError, ValueError, OSError) as e:  # one line for users
        raise FeedbenchError(f"loader {name}: {e}") from e
    return LibraryLoader(name, inner, getattr(inner, "workers", workers))


def make_loader(
    name: str, source: str, batch_size: int, *, rank: int, world_size: int, local_rank: int,
    image_size: int, workers: int | None, seed: int, device, num_classes: int,
    dtype=None, channels_last: bool = False, synthetic_batches: int = 100,
    options: dict | None = None,
) -> VerifyLoader:  # fmt: skip
    """The loader ``name`` for this rank; see the module docstring."""
    import torch

    dtype = dtype or torch.float32
    if name == SYNTHETIC:
        return SyntheticLoader(
            batch_size, image_size, num_classes, device, dtype, channels_last, synthetic_batches,
            seed=seed + rank,
        )  # fmt: skip
    if name == BASELINE:
        from loaders.dist import default_workers

        w = workers if workers is not None else default_workers(_local_world(world_size), reserve=2)
        return StockLoader(
            source, batch_size, rank=rank, world_size=world_size, image_size=image_size,
            workers=w, seed=seed, device=device,
        )  # fmt: skip
    if name == DALI_EXAMPLE:
        why = unavailable(name)
        if why:
            raise FeedbenchError(f"loader {name} is unavailable: {why}")
        if torch.device(device).type != "cuda":
            raise FeedbenchError(f"{name} is DALI's GPU pipeline: it needs a GPU")
        return DaliExampleLoader(
            source, batch_size, rank=rank, world_size=world_size, local_rank=local_rank,
            image_size=image_size, workers=workers if workers is not None else 4, seed=seed,
        )  # fmt: skip
    if is_user(name):
        from loaders.dist import default_workers

        w = workers if workers is not None else default_workers(_local_world(world_size), reserve=2)
        return UserLoader(
            name, source, batch_size, rank=rank, world_size=world_size, local_rank=local_rank,
            workers=w, seed=seed, device=device, num_classes=num_classes, options=options,
        )  # fmt: skip
    if name in LIBRARY:
        return build_library_loader(
            name, source, batch_size, rank=rank, world_size=world_size, local_rank=local_rank,
            image_size=image_size, workers=workers, seed=seed, device=device, dtype=dtype,
            channels_last=channels_last, options=options,
        )  # fmt: skip
    raise FeedbenchError(f"unknown loader {name!r}: {_CHOOSE}")


def batches_per_epoch(samples: int, world_size: int, batch_size: int) -> int:
    """DistributedSampler padding, then whole batches only (``drop_last``)."""
    return math.ceil(samples / world_size) // batch_size


def _local_world(world_size: int) -> int:
    try:
        return int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    except ValueError:
        return world_size
