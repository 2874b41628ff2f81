#!/usr/bin/env python3
"""Where a small batch's step goes (issue 29): training conditions interleaved in ONE process.

verify starts a process per run (~30 s of start-up for ~5 s of measurement) and the host's speed
drifts between runs, so a few points of loss cannot be told from noise. Here one process builds
ResNet-50 (bf16, channels_last, DDP on one GPU, SGD) and every loader once, then trains blocks of
``--steps`` steps under each condition in turn, ``--rounds`` times, and reports each condition's
rate as a ratio to the synthetic blocks of the same round (paired), with its spread. Conditions:

- ``synthetic``: one batch made on the GPU, no loader (verify's ceiling).
- ``synthetic+load``: the same, while ``--load-procs`` processes on the loader's cores decode
  JPEGs of the data at the rate the step consumes them (no loader in this process): does CPU work
  elsewhere on the host (caches, clocks) slow the launch thread?
- ``torch``, ``dali``, ``wds``: the library loaders with the defaults verify gives them.
- ``torch+pin``: the torch loader, with the training thread kept on a core of its own (the
  reserved ones): does the scheduler put it where a worker runs?
- ``torch@W``, ``wds@W``: the loader with ``W`` workers; ``torch#slots=0``: with the loader
  option ``slots=0`` (options after ``#``, several allowed).
- ``only:torch``, ``only:wds``, ``only:dali``: the loader alone, no training (its rate on the GPU).
- ``synthetic+gil``: a thread in this process runs ``--gil-ms`` of pure Python once a step
  (holding the GIL, as a loader's Python threads do): is the launch thread slowed by the GIL?
- ``synthetic+pinthread``: a thread in this process does what DataLoader's pin thread does with a
  batch, once a step: a new shared-memory buffer of a batch's bytes, copied into pinned memory,
  then dropped (mmap, page faults, a copy, munmap), little of it under the GIL.
  ``synthetic+mapthread``: only the mapping part (a new shared-memory buffer, every page touched,
  unmapped); ``synthetic+copythread``: only the copy (one kept buffer into one kept pinned one).

Every block also records, per step: TLB shootdowns (all CPUs, from /proc/interrupts: an unmap
in this process interrupts every core its threads ran on), this process's minor page faults,
and the main thread's involuntary context switches.  ``--mallopt`` sets glibc's mmap and trim
thresholds high for the whole process first (freed C buffers then stay mapped: no munmap per
batch in a library's threads), to be compared with a run without it.

A canary process on the last reserved core times a fixed piece of Python every 0.25 s: its
slow-down in a block is what the host did to a single thread meanwhile.

    python scripts/diag_step.py --data /tmp/fb --batch 64 --rounds 4 \\
        --conditions synthetic,synthetic+load,torch,torch+pin,dali,wds --out diag64.json

Device only (CUDA); not part of the product.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from feedbench.verify.loaders import make_loader  # noqa: E402
from feedbench.verify.worker.loop import Epochs  # noqa: E402
from feedbench.verify.worker.models import build_model  # noqa: E402
from loaders.affinity import RESERVE_CORES, loader_cores  # noqa: E402


def gil_thread(stop: threading.Event, period: float, busy: float) -> None:
    """Hold the GIL for ``busy`` s of pure Python every ``period`` s."""
    while not stop.is_set():
        t0 = time.perf_counter()
        x = 0
        while time.perf_counter() - t0 < busy:
            for i in range(500):
                x += i * i
        time.sleep(max(0.0, period - (time.perf_counter() - t0)))


def pin_thread(stop: threading.Event, period: float, nbytes: int) -> None:
    """DataLoader's pin thread's work on one batch, every ``period`` s."""
    while not stop.is_set():
        t0 = time.perf_counter()
        storage = torch.UntypedStorage._new_shared(nbytes)
        host = torch.empty(0, dtype=torch.uint8).set_(storage)
        pinned = host.pin_memory() if CUDA else host.clone()
        del host, storage, pinned
        time.sleep(max(0.0, period - (time.perf_counter() - t0)))


def map_thread(stop: threading.Event, period: float, nbytes: int) -> None:
    """The mapping part of the pin thread's work: a new shared buffer, touched, dropped."""
    while not stop.is_set():
        t0 = time.perf_counter()
        storage = torch.UntypedStorage._new_shared(nbytes)
        torch.empty(0, dtype=torch.uint8).set_(storage).fill_(1)
        del storage
        time.sleep(max(0.0, period - (time.perf_counter() - t0)))


