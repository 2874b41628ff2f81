"""Can torchvision's nvjpeg decode feed ResNet-50 on one GPU, and what does it cost the step?

On a 16-core H200 the torch and wds loaders' CPU decode supplies about 0.84 of what ResNet-50
asks at 256 per GPU (BENCHMARKS, "verify's head start"). This measures the alternative on the
GPU machine, from JPEG bytes already in memory:

1. decode only: ``torchvision.io.decode_jpeg(list, device="cuda")`` per batch;
2. decode + RandomResizedCrop + flip to 224, two ways: ``each`` (a crop view and an antialiased
   ``interpolate`` per image) and ``roi`` (the batch padded by one nested-tensor op, then one
   ``roi_align`` with adaptive sampling, a box filter, for every crop);
3. ResNet-50 bf16 training steps alone, then with way 2 running in a background thread on its
   own stream, two batches ahead: the step's rate with the decode beside it.

Per way: images/s, and the CPU milliseconds the calling thread spends per batch (launches hold
the GIL the training thread needs). Usage (GPU machine):
``python3 scripts/bench_nvjpeg.py --data /tmp/fb32k --batch 64 256 --json OUT/nvjpeg.json``
"""

from __future__ import annotations

import argparse
import json
import math
import queue
import threading
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
from torchvision.io import decode_jpeg
from torchvision.ops import roi_align

SIZE = 224


def load_bytes(data: Path, n: int) -> list[torch.Tensor]:
    files = sorted((data / "images").rglob("*.jpg"))[:n]
    return [torch.frombuffer(bytearray(f.read_bytes()), dtype=torch.uint8) for f in files]


def boxes_for(images: list[torch.Tensor], rng: np.random.Generator) -> list[tuple[int, ...]]:
    from loaders.decode import random_resized_crop_box

    return [random_resized_crop_box(im.shape[2], im.shape[1], rng) for im in images]


def crop_each(images, boxes, flips, out):
    for i, (im, (x, y, w, h)) in enumerate(zip(images, boxes, strict=True)):
        r = F.interpolate(
            im[None, :, y : y + h, x : x + w].float(),
            size=(SIZE, SIZE),
            mode="bilinear",
            antialias=True,
            align_corners=False,
        )
        out[i] = r[0].flip(-1) if flips[i] else r[0]
    return out


def crop_roi(images, boxes, flips, out):
    canvas = torch.nested.nested_tensor(images).to_padded_tensor(0).float()
    rois = torch.tensor(
        [[i, x, y, x + w, y + h] for i, (x, y, w, h) in enumerate(boxes)],
        dtype=torch.float32,
    ).to(canvas.device, non_blocking=True)
    r = roi_align(
        canvas, rois, output_size=SIZE, spatial_scale=1.0, sampling_ratio=-1, aligned=True
    )
    idx = torch.from_numpy(np.flatnonzero(flips)).to(canvas.device, non_blocking=True)
    r[idx] = r[idx].flip(-1)
    out.copy_(r)
    return out


def encoded_batches(raw, batch, count, size=SIZE):
    """The batches as the torch loader's workers send them (loaders.gpu_decode)."""
    from loaders.decode import CpuDecoder
    from loaders.gpu_decode import EncodedBatchMaker

    maker = EncodedBatchMaker(CpuDecoder(size, True))
    rng = np.random.default_rng(2)
    made = []
    for k in range(count):
        for i in range(batch):
            maker.add(raw[(k * batch + i) % len(raw)].numpy().tobytes(), rng)
        made.append(maker.batch(lambda shape: torch.empty(shape, dtype=torch.uint8)))
    return made


_MODULE = {}


def decoded_batch(raw, batch, k, way, rng, out):
    if way == "loader":  # loaders.gpu_decode.GpuJpegDecoder, as the torch loader runs it
        from loaders.decode import CpuDecoder
        from loaders.gpu_decode import GpuJpegDecoder

        if batch not in _MODULE:
            _MODULE[batch] = encoded_batches(raw, batch, 8)
        dec = GpuJpegDecoder(CpuDecoder(SIZE, True), torch.device("cuda"))
        images, _, _ = dec(_MODULE[batch][k % 8])
        out.copy_(images.permute(0, 3, 1, 2))
        return out
    chunk = [raw[(k * batch + i) % len(raw)] for i in range(batch)]
    images = decode_jpeg(chunk, device="cuda")
    if way == "decode":
        return out
    boxes = boxes_for(images, rng)
    flips = rng.random(batch) < 0.5
    return (crop_each if way == "each" else crop_roi)(images, boxes, flips, out)


def rate(raw, batch, way, batches, rng):
    out = torch.empty(batch, 3, SIZE, SIZE, device="cuda")
    for k in range(3):
        decoded_batch(raw, batch, k, way, rng, out)
    torch.cuda.synchronize()
    t0, c0 = time.perf_counter(), time.thread_time()
    for k in range(batches):
        decoded_batch(raw, batch, k, way, rng, out)
    torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    return {
        "way": way,
        "batch": batch,
        "img_s": batch * batches / wall,
        "cpu_ms_per_batch": 1e3 * cpu / batches,
        "wall_ms_per_batch": 1e3 * wall / batches,
    }


