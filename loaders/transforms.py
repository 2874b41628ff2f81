"""Shared constants and the normalisation every backend ends with (on the GPU when there is one)."""

from __future__ import annotations

import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"unsupported dtype {dtype}: choose float32, float16 or bfloat16")
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}: choose {', '.join(DTYPES)}")
    return DTYPES[dtype]


class Normalize:
    """uint8 N×H×W×3 → normalised N×3×H×W of ``dtype`` (channels_last in memory if asked)."""

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
        self.mean = torch.tensor([m * 255.0 for m in mean], device=device).view(1, 3, 1, 1)
        self.inv_std = torch.tensor([1.0 / (s * 255.0) for s in std], device=device).view(
            1, 3, 1, 1
        )
        self.mean = self.mean.to(dtype)
        self.inv_std = self.inv_std.to(dtype)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        n, h, w, c = images.shape
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        out = torch.empty((n, c, h, w), dtype=self.dtype, device=images.device, memory_format=fmt)
        out.copy_(images.permute(0, 3, 1, 2))  # dtype and layout in one pass
        return out.sub_(self.mean).mul_(self.inv_std)


def denormalize(images: torch.Tensor, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> torch.Tensor:
    """The inverse of :class:`Normalize`, to 0..255 float32 N×3×H×W (for checks and pictures)."""
    m = torch.tensor(mean, device=images.device).view(1, 3, 1, 1) * 255.0
    s = torch.tensor(std, device=images.device).view(1, 3, 1, 1) * 255.0
    return images.float() * s + m
