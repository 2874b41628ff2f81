#!/usr/bin/env python3
"""Benchmark the loaders (and the JPEG decoders behind the CPU backends); write JSON to --out.

Runs here on the CPU and on a GPU box (``--device cuda``). Examples::

    # everything, on an existing feedbench sample (images/ and shards/), 16 cores, one H200
    python scripts/bench_loaders.py --data data --device cuda --workers 16 --out loaders.json
    # make the data first (8,000 ImageNet-like JPEGs, tree + 16 shards)
    python scripts/bench_loaders.py --make 8000 --data /tmp/fb8000 --device cuda --out out.json
    # sweep DALI's share for the hardware JPEG decoder
    python scripts/bench_loaders.py --data data --device cuda --only dali \
        --hw-decoder-load 0,0.5,0.65,0.8,1
    # only the single-core decoder comparison
    python scripts/bench_loaders.py --data data --only decoders --out decoders.json

Train pipeline throughout: RandomResizedCrop 224 + flip + normalise, batch 256, images delivered on
``--device``. Rates are images per second over the measured window (after ``--warmup`` batches),
with a CUDA synchronise before each clock read; "feeds" is rate / 4,700 img/s (ResNet-50 training
on one H200, the appetite in feedbench's profiles).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import glob
import io
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESNET50_H200_IMG_S = 4700.0


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bench_decoders(data_root: Path, images: int, repeat: int) -> list[dict]:
    """Single core, per image: read bytes → 224×224×3 uint8 (RandomResizedCrop + flip)."""
    import torch
    from PIL import Image
    from torchvision.transforms import v2

    from loaders.decode import CpuDecoder

    torch.set_num_threads(1)
    files = sorted(glob.glob(str(data_root / "images" / "*" / "*.jpg")))[:images]
    if not files:
        raise SystemExit(f"no JPEGs under {data_root / 'images'}")
    blobs = [Path(f).read_bytes() for f in files]
    stock = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])

    def pil_stock(data, out, rng):
        with Image.open(io.BytesIO(data)) as im:
            out[...] = np.asarray(stock(im.convert("RGB")))

    variants: dict[str, object] = {"pil-stock (torchvision RandomResizedCrop on PIL)": pil_stock}
    for name in ("pil", "simplejpeg", "opencv"):
        try:
            dec = CpuDecoder(224, True, name)
            if name == "opencv":
                import cv2

                cv2.setNumThreads(1)
            variants[f"{name} (crop first, DCT-scaled decode, uint8 resize)"] = dec.decode_into
            nodct = CpuDecoder(224, True, name)
            nodct.dct_scaling = False
            variants[f"{name} without DCT scaling"] = nodct.decode_into
        except ValueError as e:  # CpuDecoder refuses a decoder whose module is not installed
            variants[f"{name} (not installed: {str(e).rpartition(': ')[2]})"] = None
    out = np.empty((224, 224, 3), np.uint8)
    rows = []
    for label, fn in variants.items():
        if fn is None:
            rows.append({"decoder": label, "images_per_s": None})
            continue
        rng = np.random.default_rng(0)
        for d in blobs[:16]:
            fn(d, out, rng)
        best = 0.0
        for _ in range(repeat):
            t0 = time.perf_counter()
            for d in blobs:
                fn(d, out, rng)
            best = max(best, len(blobs) / (time.perf_counter() - t0))
        rows.append({"decoder": label, "images_per_s": round(best, 1), "images": len(blobs)})
        print(f"  {label:60s} {best:8.1f} img/s (1 core)", file=sys.stderr)
    return rows


def stock_loader(tree: Path, batch: int, workers: int, device: str):
    """The baseline: torchvision ImageFolder + PIL + v2 transforms + a plain DataLoader."""
    import torch
    from torchvision import datasets
    from torchvision.transforms import v2

    tf = v2.Compose(
        [
            v2.RandomResizedCrop(224, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.PILToTensor(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )
    ds = datasets.ImageFolder(str(tree), transform=tf)
    dl = torch.utils.data.DataLoader(
        ds,
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        pin_memory=device.startswith("cuda"),
        persistent_workers=workers > 0,
        drop_last=False,
    )

    class Stock:
        def __len__(self):
            return len(dl)

        def __iter__(self):
            for x, y in dl:
                yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)

        def close(self):
            it = getattr(dl, "_iterator", None)
            if it is not None and hasattr(it, "_shutdown_workers"):
                it._shutdown_workers()
            dl._iterator = None

    return Stock()


def measure(
    loader, device: str, warmup: int, min_images: int, batch: int, step_s: float = 0.0
) -> dict:
    """Iterate epochs until ``min_images`` were measured after ``warmup`` batches.

    ``step_s`` > 0: after each batch the consumer sleeps that long, an emulated training step
    (the host waiting for the GPU); the result then also gives the fraction of the measured time
    spent waiting for batches, as training would see it (epoch boundaries included).
    """
    seen = measured = 0
    t0 = None
    first_batch_s = None
    start = time.perf_counter()
    epochs = 0
    wait_s = 0.0
    while measured < min_images:
        epochs += 1
        t_ask = time.perf_counter()
        for images, _labels, *_ in loader:
            n = int(images.shape[0])
            seen += 1
            if first_batch_s is None:
                _sync(device)
                first_batch_s = time.perf_counter() - start
            if seen == warmup:
                _sync(device)
                t0 = time.perf_counter()
            elif t0 is not None:
                measured += n
                wait_s += time.perf_counter() - t_ask
            if step_s > 0:
                time.sleep(step_s)
            t_ask = time.perf_counter()
        if epochs > 1000:
            break
    _sync(device)
    seconds = time.perf_counter() - (t0 or start)
    rate = measured / seconds if seconds > 0 else 0.0
    out = {
        "images": measured,
        "seconds": round(seconds, 3),
        "images_per_s": round(rate, 1),
        "feeds_h200_resnet50": round(rate / RESNET50_H200_IMG_S, 2),
        "first_batch_s": round(first_batch_s or 0.0, 3),
        "epochs": epochs,
    }
    if step_s > 0:
        out["data_wait_fraction"] = round(wait_s / seconds, 4) if seconds > 0 else None
    return out


class OnDevice:
    """A CPU loader's batches copied to ``device`` (pinned, as a training loop would)."""

    def __init__(self, inner, device: str) -> None:
        self.inner, self.device = inner, device

    def __len__(self):
        return len(self.inner)

    def __iter__(self):
        for images, labels, *_ in self.inner:
            yield (
                images.pin_memory().to(self.device, non_blocking=True),
                labels.to(self.device, non_blocking=True),
            )

    def close(self):
        self.inner.close()


