"""A baseline JPEG encoder in numpy that knows where its coefficient bits lie, so one encoding
can be written many times, each copy with different bytes throughout.

Baseline JPEG codes every nonzero AC coefficient as a Huffman symbol (run, size) followed by
``size`` value bits. Flipping the last value bit changes that coefficient by one or two
quantisation steps but keeps its size class, so every symbol, every code length and the file's
length stay the same: the copy decodes with exactly the same work as the original, and a decoder
cannot tell it apart from any other photograph. :class:`PoolJpeg` records such bits (at most one
per byte, and only in bytes where the flip neither makes nor unmakes an ``0xFF``, so the byte
stuffing stays valid); :meth:`PoolJpeg.variant` flips a random half of them, a few hundred per
4 KiB, in ~0.1 ms. Regenerating the entropy-coded data per file instead (PIL) costs ~5 ms per
image, rendering the pixels ~100 ms.

Tables come from Pillow (libjpeg) for the quality asked, so sizes match Pillow's output with its
default (standard, non-optimised) Huffman tables and 4:2:0 subsampling.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from functools import cache

import numpy as np
from PIL import Image

STRIDE = 16  # at most one flippable bit kept per this many bytes: ~256 per 4 KiB block


def _zigzag() -> np.ndarray:
    """Natural (row-major) index of each zigzag position 0..63."""
    order = sorted(
        ((r, c) for r in range(8) for c in range(8)),
        key=lambda rc: (rc[0] + rc[1], rc[0] if (rc[0] + rc[1]) % 2 else rc[1]),
    )
    return np.array([r * 8 + c for r, c in order])


ZIGZAG = _zigzag()
_U = np.arange(8)
DCT = np.where(_U[:, None] == 0, math.sqrt(1 / 8), math.sqrt(2 / 8)) * np.cos(
    (2 * _U[None, :] + 1) * _U[:, None] * math.pi / 16
)


@dataclass(frozen=True)
class Tables:
    header: bytes  # SOI .. SOS of a Pillow JPEG, its size patched per image
    sof_at: int  # offset of SOF0's height field in header
    quant: tuple[np.ndarray, np.ndarray]  # luminance, chrominance, natural order
    huff: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]  # (class, id): (code, length)


def _segments(data: bytes):
    at = 2
    while True:
        marker, length = data[at + 1], int.from_bytes(data[at + 2 : at + 4], "big")
        yield marker, at, data[at + 4 : at + 2 + length]
        if marker == 0xDA:
            return
        at += 2 + length


def _huffman(bits: bytes, vals: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Canonical code and length of every symbol (JPEG Annex C)."""
    code_of, size_of = np.zeros(256, np.uint64), np.zeros(256, np.int64)
    code, k = 0, 0
    for length in range(1, 17):
        for _ in range(bits[length - 1]):
            code_of[vals[k]], size_of[vals[k]] = code, length
            code, k = code + 1, k + 1
        code <<= 1
    return code_of, size_of


@cache
def tables(quality: int) -> Tables:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (128, 100, 90)).save(
        buf, format="JPEG", quality=quality, subsampling="4:2:0"
    )
    data = buf.getvalue()
    quant: dict[int, np.ndarray] = {}
    huff = {}
    sof_at = end = 0
    for marker, at, body in _segments(data):
        if marker == 0xDB:
            i = 0
            while i < len(body):
                table = np.zeros(64)
                table[ZIGZAG] = np.frombuffer(body[i + 1 : i + 65], np.uint8)
                quant[body[i] & 15], i = table, i + 65
        elif marker == 0xC4:
            i = 0
            while i < len(body):
                n = sum(body[i + 1 : i + 17])
                huff[(body[i] >> 4, body[i] & 15)] = _huffman(
                    body[i + 1 : i + 17], body[i + 17 : i + 17 + n]
                )
                i += 17 + n
        elif marker == 0xC0:
            sof_at = at + 5
        end = at + 2 + len(body) + 2
    return Tables(data[:end], sof_at, (quant[0], quant[1]), huff)


def _blocks(pixels: np.ndarray) -> np.ndarray:
    """Level-shifted 8×8 blocks in scan order (per 16×16 MCU: Y00 Y01 Y10 Y11 Cb Cr)."""
    h, w = pixels.shape[:2]
    rgb = np.pad(pixels.astype(np.float32), ((0, -h % 16), (0, -w % 16), (0, 0)), mode="edge")
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    y = 0.299 * r + 0.587 * g + 0.114 * b - 128
    cb = -0.168736 * r - 0.331264 * g + 0.5 * b
    cr = 0.5 * r - 0.418688 * g - 0.081312 * b
    my, mx = rgb.shape[0] // 16, rgb.shape[1] // 16
    ys = y.reshape(my, 2, 8, mx, 2, 8).transpose(0, 3, 1, 4, 2, 5).reshape(my * mx, 4, 8, 8)
    chroma = [
        c.reshape(my, 8, 2, mx, 8, 2).mean(axis=(2, 5)).reshape(my, 8, mx, 8)
        .transpose(0, 2, 1, 3).reshape(my * mx, 1, 8, 8)
        for c in (cb, cr)
    ]  # fmt: skip
    return np.concatenate([ys, *chroma], axis=1).reshape(-1, 8, 8)


def _size_class(v: np.ndarray) -> np.ndarray:
    return np.frexp(np.abs(v).astype(np.float64))[1].astype(np.int64)


