"""CPU decode + crop + resize + flip for one image, the fast way (torch and wds backends).

Measured on this project's ImageNet-like JPEGs (``scripts/bench_loaders.py --only decoders``),
the fast path is, in order:

1. choose the crop first (RandomResizedCrop parameters need only the image size, read from the
   JPEG header), then
2. decode at a reduced size where the crop allows (libjpeg-turbo DCT scaling by 1/2, 1/4, 1/8: the
   crop must still be at least ``size`` pixels on its shorter side after scaling), through
   simplejpeg (libjpeg-turbo without Pillow's per-call overhead),
3. cut the crop as a view, make it contiguous (so torch takes its AVX2 uint8 path), and resize it
   with antialiased bilinear interpolation on uint8 (torchvision's RandomResizedCrop quality),
4. write the result, flipped or not, straight into the batch's uint8 slot: one copy.

Pillow (with ``draft`` DCT scaling) and OpenCV (``IMREAD_REDUCED_*``) are selectable for comparison;
non-JPEG images always go through Pillow. ``simplejpeg-fast`` is simplejpeg with libjpeg-turbo's
fast integer IDCT and chroma upsampling: ~7% more images a core, for a slight loss of accuracy
(BENCHMARKS.md, "Where a CPU decode's time goes"), for hosts where the decode's cores are short.
"""

from __future__ import annotations

import importlib.util
import io
import math

import numpy as np
import torch
import torch.nn.functional as F
from PIL import UnidentifiedImageError  # PIL/__init__ only: cheap, Image stays lazy

from loaders.transforms import TransformSpec

DECODERS = ("auto", "simplejpeg", "simplejpeg-fast", "pil", "opencv")
SIMPLEJPEG = ("simplejpeg", "simplejpeg-fast")
SCALE = (0.08, 1.0)
RATIO = (3.0 / 4.0, 4.0 / 3.0)


class DecodeError(Exception):
    """These bytes cannot be decoded as an image."""


def random_resized_crop_box(
    width: int, height: int, rng: np.random.Generator, scale=SCALE, ratio=RATIO
) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params: ``(x, y, w, h)`` in pixels of the original."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1)), w, h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def center_crop_box(
    width: int, height: int, size: int, resize: int | None = None
) -> tuple[int, int, int, int]:
    """Resize-shorter-to ``resize`` (default ``size / 0.875``) then centre-crop ``size``, as a box
    in the original."""
    side = min(width, height) * (size / resize if resize else 0.875)
    w = h = max(1, int(round(side)))
    return (width - w) // 2, (height - h) // 2, w, h


def dct_factor(crop_w: int, crop_h: int, size: int) -> int:
    """The largest of 1, 2, 4, 8 that keeps the crop at least ``size`` px after scaling."""
    k = 1
    while k < 8 and min(crop_w, crop_h) >= 2 * k * size:
        k *= 2
    return k


def _is_jpeg(data: bytes) -> bool:
    return data[:3] == b"\xff\xd8\xff"


# the module each named decoder imports, and where it comes from
_NEEDS = {
    "simplejpeg": ("simplejpeg", "simplejpeg"),
    "simplejpeg-fast": ("simplejpeg", "simplejpeg"),
    "opencv": ("cv2", "opencv-python-headless"),
}


def decoder_missing(decoder: str) -> str | None:
    """Why ``decoder`` cannot run here (its module is not installed), or None. Asked before any
    sample is decoded: otherwise every decode fails and every sample is skipped."""
    module, package = _NEEDS.get(decoder, (None, None))
    if module is None or importlib.util.find_spec(module) is not None:
        return None
    return f"decoder {decoder} needs {package} (pip install {package}): No module named {module!r}"


