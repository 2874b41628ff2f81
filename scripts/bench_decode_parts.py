"""Where a CPU decode's time goes in the torch and wds loaders' decoder (loaders.decode.CpuDecoder,
simplejpeg, training crops at 224): decode and crop+resize per image, the whole with
simplejpeg's fastdct+fastupsample against its exact defaults, and the resize by torch (the
decoder's) against Pillow's. One core, images of a feedbench sample:

    feedbench sample /tmp/fbs --images 1024 --seed 0
    python scripts/bench_decode_parts.py /tmp/fbs/images      # 2-core dev VM: about 30 s
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from loaders.decode import CpuDecoder

SIZE = 224


def per_image_ms(fn, items) -> float:
    t0 = time.perf_counter()
    for x in items:
        fn(x)
    return (time.perf_counter() - t0) / len(items) * 1e3


def main(folder: str) -> None:
    torch.set_num_threads(1)  # as in a loader's worker
    datas = [p.read_bytes() for p in sorted(Path(folder).rglob("*.jpg"))[:400]]
    dec, out = CpuDecoder(SIZE, True), np.empty((SIZE, SIZE, 3), np.uint8)
    parts = []
    for _ in range(3):
        rng = np.random.default_rng(0)
        decoded = [dec._simplejpeg(d, rng) for d in datas[:1]]  # warm
        t0 = time.perf_counter()
        decoded = [dec._simplejpeg(d, rng) for d in datas]
        t1 = time.perf_counter()
        for pixels, box in decoded:
            dec._resize_into(pixels, box, out, False)
        parts.append(((t1 - t0) / len(datas) * 1e3, (time.perf_counter() - t1) / len(datas) * 1e3))
    print(f"decode {statistics.median(p[0] for p in parts):.2f} ms, crop+resize+copy "
          f"{statistics.median(p[1] for p in parts):.2f} ms per image")  # fmt: skip

    rates = {"simplejpeg": [], "simplejpeg-fast": []}
    for _ in range(5):
        for name, r in rates.items():
            whole, rng = CpuDecoder(SIZE, True, name), np.random.default_rng(0)
            r.append(
                1e3 / per_image_ms(lambda d, rng=rng, w=whole: w.decode_into(d, out, rng), datas)
            )
    for name, r in rates.items():
        label = (
            "fastdct+fastupsample (simplejpeg-fast)" if name.endswith("fast") else "exact (default)"
        )
        print(f"{label}: {statistics.median(r):.0f} img/s (min {min(r):.0f}, max {max(r):.0f})")

    rng = np.random.default_rng(0)
    crops = []
    for d in datas:
        pixels, (x0, y0, x1, y1) = dec._simplejpeg(d, rng)
        crops.append(np.ascontiguousarray(pixels[y0:y1, x0:x1]))
    box = lambda c: (0, 0, c.shape[1], c.shape[0])  # noqa: E731
    ours = per_image_ms(lambda c: dec._resize_into(c, box(c), out, False), crops)
    pil = per_image_ms(
        lambda c: np.copyto(
            out, np.asarray(Image.fromarray(c).resize((SIZE, SIZE), Image.BILINEAR))
        ),
        crops,
    )
    print(f"resize of the crops: torch (antialiased bilinear) {ours:.2f} ms, Pillow {pil:.2f} ms")


if __name__ == "__main__":
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        sys.exit(0)
    main(sys.argv[1] if len(sys.argv) > 1 else "sample_data")
