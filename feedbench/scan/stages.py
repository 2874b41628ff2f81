"""The stages a sample goes through: plain functions, timed by the caller.

read (in :mod:`feedbench.scan.sources`) → decode → augment → collate → transfer (data files
other than images: read → decode, as their format has one). Each function
here does exactly the work of its stage and nothing else, so the time around a call is the
stage's cost.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from feedbench.scan.config import STAGES

__all__ = ["STAGES"]  # named in config, which is imported without torch


class DecodeError(Exception):
    """The bytes are not a decodable image."""


def decode(data: bytes) -> Image.Image:
    """JPEG/PNG bytes → fully decoded RGB image (Pillow, as a stock torchvision loader does)."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            return im.convert("RGB")
    except UnidentifiedImageError as e:
        raise DecodeError("not an image format Pillow can identify") from e
    except (OSError, ValueError, SyntaxError) as e:
        raise DecodeError(str(e) or type(e).__name__) from e
    except Image.DecompressionBombError as e:
        raise DecodeError(str(e)) from e


def decode_record(source, raw):
    """A data file's sample decoded as its format says (npy/npz → arrays, TFRecord → the
    payload with its checksums checked, HDF5 → a row, Parquet → a table):
    :meth:`feedbench.scan.sources.Source.decode`."""
    from loaders.data.records import RecordFormatError

    try:
        return source.decode(raw)
    except RecordFormatError as e:
        raise DecodeError(str(e)) from None


class Augment:
    """The train transform: RandomResizedCrop(size) + horizontal flip; PIL image → HWC uint8."""

    def __init__(self, size: int = 224) -> None:
        from torchvision.transforms import v2

        self.size = size
        self._t = v2.Compose(
            [v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()]
        )

    def __call__(self, img: Image.Image) -> np.ndarray:
        return np.asarray(self._t(img))


def collate(arrays: Sequence[np.ndarray]) -> torch.Tensor:
    """HWC uint8 arrays → one B×3×H×W uint8 tensor (channels-last in memory, no extra copy)."""
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2)


def transfer(batch: torch.Tensor, device: torch.device, *, pinned: bool) -> torch.Tensor:
    """Host → GPU copy of a batch, from pinned (page-locked) or pageable memory; synchronised."""
    src = batch.pin_memory() if pinned else batch
    out = src.to(device, non_blocking=pinned)
    torch.cuda.synchronize(device)
    return out