class CpuDecoder:
    """bytes → ``size``×``size``×3 uint8, written into a caller's slot; picklable (no state)."""

    def __init__(
        self,
        size: int = 224,
        train: bool = True,
        decoder: str = "auto",
        transform: TransformSpec | None = None,
    ) -> None:
        if decoder not in DECODERS:
            raise ValueError(f"unknown decoder {decoder!r}: choose one of {', '.join(DECODERS)}")
        missing = decoder_missing(decoder)
        if missing:
            raise ValueError(missing)
        if decoder == "auto":
            try:
                import simplejpeg  # noqa: F401

                decoder = "simplejpeg"
            except ImportError:
                decoder = "pil"
        self.size = size
        self.train = train
        self.decoder = decoder
        self.transform = transform or TransformSpec()
        self.resize = self.transform.eval_resize(size)
        self.dct_scaling = True  # off only to measure what it saves

    def box(self, width: int, height: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
        if self.train:
            t = self.transform
            return random_resized_crop_box(width, height, rng, t.scale, t.ratio)
        return center_crop_box(width, height, self.size, self.resize)

    def decode_into(self, data: bytes, out: np.ndarray, rng: np.random.Generator) -> None:
        """Decode, crop, resize and (train) maybe flip ``data`` into ``out`` (H×W×3 uint8)."""
        if len(data) == 0:
            raise DecodeError("zero-byte file")
        try:
            if self.decoder in SIMPLEJPEG and _is_jpeg(data):
                pixels, box = self._simplejpeg(data, rng)
            elif self.decoder == "opencv" and _is_jpeg(data):
                pixels, box = self._opencv(data, rng)
            else:
                pixels, box = self._pil(data, rng)
        except DecodeError:
            raise
        except UnidentifiedImageError as e:  # its text names an in-memory buffer, not the file
            raise DecodeError("not an image format Pillow can identify") from e
        except Exception as e:  # each decoder raises its own types; all mean "not decodable"
            raise DecodeError(
                str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            ) from e
        flip = self.train and self.transform.flip and rng.random() < 0.5
        self._resize_into(pixels, box, out, flip)

    # --- decoders: each returns the (reduced) pixels and the crop box in their coordinates ---

    def _scaled_box(self, box, width: int, height: int, got_w: int, got_h: int):
        fx, fy = got_w / width, got_h / height
        x, y, w, h = box
        x0, y0 = int(x * fx), int(y * fy)
        x1 = min(got_w, max(x0 + 1, int(math.ceil((x + w) * fx))))
        y1 = min(got_h, max(y0 + 1, int(math.ceil((y + h) * fy))))
        return x0, y0, x1, y1

    def _simplejpeg(self, data: bytes, rng):
        import simplejpeg

        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        box = self.box(width, height, rng)
        k = dct_factor(box[2], box[3], self.size) if self.dct_scaling else 1
        fast = self.decoder == "simplejpeg-fast"
        opts = dict(colorspace="RGB", fastdct=fast, fastupsample=fast)
        if k > 1:
            opts.update(min_width=-(-width // k), min_height=-(-height // k))
        pixels = simplejpeg.decode_jpeg(data, **opts)
        return pixels, self._scaled_box(box, width, height, pixels.shape[1], pixels.shape[0])

    def _opencv(self, data: bytes, rng):
        import cv2
        import simplejpeg

        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        box = self.box(width, height, rng)
        k = dct_factor(box[2], box[3], self.size) if self.dct_scaling else 1
        flag = {
            1: cv2.IMREAD_COLOR,
            2: cv2.IMREAD_REDUCED_COLOR_2,
            4: cv2.IMREAD_REDUCED_COLOR_4,
            8: cv2.IMREAD_REDUCED_COLOR_8,
        }[k]
        bgr = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
        if bgr is None:
            raise DecodeError("OpenCV could not decode the image")
        pixels = bgr[:, :, ::-1]  # BGR → RGB as a view; the crop copy below makes it contiguous
        return pixels, self._scaled_box(box, width, height, pixels.shape[1], pixels.shape[0])

    def _pil(self, data: bytes, rng):
        from PIL import Image

        with Image.open(io.BytesIO(data)) as im:
            width, height = im.size
            box = self.box(width, height, rng)
            k = dct_factor(box[2], box[3], self.size) if self.dct_scaling else 1
            if k > 1 and im.format == "JPEG":
                im.draft("RGB", (-(-width // k), -(-height // k)))
            pixels = np.asarray(im.convert("RGB"))
        return pixels, self._scaled_box(box, width, height, pixels.shape[1], pixels.shape[0])

    def _resize_into(self, pixels: np.ndarray, box, out: np.ndarray, flip: bool) -> None:
        x0, y0, x1, y1 = box
        crop = pixels[y0:y1, x0:x1]
        if crop.shape[0] == out.shape[0] and crop.shape[1] == out.shape[1]:
            resized = crop
        else:
            # contiguous NHWC uint8 takes torch's AVX2 antialiased bilinear path (≈2× a view)
            c = np.ascontiguousarray(crop)
            if not c.flags.writeable:  # Pillow's arrays are read-only; torch wants writable
                c = c.copy()
            t = torch.from_numpy(c).permute(2, 0, 1).unsqueeze(0)
            r = F.interpolate(
                t, size=out.shape[:2], mode="bilinear", antialias=True, align_corners=False
            )
            resized = r[0].permute(1, 2, 0).numpy()
        np.copyto(out, resized[:, ::-1] if flip else resized)