def train_rate(batch, steps, feeder=None):
    """ResNet-50 bf16 channels_last SGD steps; with ``feeder``, each step's input comes from it."""
    model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(batch, 3, SIZE, SIZE, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device="cuda")

    def step(inp):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(inp), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(15):
        step(x)
    torch.cuda.synchronize()
    t0, c0 = time.perf_counter(), time.thread_time()
    waited = 0.0
    for _ in range(steps):
        inp = x
        if feeder is not None:
            w0 = time.perf_counter()
            inp, ev = feeder.get()
            waited += time.perf_counter() - w0
            torch.cuda.current_stream().wait_event(ev)
            inp = inp.contiguous(memory_format=torch.channels_last)
        step(inp)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return {
        "img_s": batch * steps / wall,
        "step_ms": 1e3 * wall / steps,
        "main_cpu_ms_per_step": 1e3 * (time.thread_time() - c0) / steps,
        "wait_frac": waited / wall,
    }


class Feeder:
    """Decodes batches on its own stream in a background thread, ``depth`` ahead."""

    def __init__(self, raw, batch, way, depth=2):
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = False
        self.bufs = [torch.empty(batch, 3, SIZE, SIZE, device="cuda") for _ in range(depth + 2)]
        self.thread = threading.Thread(target=self.run, args=(raw, batch, way), daemon=True)
        self.cpu_s = 0.0
        self.batches = 0
        self.thread.start()

    def run(self, raw, batch, way):
        stream = torch.cuda.Stream()
        rng = np.random.default_rng(0)
        c0 = time.thread_time()
        k = 0
        with torch.cuda.stream(stream):
            while not self.stop:
                out = self.bufs[k % len(self.bufs)]
                decoded_batch(raw, batch, k, way, rng, out)
                ev = torch.cuda.Event()
                ev.record(stream)
                self.cpu_s = time.thread_time() - c0
                self.batches = k + 1
                while not self.stop:
                    try:
                        self.q.put((out, ev), timeout=0.1)
                        break
                    except queue.Full:
                        pass
                k += 1

    def get(self):
        return self.q.get()

    def close(self):
        self.stop = True
        self.thread.join(timeout=5)


class Inline:
    """As the torch loader's prefetcher: the next batch decoded on a side stream in the training
    thread, one ahead."""

    def __init__(self, raw, batch):
        self.raw, self.batch, self.k = raw, batch, 0
        self.stream = torch.cuda.Stream()
        self.rng = np.random.default_rng(0)
        self.bufs = [torch.empty(batch, 3, SIZE, SIZE, device="cuda") for _ in range(3)]
        self.cpu_s, self.batches = 0.0, 0
        self.nxt = self._issue()

    def _issue(self):
        c0 = time.thread_time()
        out = self.bufs[self.k % 3]
        with torch.cuda.stream(self.stream):
            decoded_batch(self.raw, self.batch, self.k, "loader", self.rng, out)
            ev = torch.cuda.Event()
            ev.record(self.stream)
        self.k += 1
        self.cpu_s += time.thread_time() - c0
        self.batches += 1
        return out, ev

    def get(self):
        cur, self.nxt = self.nxt, self._issue()
        return cur

    def close(self):
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    raw = load_bytes(a.data, a.images)
    mean_kb = sum(r.numel() for r in raw) / len(raw) / 1e3
    print(
        f"{len(raw)} JPEGs in memory, mean {mean_kb:.0f} KB; torch {torch.__version__}, "
        f"torchvision {torchvision.__version__}, {torch.cuda.get_device_name()}"
    )
    rows = []
    for b in a.batch:
        rng = np.random.default_rng(1)
        for way in ("decode", "each", "roi", "loader"):
            try:
                r = rate(raw, b, way, a.batches, rng)
            except Exception as e:  # a way this torchvision lacks is a row, not the end
                r = {"way": way, "batch": b, "error": f"{type(e).__name__}: {e}"}
            rows.append(r)
            print(json.dumps(r))
        steps = max(20, math.ceil(a.steps * 64 / b))
        alone = train_rate(b, steps)
        rows.append({"batch": b, "train": "synthetic", **alone})
        print(json.dumps(rows[-1]))
        for way in ("roi", "loader", "loader-inline"):
            if any(r.get("way") == way and r.get("batch") == b and "error" in r for r in rows):
                continue
            f = Feeder(raw, b, way) if way != "loader-inline" else Inline(raw, b)
            try:
                r = train_rate(b, steps, f)
            finally:
                f.close()
            r.update(
                batch=b,
                train=f"nvjpeg-{way}",
                of_synthetic=r["img_s"] / alone["img_s"],
                feeder_cpu_ms_per_batch=1e3 * f.cpu_s / max(1, f.batches),
            )
            rows.append(r)
            print(json.dumps(r))
    if a.json:
        a.json.write_text(json.dumps({"mean_kb": mean_kb, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
