"""JPEG decode on the GPU for the torch backend (``decode="gpu"``).

Where a host has too few cores per GPU to decode what the GPU trains on (ResNet-50 at 256 per
H200 asks ~4,500 JPEGs/s; 16 cores decode ~0.84 of that: BENCHMARKS.md, "verify's head start at
256 per GPU"), the workers stop decoding. Each reads its batch's bytes and chooses every crop
from the JPEG header alone (:class:`EncodedBatchMaker`, the same random draws as the CPU decode,
so the same crops), and the training process decodes the batch with nvJPEG
(``torchvision.io.decode_jpeg``: the hardware JPEG decoder of A100/H100/H200, its SMs elsewhere)
on the loader's side stream, then cuts and resizes every crop with ``roi_align`` (adaptive
sampling: a box filter where the crop shrinks, bilinear where it grows), one call per group of
images of similar size (:func:`size_groups`: the padded canvas stays small whatever the sizes).

What nvJPEG does not take stays on the CPU: images that are not JPEGs, CMYK JPEGs; the worker
decodes those as the CPU path does and sends them ready. A JPEG whose header parses but whose
data nvJPEG refuses is decoded on its own, then on the CPU; if that fails too it is skipped, as
the CPU path skips it (the batch one smaller).
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from loaders.decode import CpuDecoder, DecodeError, _is_jpeg

# decode="auto" (torch, wds) decodes on the CPU. On one H200 with 16 cores, ResNet-50 at 256 per
# GPU: the CPU decode 0.97-0.99 of the ceiling (torch, 4 runs), nvJPEG here 0.70: torchvision's
# batched decode holds the calling (training) thread ~18 ms a batch of 256, the crops ~7 ms more
# (BENCHMARKS.md, "One H200, 2026-12-05 (run 14)"). decode="gpu" is for hosts with far fewer
# cores per GPU than that (not measured there).
# nvJPEG takes these (YCbCr and grey JPEGs, turned into RGB); the rest go to the CPU
GPU_COLORSPACES = ("YCbCr", "Gray", "RGB")
# A group's padded canvas holds at most this many times its images' own pixels
GROUP_WASTE = 2.0


def decode_where(decode: str, device: torch.device) -> str:
    """Where the torch and wds backends decode: "gpu" only when asked; "gpu" without CUDA is
    refused."""
    if decode not in ("auto", "gpu", "cpu"):
        raise ValueError(f"decode takes auto, gpu or cpu, not {decode!r}")
    if decode == "gpu" and device.type != "cuda":
        raise ValueError("decode='gpu' needs a CUDA device")
    return "gpu" if decode == "gpu" else "cpu"


@dataclass
class EncodedBatch:
    """A batch as a worker sends it: the JPEGs' bytes end to end, each crop and flip, and the
    images the CPU decoded (``ready``, at positions ``ready_at`` of the batch)."""

    data: torch.Tensor  # uint8, 1-D
    ends: np.ndarray  # int64: where each JPEG ends in ``data``
    boxes: np.ndarray  # int64 (n, 4): x, y, w, h of each crop in its image
    flips: np.ndarray  # bool (n,)
    jpeg_at: np.ndarray  # int64 (n,): the JPEGs' positions in the batch
    ready: torch.Tensor  # uint8 (k, S, S, 3)
    ready_at: np.ndarray  # int64 (k,)

    def __len__(self) -> int:
        return len(self.jpeg_at) + len(self.ready_at)

    def jpeg(self, i: int) -> torch.Tensor:
        start = int(self.ends[i - 1]) if i else 0
        return self.data[start : int(self.ends[i])]

    def __getitem__(self, part: slice) -> EncodedBatch:
        """Positions ``part`` of the batch as a batch of their own (the wds backend re-batches
        workers' chunks): its JPEGs are one run of ``data``, so this copies no bytes."""
        start, stop, step = part.indices(len(self))
        if step != 1:
            raise ValueError("an EncodedBatch slices with step 1 only")
        j = np.flatnonzero((self.jpeg_at >= start) & (self.jpeg_at < stop))
        r = np.flatnonzero((self.ready_at >= start) & (self.ready_at < stop))
        lo = (int(self.ends[j[0] - 1]) if j[0] else 0) if len(j) else 0
        hi = int(self.ends[j[-1]]) if len(j) else 0
        return EncodedBatch(
            data=self.data[lo:hi],
            ends=self.ends[j] - lo,
            boxes=self.boxes[j],
            flips=self.flips[j],
            jpeg_at=self.jpeg_at[j] - start,
            ready=self.ready[torch.from_numpy(r)],
            ready_at=self.ready_at[r] - start,
        )

    @staticmethod
    def cat(parts: list[EncodedBatch]) -> EncodedBatch:
        """The batches one after another, as one."""
        at = np.cumsum([0] + [len(p) for p in parts[:-1]])
        sizes = np.cumsum([0] + [len(p.data) for p in parts[:-1]])
        return EncodedBatch(
            data=torch.cat([p.data for p in parts]),
            ends=np.concatenate([p.ends + o for p, o in zip(parts, sizes, strict=True)]),
            boxes=np.concatenate([p.boxes for p in parts]),
            flips=np.concatenate([p.flips for p in parts]),
            jpeg_at=np.concatenate([p.jpeg_at + a for p, a in zip(parts, at, strict=True)]),
            ready=torch.cat([p.ready for p in parts]),
            ready_at=np.concatenate([p.ready_at + a for p, a in zip(parts, at, strict=True)]),
        )

    @staticmethod
    def unread(n: int, size: int, new_uint8) -> EncodedBatch:
        """``n`` samples never decoded (a resumed wds epoch's replayed chunks, whose pixels
        are never used): placeholders of the right count."""
        none = np.empty(0, np.int64)
        return EncodedBatch(
            data=new_uint8((0,)),
            ends=none,
            boxes=np.empty((0, 4), np.int64),
            flips=np.empty(0, bool),
            jpeg_at=none,
            ready=new_uint8((n, size, size, 3)),
            ready_at=np.arange(n, dtype=np.int64),
        )


class EncodedBatchMaker:
    """In a worker: add each sample's bytes; :meth:`batch` packs them (``new_uint8(shape)``
    allocates, in shared memory inside a worker)."""

    def __init__(self, decoder: CpuDecoder) -> None:
        self.decoder = decoder
        self.reset()

    def reset(self) -> None:
        self._jpegs: list[bytes] = []
        self._boxes: list[tuple[int, int, int, int]] = []
        self._flips: list[bool] = []
        self._jpeg_at: list[int] = []
        self._ready: list[np.ndarray] = []
        self._ready_at: list[int] = []

    def __len__(self) -> int:
        return len(self._jpeg_at) + len(self._ready_at)

    def add(self, data: bytes, rng: np.random.Generator) -> None:
        """One sample; DecodeError where the CPU path would skip it."""
        if len(data) == 0:
            raise DecodeError("zero-byte file")
        header = _jpeg_header(data)
        if header is None or header[2] not in GPU_COLORSPACES:
            s = self.decoder.size
            out = np.empty((s, s, 3), np.uint8)
            self.decoder.decode_into(data, out, rng)
            self._ready.append(out)
            self._ready_at.append(len(self))
            return
        height, width = header[0], header[1]
        self._boxes.append(self.decoder.box(width, height, rng))
        t = self.decoder.transform
        self._flips.append(bool(self.decoder.train and t.flip and rng.random() < 0.5))
        self._jpegs.append(data)
        self._jpeg_at.append(len(self))

    def batch(self, new_uint8) -> EncodedBatch:
        sizes = np.fromiter((len(j) for j in self._jpegs), np.int64, len(self._jpegs))
        data = new_uint8((int(sizes.sum()),))
        flat = data.numpy()
        ends = np.cumsum(sizes)
        for j, end, size in zip(self._jpegs, ends, sizes, strict=True):
            flat[end - size : end] = np.frombuffer(j, np.uint8)
        s = self.decoder.size
        ready = new_uint8((len(self._ready), s, s, 3))
        if self._ready:
            ready.numpy()[:] = np.stack(self._ready)
        made = EncodedBatch(
            data=data,
            ends=ends,
            boxes=np.asarray(self._boxes, np.int64).reshape(-1, 4),
            flips=np.asarray(self._flips, bool),
            jpeg_at=np.asarray(self._jpeg_at, np.int64),
            ready=ready,
            ready_at=np.asarray(self._ready_at, np.int64),
        )
        self.reset()
        return made


def _jpeg_header(data: bytes):
    """(height, width, colorspace, subsampling) of a JPEG, None for any other format; a JPEG
    whose header does not parse is a DecodeError (the CPU path skips it too)."""
    if not _is_jpeg(data):
        return None
    import simplejpeg

    try:
        return simplejpeg.decode_jpeg_header(data)
    except Exception as e:  # simplejpeg raises ValueError; all mean "not decodable"
        raise DecodeError(str(e).strip().splitlines()[0] if str(e).strip() else "bad JPEG") from e


def size_groups(heights: np.ndarray, widths: np.ndarray, waste: float = GROUP_WASTE):
    """Index lists of images whose common canvas (the largest height by the largest width)
    holds at most ``waste`` times their own pixels: by area, in one pass."""
    area = heights.astype(np.int64) * widths
    groups: list[list[int]] = []
    cur: list[int] = []
    mh = mw = total = 0
    for i in np.argsort(area, kind="stable").tolist():
        h, w = int(heights[i]), int(widths[i])
        nh, nw, nt = max(mh, h), max(mw, w), total + int(area[i])
        if cur and nh * nw * (len(cur) + 1) > waste * nt:
            groups.append(cur)
            cur, nh, nw, nt = [], h, w, int(area[i])
        cur.append(i)
        mh, mw, total = nh, nw, nt
    if cur:
        groups.append(cur)
    return groups


class GpuJpegDecoder:
    """The training process's half: :meth:`__call__` turns an :class:`EncodedBatch` into a
    uint8 N×S×S×3 batch on ``device`` (on the current stream), and says which positions
    failed."""

    def __init__(self, cpu: CpuDecoder, device: torch.device) -> None:
        self.cpu = cpu
        self.size = cpu.size
        self.device = device

    def __call__(self, batch: EncodedBatch) -> tuple[torch.Tensor, list[int], list[str]]:
        """(images, failed positions, their reasons); images exclude the failed."""
        n, s = len(batch), self.size
        out = torch.empty((n, s, s, 3), dtype=torch.uint8, device=self.device)
        failed: dict[int, str] = {}
        if len(batch.jpeg_at):
            images, bad = self._decode(batch)
            failed.update({int(batch.jpeg_at[i]): why for i, why in bad.items()})
            good = [i for i in range(len(images)) if i not in bad]
            if good:
                crops = self._crops([images[i] for i in good], batch.boxes[good], batch.flips[good])
                out[torch.from_numpy(batch.jpeg_at[good]).to(self.device)] = crops
        if len(batch.ready_at):
            at = torch.from_numpy(batch.ready_at).to(self.device)
            out[at] = batch.ready.to(self.device, non_blocking=True)
        if failed:
            keep = [p for p in range(n) if p not in failed]
            out = out[torch.tensor(keep, dtype=torch.long, device=self.device)]
        return out, sorted(failed), [failed[p] for p in sorted(failed)]

    def _decode_list(self, pieces: list[torch.Tensor]) -> list[torch.Tensor]:
        from torchvision.io import ImageReadMode, decode_jpeg

        if self.device.type == "cuda":
            return decode_jpeg(pieces, mode=ImageReadMode.RGB, device=self.device)
        return decode_jpeg(pieces, mode=ImageReadMode.RGB)

    def _decode(self, batch: EncodedBatch):
        """Every JPEG of the batch as 3×H×W uint8 on the device; what fails in the batch call
        is decoded alone, then on the CPU (its pixels sent over), else reported."""
        pieces = [batch.jpeg(i) for i in range(len(batch.jpeg_at))]
        try:
            return list(self._decode_list(pieces)), {}
        except RuntimeError:
            pass
        images: list[torch.Tensor | None] = []
        bad: dict[int, str] = {}
        for i, piece in enumerate(pieces):
            try:
                images.append(self._decode_list([piece])[0])
            except RuntimeError:
                images.append(self._cpu_whole(piece, i, bad))
        return images, bad

    def _cpu_whole(self, piece: torch.Tensor, i: int, bad: dict[int, str]):
        """A JPEG nvJPEG refused, decoded whole by the CPU path's library (so it is skipped
        exactly where the CPU path skips it)."""
        data = piece.numpy().tobytes()
        try:
            if self.cpu.decoder.startswith("simplejpeg"):
                import simplejpeg

                rgb = simplejpeg.decode_jpeg(data, colorspace="RGB")
            else:
                from PIL import Image

                with Image.open(io.BytesIO(data)) as im:
                    rgb = np.asarray(im.convert("RGB"))
        except Exception as e:  # each library raises its own types; all mean "not decodable"
            bad[i] = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            return None
        return torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1).to(self.device)

    def _crops(self, images: list[torch.Tensor], boxes: np.ndarray, flips: np.ndarray):
        """Each image's box resized to S×S (uint8 N×S×S×3), flipped where asked."""
        from torchvision.ops import roi_align

        s, n = self.size, len(images)
        heights = np.fromiter((im.shape[1] for im in images), np.int64, n)
        widths = np.fromiter((im.shape[2] for im in images), np.int64, n)
        out = torch.empty((n, 3, s, s), dtype=torch.float32, device=self.device)
        for group in size_groups(heights, widths):
            canvas = _padded([images[i] for i in group]).float()
            x, y, w, h = (boxes[group, k].astype(np.float32) for k in range(4))
            rois = np.stack([np.arange(len(group), dtype=np.float32), x, y, x + w, y + h], 1)
            r = roi_align(
                canvas,
                torch.from_numpy(rois).to(self.device, non_blocking=True),
                output_size=s,
                spatial_scale=1.0,
                sampling_ratio=-1,
                aligned=True,
            )
            out[torch.tensor(group, device=self.device)] = r
        if flips.any():
            idx = torch.from_numpy(np.flatnonzero(flips)).to(self.device)
            out[idx] = out[idx].flip(-1)
        return out.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1)


def _padded(images: list[torch.Tensor]) -> torch.Tensor:
    """The images (3×H×W) as one zero-padded batch, in one nested-tensor op when all are
    uint8 of 3 channels."""
    if len(images) == 1:
        return images[0][None]
    with warnings.catch_warnings():  # torch's nested tensors are a "prototype" API
        warnings.simplefilter("ignore", UserWarning)
        return torch.nested.nested_tensor(images).to_padded_tensor(0)
