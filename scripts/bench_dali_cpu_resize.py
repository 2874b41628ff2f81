#!/usr/bin/env python3
"""What DALI's CPU resize costs its CPU pipeline (the work ``resize="gpu"`` moves to the GPU).

The dali backend's training graph with ``decode="cpu"`` (small batches on a GPU, and every
batch without one): decode + random crop (``fn.decoders.image_random_crop``, as the loader
calls it), then the antialiased linear resize to the output size. Two CPU-only pipelines, one
with the resize and one without, run in turn for ``--rounds`` rounds on the same files; each
prints its images/s per round. CPU only: runs on any machine with DALI.

    python scripts/bench_dali_cpu_resize.py /tmp/fb2k/images --threads 2 --batch 64
"""

from __future__ import annotations

import argparse
import os
import time


def pipeline(files: list[str], batch: int, threads: int, size: int, resize: bool):
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=None, seed=1,
                  prefetch_queue_depth=2)  # fmt: skip
    def graph():
        jpegs, _ = fn.readers.file(files=files, random_shuffle=True)
        images = fn.decoders.image_random_crop(
            jpegs, device="cpu", output_type=types.RGB, random_area=[0.08, 1.0],
            random_aspect_ratio=[0.75, 4 / 3], num_attempts=100,
        )  # fmt: skip
        if resize:
            images = fn.resize(images, resize_x=size, resize_y=size,
                               interp_type=types.INTERP_LINEAR, antialias=True)  # fmt: skip
        return images

    pipe = graph()
    pipe.build()
    for _ in range(3):  # warm-up: threads started, buffers grown
        pipe.run()
    return pipe


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("images", help="an image tree (class folders of JPEGs)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--runs", type=int, default=12, help="batches per round")
    a = p.parse_args()
    files = sorted(
        os.path.join(d, f) for d, _, fs in os.walk(a.images) for f in fs if f.endswith(".jpg")
    )
    pipes = {
        "decode + crop + resize": pipeline(files, a.batch, a.threads, a.size, True),
        "decode + crop": pipeline(files, a.batch, a.threads, a.size, False),
    }
    rates: dict[str, list[float]] = {k: [] for k in pipes}
    for _ in range(a.rounds):
        for name, pipe in pipes.items():
            t0 = time.perf_counter()
            for _ in range(a.runs):
                pipe.run()
            rates[name].append(a.runs * a.batch / (time.perf_counter() - t0))
    print(f"{len(files)} JPEGs, {a.threads} threads, batch {a.batch}, {a.rounds} rounds")
    for name, r in rates.items():
        print(f"{name:24s} " + " ".join(f"{x:6.0f}" for x in r)
              + f"   mean {sum(r) / len(r):6.0f} images/s")  # fmt: skip
    with_r, without = (sum(r) / len(r) for r in rates.values())
    print(f"without the resize: {without / with_r:.2f}x the images a second")


if __name__ == "__main__":
    main()