def _events(coef: np.ndarray, comp: np.ndarray):
    """Every symbol of the scan in order, as columns: table class, table id, symbol, value,
    value bits, and whether it is a nonzero AC coefficient."""
    n = len(coef)
    dc = coef[:, 0]
    diff = np.empty_like(dc)
    for c in range(3):
        at = np.flatnonzero(comp == c)
        diff[at] = np.diff(dc[at], prepend=0)
    tid = np.minimum(comp, 1)
    blocks = np.arange(n)
    b, k = np.nonzero(coef[:, 1:])
    k = k + 1
    v = coef[b, k]
    first = np.r_[True, b[1:] != b[:-1]]
    prev = np.where(first, 0, np.r_[0, k[:-1]])
    run = k - prev - 1
    s = _size_class(v)
    zrl_n = run >> 4
    zb = np.repeat(b, zrl_n)
    zk = np.repeat(k, zrl_n)
    zj = np.arange(len(zb)) - np.repeat(np.cumsum(zrl_n) - zrl_n, zrl_n)
    eob = blocks[np.r_[coef[:, 63] == 0]]
    ds = _size_class(diff)
    parts = [
        (blocks * 1024, 0, tid, ds, diff, ds, False),
        (zb * 1024 + zk * 8 + zj, 1, tid[zb], np.full(len(zb), 0xF0), 0 * zb, 0 * zb, False),
        (b * 1024 + k * 8 + 4, 1, tid[b], ((run & 15) << 4) | s, v, s, True),
        (eob * 1024 + 512, 1, tid[eob], 0 * eob, 0 * eob, 0 * eob, False),
    ]
    cols = [np.concatenate([np.broadcast_to(p[i], len(p[0])) for p in parts]) for i in range(7)]
    order = np.argsort(cols[0], kind="stable")
    return [c[order] for c in cols[1:]]


def _pack(tab: Tables, cls, tid, sym, val, vlen, is_ac) -> tuple[np.ndarray, np.ndarray]:
    """The entropy-coded bits (unstuffed bytes) and the bit offset of each flippable LSB."""
    code = np.zeros(len(sym), np.uint64)
    clen = np.zeros(len(sym), np.int64)
    for (c, t), (codes, sizes) in tab.huff.items():
        at = (cls == c) & (tid == t)
        code[at], clen[at] = codes[sym[at]], sizes[sym[at]]
    vbits = np.where(val < 0, val + (1 << vlen) - 1, val).astype(np.uint64)
    word = (code << vlen.astype(np.uint64)) | vbits
    length = clen + vlen
    start = np.cumsum(length) - length
    total = int(length.sum())
    # each word (<= 27 bits) placed in the 5 bytes from its first: words share bytes but never
    # bits, so summing the bytes' parts (bincount) is OR-ing them
    at = start >> 3
    placed = word << (40 - (start & 7) - length).astype(np.uint64)
    out = np.zeros((total + 7) // 8 + 5)
    for k in range(5):
        part = (placed >> np.uint64(32 - 8 * k)) & np.uint64(0xFF)
        out += np.bincount(at + k, weights=part.astype(np.float64), minlength=len(out))
    raw = out[: (total + 7) // 8].astype(np.uint8)
    if total % 8:
        raw[-1] |= (1 << (8 - total % 8)) - 1  # pad with 1s
    lsb = (start + length - 1)[is_ac & (vlen > 0)]
    return raw, lsb


@dataclass(frozen=True)
class PoolJpeg:
    """One encoded JPEG and the bits that may be flipped without changing its decode work."""

    data: bytes
    width: int
    height: int
    flip_at: np.ndarray  # byte offsets, one bit each
    flip_mask: np.ndarray  # uint8, the bit within that byte

    def variant(self, rng: np.random.Generator) -> bytes:
        """A copy with a random half of the flippable bits flipped (same length, same decode)."""
        out = np.frombuffer(self.data, np.uint8).copy()
        coin = np.frombuffer(rng.bytes(len(self.flip_at)), np.uint8)  # each bit: a fair coin
        out[self.flip_at] ^= self.flip_mask & coin
        return out.tobytes()


def encode(pixels: np.ndarray, quality: int) -> PoolJpeg:
    """Baseline JPEG (4:2:0, standard Huffman tables) of an H×W×3 uint8 RGB image."""
    tab = tables(quality)
    h, w = pixels.shape[:2]
    blocks = _blocks(pixels)
    comp = np.tile(np.array([0, 0, 0, 0, 1, 2]), len(blocks) // 6)
    freq = DCT @ blocks @ DCT.T
    q = np.where((comp == 0)[:, None], tab.quant[0][None, :], tab.quant[1][None, :])
    coef = np.rint(freq.reshape(-1, 64) / q).astype(np.int64)[:, ZIGZAG]
    raw, lsb = _pack(tab, *_events(coef, comp))
    ff = raw == 0xFF
    shift = np.cumsum(ff) - ff  # 0xFF bytes before each byte: each gets a stuffed 0x00
    scan = np.insert(raw, np.flatnonzero(ff) + 1, 0)
    at = (lsb >> 3) + shift[lsb >> 3]
    mask = (1 << (7 - (lsb & 7))).astype(np.uint8)
    ok = (scan[at] != 0xFF) & ((scan[at] ^ mask) != 0xFF)
    at, mask = at[ok], mask[ok]
    at, first = np.unique(at, return_index=True)  # one bit per byte keeps the 0xFF test exact
    mask = mask[first]
    keep = np.unique(at // STRIDE, return_index=True)[1]
    header = bytearray(tab.header)
    header[tab.sof_at : tab.sof_at + 4] = h.to_bytes(2, "big") + w.to_bytes(2, "big")
    offset = len(header)
    data = bytes(header) + scan.tobytes() + b"\xff\xd9"
    return PoolJpeg(data, w, h, (at[keep] + offset).astype(np.int64), mask[keep])