def copy_thread(stop: threading.Event, period: float, nbytes: int) -> None:
    """The copy part of the pin thread's work: one kept buffer into one kept pinned buffer."""
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=CUDA)
    while not stop.is_set():
        t0 = time.perf_counter()
        dst.copy_(src)
        time.sleep(max(0.0, period - (time.perf_counter() - t0)))


HELPERS = {"+gil": None, "+pinthread": pin_thread, "+mapthread": map_thread,
           "+copythread": copy_thread}  # fmt: skip


def helper_threads(
    cond: str, args, period: float
) -> tuple[list[threading.Thread], threading.Event]:
    """The condition's threads in this process (+gil, +pinthread), started, once a ``period``
    (a step); set the event to stop them."""
    halt, threads = threading.Event(), []
    if "+gil" in cond:
        threads.append(threading.Thread(target=gil_thread, args=(halt, period, args.gil_ms / 1e3)))
    nbytes = args.batch * SIZE * SIZE * 3
    for tag, target in HELPERS.items():
        if tag in cond.split("#")[0] and target is not None:
            threads.append(threading.Thread(target=target, args=(halt, period, nbytes)))
    for t in threads:
        t.daemon = True
        t.start()
    return threads, halt


def schedstat() -> tuple[int, int]:
    """This thread's (ns on a CPU, ns waiting for one) so far."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            run, wait, _ = f.read().split()
        return int(run), int(wait)
    except (OSError, ValueError):
        return 0, 0


def tlb_shootdowns() -> int:
    """TLB shootdown interrupts so far, summed over the CPUs (0 where not shown)."""
    try:
        with open("/proc/interrupts") as f:
            for line in f:
                if line.lstrip().startswith("TLB:"):
                    return sum(int(x) for x in line.split()[1:] if x.isdigit())
    except OSError:
        pass
    return 0


def minor_faults() -> int:
    """This process's minor page faults so far."""
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def nonvoluntary_switches() -> int:
    """The calling thread's involuntary context switches so far."""
    try:
        with open("/proc/thread-self/status") as f:
            for line in f:
                if line.startswith("nonvoluntary_ctxt_switches"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def counters() -> tuple[int, int, int]:
    return tlb_shootdowns(), minor_faults(), nonvoluntary_switches()


def set_mallopt() -> None:
    """glibc: freed memory stays in the heap (no munmap/trim per batch), for the whole process."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 32 * 2**20)  # glibc's largest
    libc.mallopt(m_trim_threshold, 2**30)


def canary(stop, out, cpu: int) -> None:
    """Time a fixed piece of pure Python every 0.25 s on ``cpu``; (monotonic, seconds) pairs."""
    os.sched_setaffinity(0, {cpu})
    while not stop.is_set():
        t0 = time.perf_counter()
        x = 0
        for i in range(200_000):
            x += i * i
        out.put((time.monotonic(), time.perf_counter() - t0))
        time.sleep(0.25)


def burner(on, stop, files: list[str], rate: float, cpus: set[int], seed: int) -> None:
    """While ``on`` is set, decode + crop + resize the data's JPEGs at ``rate`` images/s."""
    import numpy as np

    from loaders.decode import CpuDecoder

    os.sched_setaffinity(0, cpus)
    os.nice(5)
    dec, rng = CpuDecoder(SIZE), np.random.default_rng(seed)
    out = np.empty((SIZE, SIZE, 3), np.uint8)
    blobs = [Path(f).read_bytes() for f in files]
    i, t_next = 0, time.monotonic()
    while not stop.is_set():
        if not on.wait(0.1):
            t_next = time.monotonic()
            continue
        dec.decode_into(blobs[i % len(blobs)], out, rng)
        i += 1
        t_next += 1.0 / rate
        pause = t_next - time.monotonic()
        if pause > 0:
            time.sleep(pause)


CUDA = torch.cuda.is_available()  # without it: a dry run of the script (smallcnn, 64 px, CPU)
SIZE = 224 if CUDA else 64


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


class Trainer:
    def __init__(self, batch: int, device) -> None:
        self.device, self.batch = device, batch
        self.last_rate = 2000.0  # img/s of the last synthetic block: the helper threads' pace
        model = build_model("resnet50" if CUDA else "smallcnn", 1000)
        model = model.to(device, memory_format=torch.channels_last)
        self.ddp = DDP(model, device_ids=[device.index] if CUDA else None)
        self.opt = torch.optim.SGD(self.ddp.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
        self.loss = torch.nn.CrossEntropyLoss()
        g = torch.Generator(device=device).manual_seed(0)
        self.synthetic = (
            torch.randn(batch, 3, SIZE, SIZE, device=device, generator=g)
            .to(torch.bfloat16)
            .contiguous(memory_format=torch.channels_last),
            torch.randint(0, 1000, (batch,), device=device, generator=g),
        )

    def step(self, images, labels) -> None:
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            loss = self.loss(self.ddp(images), labels)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def block(self, batches, steps: int, skip: int) -> dict:
        """``steps`` steps from ``batches`` (None: synthetic); rate over all but the first
        ``skip``; host seconds in next() and the main thread's CPU time."""
        wait = 0.0
        for k in range(steps):
            if k == skip:
                sync()
                t0, c0, wait = time.perf_counter(), time.thread_time(), 0.0
                s0, k0 = schedstat(), counters()
            h = time.perf_counter()
            if batches is None:
                images, labels = self.synthetic
            else:
                images, labels = next(batches)
                labels = labels.long() % 1000
            wait += time.perf_counter() - h
            self.step(images, labels)
        sync()
        dt = time.perf_counter() - t0
        s1, k1 = schedstat(), counters()
        n = (steps - skip) * self.batch
        tlb, faults, preempt = ((b - a) / (steps - skip) for a, b in zip(k0, k1, strict=True))
        return {"tlb": tlb, "faults": faults, "preempt": preempt,
                "run_ms": (s1[0] - s0[0]) / 1e6 / (steps - skip),
                "runq_ms": (s1[1] - s0[1]) / 1e6 / (steps - skip),
                "img_s": n / dt, "step_ms": 1e3 * dt / (steps - skip),
                "next_ms": 1e3 * wait / (steps - skip),
                "main_cpu": (time.thread_time() - c0) / dt}  # fmt: skip


def only_block(batches, steps: int, skip: int, batch: int) -> dict:
    for k in range(steps):
        if k == skip:
            sync()
            t0 = time.perf_counter()
        next(batches)
    sync()
    dt = time.perf_counter() - t0
    return {"img_s": (steps - skip) * batch / dt, "step_ms": 1e3 * dt / (steps - skip)}


def loader_options(name: str) -> dict:
    """``torch#slots=0#prefetch=2`` → ``{"slots": 0, "prefetch": 2}`` (the loader's options)."""
    import ast

    out = {}
    for part in name.split("#")[1:]:
        key, _, value = part.partition("=")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def open_batches(name: str, args, device):
    options = loader_options(name)
    loader_name, _, w = name.split("#")[0].partition("@")
    loader_name = loader_name.split("+")[0].removeprefix("only:")
    src = args.shards if loader_name == "wds" else args.images
    loader = make_loader(
        loader_name, src, args.batch, rank=0, world_size=1, local_rank=0, image_size=SIZE,
        workers=int(w) if w else None, seed=0, device=device, num_classes=1000,
        dtype=torch.bfloat16, channels_last=True, options=options,
    )  # fmt: skip
    return loader, Epochs(loader)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True, help="a feedbench sample root (images/, shards/)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--skip", type=int, default=15)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--conditions", default="synthetic,synthetic+load,torch,torch+pin,dali,wds")
    p.add_argument("--load-procs", type=int, default=8)
    p.add_argument("--load-rate", type=float, default=0, help="images/s (0: the synthetic rate)")
    p.add_argument("--gil-ms", type=float, default=1.0, help="+gil: Python per step, ms")
    p.add_argument("--mallopt", action="store_true", help="glibc thresholds high (see above)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    args.images, args.shards = os.path.join(args.data, "images"), os.path.join(args.data, "shards")
    return args


def join_group() -> torch.device:
    """This process as a DDP group of one (NCCL on the GPU, gloo without); its device."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    device = torch.device("cuda", 0) if CUDA else torch.device("cpu")
    if CUDA:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    else:
        dist.init_process_group("gloo", rank=0, world_size=1)
    return device


def start_helpers(args, conds, trainer, loader_cpus, reserved):
    """The canary on the last reserved core and (``+load``) the decoding processes, started:
    (their stop event, the load's on event, the canary's queue)."""
    ctx = mp.get_context("spawn")
    stop, on, q = ctx.Event(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=canary, args=(stop, q, reserved[-1]), daemon=True)]
    if any("+load" in c for c in conds):
        files = sorted(
            os.path.join(dp, f)
            for dp, _, fs in os.walk(args.images)
            for f in fs
            if f.endswith(".jpg")
        )[:256]
        probe = trainer.block(None, 60, 10)
        rate = args.load_rate or probe["img_s"]
        print(f"load: {args.load_procs} processes, {rate:.0f} images/s in all", flush=True)
        procs += [
            ctx.Process(target=burner, daemon=True,
                        args=(on, stop, files, rate / args.load_procs, loader_cpus, i))
            for i in range(args.load_procs)
        ]  # fmt: skip
    for pr in procs:
        pr.start()
    return stop, on, q


def open_sources(args, conds, device) -> dict:
    """Every loader the conditions name, built once, its start-up batches taken."""
    sources = {}
    for c in conds:
        base = c.split("+")[0]
        if base != "synthetic" and base not in sources:
            t0 = time.perf_counter()
            sources[base] = open_batches(base, args, device)
            for _ in range(args.skip):  # start-up (workers, DALI's pipeline) out of every block
                next(sources[base][1])
            print(f"{base}: ready in {time.perf_counter() - t0:.1f} s, "
                  f"{sources[base][0].workers} workers", flush=True)  # fmt: skip
    return sources


def run_block(c: str, r: int, args, trainer, sources, on, reserved) -> dict:
    """One block of condition ``c`` in round ``r``: its helpers started and stopped around it."""
    base = c.split("+")[0]
    batches = None if base == "synthetic" else sources[base][1]
    if "+load" in c:
        on.set()
        time.sleep(0.5)
    before = os.sched_getaffinity(0)
    threads, halt = helper_threads(c, args, args.batch / max(1.0, trainer.last_rate))
    if "+pin" in c and "+pinthread" not in c:
        os.sched_setaffinity(0, set(reserved[:1]))  # this (the main) thread only
    m0 = time.monotonic()
    if base.startswith("only:"):
        res = only_block(batches, args.steps, args.skip, args.batch)
    else:
        res = trainer.block(batches, args.steps, args.skip)
    m1 = time.monotonic()
    halt.set()
    for t in threads:
        t.join()
    if base == "synthetic" and not threads and "+" not in c:
        trainer.last_rate = res["img_s"]
    os.sched_setaffinity(0, before)
    on.clear()
    res.update(condition=c, round=r, mono=(m0, m1))
    print(f"r{r} {c:20s} {res['img_s']:8.0f} img/s  {res['step_ms']:6.2f} ms/step"
          f"  next {res.get('next_ms', 0):5.2f} ms  main cpu {res.get('main_cpu', 0):.2f}"
          f"  run {res.get('run_ms', 0):5.2f} runq {res.get('runq_ms', 0):5.2f} ms/step"
          f"  tlb {res.get('tlb', 0):6.1f} faults {res.get('faults', 0):7.1f}"
          f" preempt {res.get('preempt', 0):4.2f} /step",
          flush=True)  # fmt: skip
    return res


def add_canaries(rows: list[dict], q) -> None:
    """Each block's canary slow-down: the canary's median inside it over its median overall."""
    canaries = []
    while not q.empty():
        canaries.append(q.get())
    base_canary = statistics.median(s for _, s in canaries) if canaries else None
    for row in rows:
        m0, m1 = row["mono"]
        inside = [s for t, s in canaries if m0 <= t <= m1]
        row["canary"] = statistics.median(inside) / base_canary if inside and base_canary else None


def main() -> None:
    args = parse_args()
    if args.mallopt:
        set_mallopt()
    device = join_group()
    conds = args.conditions.split(",")
    every = set(os.sched_getaffinity(0))
    loader_cpus = loader_cores(RESERVE_CORES, 0, 1) or every
    reserved = sorted(every - loader_cpus) or [0]
    trainer = Trainer(args.batch, device)
    for _ in range(30):  # warm the GPU, cudnn's choices and the clocks before any block
        trainer.step(*trainer.synthetic)
    sync()
    stop, on, q = start_helpers(args, conds, trainer, loader_cpus, reserved)
    sources = open_sources(args, conds, device)
    rows = []
    for r in range(args.rounds):
        order = conds[r % len(conds) :] + conds[: r % len(conds)]  # rotate: no fixed neighbour
        rows += [run_block(c, r, args, trainer, sources, on, reserved) for c in order]
    stop.set()
    add_canaries(rows, q)
    summary = summarise(rows, conds)
    with open(args.out, "w") as f:
        meta = {"cpus": sorted(every), "reserved": reserved, "nproc": os.cpu_count()}
        json.dump({"args": vars(args), "rows": rows, "summary": summary, **meta}, f, indent=1)
    for c, s in summary.items():
        print(f"{c:18s} {s['img_s']:8.0f} img/s  of synthetic (paired) {s['ratio']:.3f} "
              f"± {s['ratio_sd']:.3f}  [{s['ratio_min']:.3f}–{s['ratio_max']:.3f}]  "
              f"of their mean {s['of_mean']:.3f}  "
              f"step {s['step_ms']:.2f} ms  next {s['next_ms']:.2f} ms"
              f"  runq {s['runq_ms']:.2f} ms  canary {s['canary']}"
              f"  tlb {s['tlb']:.1f} faults {s['faults']:.1f}"
              f" preempt {s['preempt']:.2f} /step")  # fmt: skip
    for ldr, _ in sources.values():
        with contextlib.suppress(Exception):
            ldr.close()
    os._exit(0)


def summarise(rows: list[dict], conds: list[str]) -> dict:
    """Per condition: its rate over its round's synthetic block (paired: ratio, sd, range) and
    over the mean of every synthetic block (``of_mean``: less swayed by one slow synthetic
    block on a host whose speed drifts between blocks)."""
    synth = {r["round"]: r["img_s"] for r in rows if r["condition"] == "synthetic"}
    synth_mean = statistics.mean(synth.values()) if synth else float("nan")
    out = {}
    for c in conds:
        mine = [r for r in rows if r["condition"] == c]
        ratios = [r["img_s"] / synth[r["round"]] for r in mine if r["round"] in synth]
        can = [r["canary"] for r in mine if r.get("canary")]
        out[c] = {
            "img_s": statistics.mean(r["img_s"] for r in mine),
            "of_mean": statistics.mean(r["img_s"] for r in mine) / synth_mean,
            "ratio": statistics.mean(ratios) if ratios else float("nan"),
            "ratio_sd": statistics.stdev(ratios) if len(ratios) > 1 else 0.0,
            "ratio_min": min(ratios, default=float("nan")),
            "ratio_max": max(ratios, default=float("nan")),
            "step_ms": statistics.mean(r["step_ms"] for r in mine),
            "next_ms": statistics.mean(r.get("next_ms", 0) for r in mine),
            "runq_ms": statistics.mean(r.get("runq_ms", 0) for r in mine),
            **{k: statistics.mean(r.get(k, 0) for r in mine) for k in ("tlb", "faults", "preempt")},
            "canary": round(statistics.mean(can), 3) if can else None,
        }
    return out


if __name__ == "__main__":
    main()
