"""The transform options every backend takes, the normalisation every backend ends with, and
(torch, wds) a user's callable on uint8 batches before it (:class:`BatchOutput`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
EVAL_CROP_FRACTION = 0.875  # eval: resize to size / 0.875 (256 for 224), then center crop size
DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


@dataclass(frozen=True)
class TransformSpec:
    """The common pipelines' options, the same on every backend.

    Training: RandomResizedCrop of ``scale`` (share of the area) and ``ratio`` (width / height)
    to the output size, then a random horizontal flip if ``flip``. Evaluation: resize the
    shorter side to ``resize_size`` (default ``image_size / 0.875``, 256 for 224) and center
    crop the output size. Both end with ``(x − mean) / std`` (``mean``/``std`` per RGB channel
    on 0…1 pixels, ImageNet's by default).
    """

    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    flip: bool = True
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    resize_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("scale", "ratio", "mean", "std"):
            object.__setattr__(self, name, tuple(float(v) for v in getattr(self, name)))
        if len(self.scale) != 2 or not 0 < self.scale[0] <= self.scale[1] <= 1:
            raise ValueError(f"crop_scale takes (low, high), 0 < low ≤ high ≤ 1, not {self.scale}")
        if len(self.ratio) != 2 or not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"crop_ratio takes (low, high), 0 < low ≤ high, not {self.ratio}")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError(
                f"mean and std take 3 values (R, G, B; std > 0), got {self.mean} and {self.std}"
            )

    def eval_resize(self, size: int) -> int:
        """The shorter side before the center crop of ``size``."""
        resize = round(size / EVAL_CROP_FRACTION) if self.resize_size is None else self.resize_size
        if resize < size:
            raise ValueError(f"resize_size {resize} is smaller than the output size {size}")
        return int(resize)


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"unsupported dtype {dtype}: choose float32, float16 or bfloat16")
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}: choose {', '.join(DTYPES)}")
    return DTYPES[dtype]


class Normalize:
    """uint8 N×H×W×3 → normalised N×3×H×W of ``dtype`` (channels_last in memory if asked).

    One kernel: ``x · (1 / 255σ) + (−μ / σ)`` with the constants in float32, rounded once to
    ``dtype``. A step's host launches are what a small batch is short of (issue 29): three
    kernels (convert, subtract, multiply) cost three launches and two extra rounding steps.
    """

    def __init__(
        self,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
        channels_last: bool = False,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
    ) -> None:
        self.dtype = dtype
        self.channels_last = channels_last
        scale = [1.0 / (s * 255.0) for s in std]
        self.scale = torch.tensor(scale, device=device).view(1, 3, 1, 1)
        self.bias = torch.tensor([-m / s for m, s in zip(mean, std, strict=True)], device=device)
        self.bias = self.bias.view(1, 3, 1, 1)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        n, h, w, c = images.shape
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        out = torch.empty((n, c, h, w), dtype=self.dtype, device=images.device, memory_format=fmt)
        # computed in float32 (the constants' type), cast once on the way out
        return torch.addcmul(self.bias, images.permute(0, 3, 1, 2), self.scale, out=out)


class BatchOutput:
    """The torch and wds backends' last step, on the output device: a uint8 N×H×W×3 batch →
    ``batch_transform`` (the user's, optional) → ``normalize`` (optional) → what is yielded.

    ``batch_transform`` gets the batch as uint8 **N×3×H×W** RGB (a view of the N×H×W×3 memory,
    i.e. channels_last: torchvision's v2 transforms take it as is) on the device the loader
    yields on: the GPU after the host-to-device copy (on the side stream the copy runs on), else
    the CPU, in the training process (never in a worker: it needs not pickle). It returns the
    batch; the labels are not passed (label-mixing augmentations such as MixUp or CutMix belong
    in the training loop, on the normalised batch). With ``normalize`` (the default) it must
    return uint8 N×3×H'×W' and the built-in normalisation (mean/std, dtype, channels_last) runs
    on what it returns; with ``normalize=False`` its return value is yielded as it is, and with
    no callable the uint8 N×3×H×W batch is (so a user's own float pipeline can take over).
    """

    def __init__(
        self,
        normalize: Normalize | None,
        batch_transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
        channels_last: bool = False,
    ) -> None:
        if batch_transform is not None and not callable(batch_transform):
            raise ValueError(f"batch_transform must be callable, got {type(batch_transform)}")
        self.normalize = normalize
        self.batch_transform = batch_transform
        self.channels_last = channels_last

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        nchw = images.permute(0, 3, 1, 2)
        if self.batch_transform is not None:
            nchw = self.batch_transform(nchw)
            if self.normalize is None:
                return nchw
            _check_uint8_batch(nchw)
        if self.normalize is not None:
            return self.normalize(nchw.permute(0, 2, 3, 1))
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        return nchw.contiguous(memory_format=fmt)


def _check_uint8_batch(images) -> None:
    ok = isinstance(images, torch.Tensor) and images.dtype == torch.uint8
    if not ok or images.dim() != 4 or images.shape[1] != 3:
        got = (
            f"{images.dtype} of shape {tuple(images.shape)}"
            if isinstance(images, torch.Tensor)
            else type(images).__name__
        )
        raise ValueError(
            f"batch_transform must return a uint8 N×3×H×W tensor to be normalised, got {got} "
            "(with normalize=False its output is yielded as it is)"
        )


def denormalize(images: torch.Tensor, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> torch.Tensor:
    """The inverse of :class:`Normalize`, to 0..255 float32 N×3×H×W (for checks and pictures)."""
    m = torch.tensor(mean, device=images.device).view(1, 3, 1, 1) * 255.0
    s = torch.tensor(std, device=images.device).view(1, 3, 1, 1) * 255.0
    return images.float() * s + m