def loader_configs(args) -> list[tuple[str, str, dict]]:
    """(backend, layout, options) for every loader run asked for."""
    wanted = set(args.only.split(",")) if args.only else None

    def want(name: str) -> bool:
        return wanted is None or name in wanted

    configs: list[tuple[str, str, dict]] = []
    if want("stock"):
        configs.append(("stock", "tree", {}))
    if want("torch"):
        configs.append(("torch", "tree", {}))
        configs.append(("torch", "shards", {}))
    if want("wds"):
        configs.append(("wds", "shards", {}))
    if want("dali"):
        loads = [float(x) for x in args.hw_decoder_load.split(",")] if args.hw_decoder_load else []
        mmaps = (
            [x.strip().lower() == "true" for x in args.dont_use_mmap.split(",")]
            if (args.dont_use_mmap)
            else []
        )
        for load in loads or [None]:
            for no_mmap in mmaps or [None]:
                opts: dict = {}
                if load is not None:
                    opts["hw_decoder_load"] = load
                if no_mmap is not None:
                    opts["dont_use_mmap"] = no_mmap
                configs.append(("dali", "tree", opts))
                configs.append(("dali", "shards", opts))
    if want("dali-cpu") and args.device.startswith("cuda"):
        # DALI's own CPU pipeline (decode + augment on the CPU), batches copied to the GPU
        configs.append(("dali-cpu", "tree", {}))
    return configs


def build_one(args, backend: str, src: Path, shards: Path, opts: dict):
    from loaders import build_loader

    workers = args.workers
    device = args.device
    if backend == "stock":
        return stock_loader(src, args.batch_size, workers, device), workers
    if backend == "wds":
        workers = max(1, min(workers, len(glob.glob(str(shards / "*.tar")))))
    if backend == "dali-cpu":
        inner = build_loader(
            src, "dali", args.batch_size, device="cpu", workers=workers, dtype=args.dtype,
            channels_last=args.channels_last, **opts,
        )  # fmt: skip
        return OnDevice(inner, device), workers
    loader = build_loader(
        src, backend, args.batch_size, device=device, workers=workers, dtype=args.dtype,
        channels_last=args.channels_last, **opts,
    )  # fmt: skip
    return loader, workers


def summary(values: list[float]) -> dict:
    from feedbench.core.stats import spread

    rounded = {"cv": 4}  # rates to 0.1 img/s, the coefficient of variation to 4 places
    return {
        k: round(v, rounded.get(k, 1)) if isinstance(v, float) else v
        for k, v in spread(values).items()
    }


def bench_loaders(args, data_root: Path) -> list[dict]:
    """Every config ``--repeat`` times, interleaved (config 1..K, then again), each run with a
    freshly built loader; the row keeps every run and their mean, std, min and max."""
    import torch

    tree, shards = data_root / "images", data_root / "shards"
    configs = loader_configs(args)
    runs: list[list[dict]] = [[] for _ in configs]
    meta: list[dict] = [{} for _ in configs]
    for r in range(args.repeat):
        for k, (backend, kind, opts) in enumerate(configs):
            src = tree if kind == "tree" else shards
            label = f"{backend} {kind}" + "".join(f" {a}={b}" for a, b in opts.items())
            try:
                loader, workers = build_one(args, backend, src, shards, opts)
                result = measure(
                    loader, args.device, args.warmup, args.min_images, args.batch_size,
                    args.step_ms / 1e3,
                )  # fmt: skip
                loader.close()
                del loader
                gc.collect()
                meta[k]["workers"] = workers
            except Exception as e:  # a backend that cannot run here is reported, not fatal
                result = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
            runs[k].append(result)
            rate = result.get("images_per_s")
            print(
                f"  [{r + 1}/{args.repeat}] {label:40s} "
                + (f"{rate:9.1f} img/s" if rate is not None else result["error"])
                + (
                    f", data wait {result['data_wait_fraction']:.1%}"
                    if result.get("data_wait_fraction") is not None
                    else ""
                ),
                file=sys.stderr,
            )
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
    rows = []
    for k, (backend, kind, opts) in enumerate(configs):
        ok = [x for x in runs[k] if "images_per_s" in x]
        row: dict = {"backend": backend, "source": kind, **meta[k], **opts, "runs": runs[k]}
        if ok:
            rates = summary([x["images_per_s"] for x in ok])
            row["images_per_s"] = rates["mean"]
            row["images_per_s_spread"] = rates
            row["feeds_h200_resnet50"] = round(rates["mean"] / RESNET50_H200_IMG_S, 2)
            row["first_batch_s"] = summary([x["first_batch_s"] for x in ok])["mean"]
        else:
            row["error"] = runs[k][-1].get("error", "no run")
        rows.append(row)
        label = f"{backend} {kind}" + "".join(f" {a}={b}" for a, b in opts.items())
        if ok:
            sp = row["images_per_s_spread"]
            print(
                f"  {label:40s} {sp['mean']:9.1f} ± {sp['std']:.1f} img/s (n={sp['n']}, "
                f"min {sp['min']:.0f}, max {sp['max']:.0f})  feeds "
                f"{row['feeds_h200_resnet50']:.2f} H200s on ResNet-50",
                file=sys.stderr,
            )
        else:
            print(f"  {label:40s} {row['error']}", file=sys.stderr)
    return rows


def write_json(path: str, doc: dict) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--data", required=True, help="a feedbench sample root (images/ and shards/)")
    p.add_argument("--make", type=int, default=0, help="first make this many images in --data")
    p.add_argument("--per-shard", type=int, default=0, help="with --make: images per shard")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--warmup", type=int, default=3, help="batches not measured")
    p.add_argument("--min-images", type=int, default=4096, help="images to measure per config")
    p.add_argument(
        "--only", default="", help="comma list: decoders,stock,torch,wds,dali,dali-cpu (GPU only)"
    )
    p.add_argument("--hw-decoder-load", default="", help="DALI: comma list to sweep")
    p.add_argument("--dont-use-mmap", default="", help="DALI: e.g. false,true to sweep")
    p.add_argument("--repeat", type=int, default=1, help="runs per loader config, interleaved")
    p.add_argument(
        "--step-ms", type=float, default=0.0,
        help="emulated training step: sleep this long after each batch (reports data wait)",
    )  # fmt: skip
    p.add_argument("--decoder-images", type=int, default=300)
    p.add_argument("--out", default="", help="write the results as JSON here")
    args = p.parse_args()

    data_root = Path(args.data)
    if args.make:
        from feedbench.sample import SampleSpec, make_sample

        per_shard = args.per_shard or max(1, args.make // 16)
        print(f"making {args.make} images in {data_root} …", file=sys.stderr)
        make_sample(data_root, SampleSpec(images=args.make, seed=0, per_shard=per_shard))
    doc = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu_cores": len(os.sched_getaffinity(0)),
        "device": args.device,
        "data": str(data_root),
        "images": len(glob.glob(str(data_root / "images" / "*" / "*"))),
        "shards": len(glob.glob(str(data_root / "shards" / "*.tar"))),
        "batch_size": args.batch_size,
        "repeat": args.repeat,
        "resnet50_h200_img_s": RESNET50_H200_IMG_S,
    }
    try:
        import torch

        if args.device.startswith("cuda"):
            doc["gpu"] = torch.cuda.get_device_name(0)
    except Exception:  # pragma: no cover
        pass
    only = set(args.only.split(",")) if args.only else None
    if only is None or "decoders" in only:
        print("decoders:", file=sys.stderr)
        doc["decoders"] = bench_decoders(data_root, args.decoder_images, repeat=2)
        if args.out:
            write_json(args.out, doc)
    if only is None or only - {"decoders"}:
        print("loaders:", file=sys.stderr)
        doc["loaders"] = bench_loaders(args, data_root)
    if args.out:
        write_json(args.out, doc)
    else:
        json.dump(doc, sys.stdout, indent=2)
        print()


if __name__ == "__main__":
    main()
