"""One DDP rank of ``feedbench verify``: train a model on a loader, time every step, write its part.

Started by :mod:`feedbench.verify` through torchrun, never by hand::

    python -m torch.distributed.run --standalone --nproc-per-node G \\
        -m feedbench.verify.worker --loader baseline --source DATA --out-dir DIR ...

Each rank trains ``warmup + steps`` steps (NCCL on GPUs, gloo on the CPU) and writes its own part
file ``DIR/rank{R}.json`` (a :class:`~feedbench.verify.results.StepSeries`) at the end of the
warm-up, every few seconds while it runs, at the end, and on the way out after an error or SIGTERM;
so when a rank dies the others' steps are still there. How each part of a step is timed:
:data:`feedbench.verify.results.TIMING`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
from collections import deque
from typing import Any

from feedbench.core.envelope import to_dict, write_atomic
from feedbench.core.errors import FeedbenchError
from feedbench.core.supervise import Terminated, exit_on_sigterm, leave_without_finalizing
from feedbench.verify.config import COMPILE_MODES, CPU_AFFINITIES, STREAM_PRIORITIES
from feedbench.verify.results import StepSeries
from feedbench.verify.worker.models import build_model
from feedbench.verify.worker.timing import (
    CommTimer,
    CudaClock,
    HostClock,
    Marks,
    append,
    read_marks,
    timed_allreduce,
)

FLUSH_EVERY_S = 5.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m feedbench.verify.worker")
    p.add_argument("--loader", required=True)
    p.add_argument("--source", default="")
    p.add_argument("--model", default="smallcnn")
    p.add_argument("--batch-size", type=int, required=True, help="per rank")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--synthetic-batches", type=int, default=100)
    p.add_argument("--option", action="append", default=[], help="KEY=VALUE for build_loader")
    p.add_argument("--stream-priority", choices=STREAM_PRIORITIES, default="normal")
    p.add_argument("--ddp-option", action="append", default=[], help="KEY=VALUE for DDP")
    p.add_argument("--compile", choices=COMPILE_MODES, default="off", help="torch.compile mode")
    p.add_argument("--cpu-affinity", choices=CPU_AFFINITIES, default="inherit")
    p.add_argument("--sync-each-step", action="store_true", help=argparse.SUPPRESS)
    # diagnostic: a CUDA kernel trace of this many measured steps (after 10), to trace-rankR.json.gz
    p.add_argument("--trace-steps", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--timeout-s", type=float, default=600.0, help="collective timeout")
    return p.parse_args(argv)


def share_of_cpus(cpus: set[int] | list[int], index: int, parts: int) -> list[int]:
    """The ``index``-th of ``parts`` equal, contiguous shares of ``cpus`` (sorted)."""
    ordered = sorted(cpus)
    if parts < 1 or not 0 <= index < parts:
        raise ValueError(f"share {index} of {parts}")
    if len(ordered) < parts:
        raise FeedbenchError(
            f"--cpu-affinity split: {parts} ranks on this machine but only {len(ordered)} cores "
            "to split"
        )
    return ordered[index * len(ordered) // parts : (index + 1) * len(ordered) // parts]


def cpu_list(cpus) -> str:
    """``{0, 1, 2, 5}`` → ``"0-2,5"`` (the kernel's own list format)."""
    out: list[str] = []
    ordered = sorted(cpus)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def start_trace():
    """torch.profiler recording CUDA activity (kernels, copies, with their streams): every
    stream of the process, DALI's included. A diagnostic; it costs the traced steps time."""
    from torch.profiler import ProfilerActivity, profile

    tracer = profile(activities=[ProfilerActivity.CUDA])
    tracer.start()
    return tracer


def stop_trace(tracer, path: str) -> None:
    import torch

    torch.cuda.synchronize()
    tracer.stop()
    tracer.export_chrome_trace(path)


def write_part(path: str, series: StepSeries, done: bool) -> None:
    write_atomic(path, json.dumps({"done": done, "series": to_dict(series)}) + "\n")


def run(args: argparse.Namespace) -> int:
    """Train and time this rank; 0 when every step is done. A failure ends the process here."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from feedbench.core.choices import option_value
    from feedbench.verify.loaders import LIBRARY, make_loader

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    part = os.path.join(args.out_dir, f"rank{rank}.json")
    series = StepSeries(rank=rank)
    done = False
    cuda = args.device == "cuda"
    last_flush = time.monotonic()
    loader = None

    def last_words() -> None:
        series.error = series.error or "stopped (SIGTERM)"
        write_part(part, series, False)

    exit_on_sigterm(last_words)
    try:
        if args.cpu_affinity == "split":
            # before CUDA, torch's thread pools and the loader start: their threads inherit it
            local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
            os.sched_setaffinity(0, share_of_cpus(os.sched_getaffinity(0), local_rank, local_world))
        series.cpus = cpu_list(os.sched_getaffinity(0))
        if cuda:
            if not torch.cuda.is_available():
                raise FeedbenchError("--device cuda, but CUDA is not available to this rank")
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
            torch.backends.cudnn.benchmark = True
            if args.stream_priority == "high":
                # every op of this rank (model, loader copies, events) on the device's
                # highest-priority stream: a GPU loader's kernels (DALI's, on its own
                # priority-0 stream) then yield to training's
                from loaders import high_priority_stream

                torch.cuda.set_stream(high_priority_stream(device))
            clock: Any = CudaClock(device)
        else:
            device = torch.device("cpu")
            clock = HostClock()
        from datetime import timedelta

        dist.init_process_group(
            "nccl" if cuda else "gloo",
            timeout=timedelta(seconds=args.timeout_s),
            **({"device_id": device} if cuda else {}),
        )
        torch.manual_seed(args.seed + rank)
        dtype = torch.bfloat16 if cuda else torch.float32
        loader = make_loader(
            args.loader, args.source, args.batch_size, rank=rank, world_size=world,
            local_rank=local_rank, image_size=args.image_size, workers=args.workers,
            seed=args.seed, device=device, num_classes=args.num_classes, dtype=dtype,
            channels_last=cuda, synthetic_batches=args.synthetic_batches,
            options={k: option_value(v) for k, _, v in (o.partition("=") for o in args.option)},
        )  # fmt: skip
        series.workers = loader.workers
        series.batches_per_epoch = len(loader)
        if len(loader) < 1:
            raise FeedbenchError(
                f"{args.loader}: no full batch of {args.batch_size} per rank on {world} ranks: "
                "the dataset is too small"
            )
        model = build_model(args.model, args.num_classes)
        ddp_kw = {k: option_value(v) for k, _, v in (o.partition("=") for o in args.ddp_option)}
        if cuda:
            model = model.to(device, memory_format=torch.channels_last)
            ddp = DDP(model, device_ids=[local_rank], output_device=local_rank, **ddp_kw)
        else:
            ddp = DDP(model, **ddp_kw)
        series.ddp = (
            f"broadcast_buffers={ddp.broadcast_buffers} "
            f"gradient_as_bucket_view={ddp.gradient_as_bucket_view} "
            f"static_graph={ddp.static_graph} bucket_cap_mb={ddp.bucket_bytes_cap / 2**20:g}"
        )
        comm = CommTimer(clock, world)
        ddp.register_comm_hook(comm, timed_allreduce)
        step_model = ddp
        if args.compile != "off":  # compiled at the first warm-up step(s)
            mode = None if args.compile == "default" else args.compile
            step_model = torch.compile(ddp, mode=mode)
            series.compiled = args.compile
        criterion = torch.nn.CrossEntropyLoss()
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)

        def autocast():
            if cuda:
                return torch.autocast("cuda", dtype=torch.bfloat16)
            return contextlib.nullcontext()

        relabel = args.loader in LIBRARY  # labels from .cls files may exceed num_classes

        epoch, it = 0, None

        def next_batch():
            nonlocal epoch, it
            while True:
                if it is None:
                    loader.set_epoch(epoch)
                    it = iter(loader)
                try:
                    return next(it)
                except StopIteration:
                    it = None
                    epoch += 1

        def barrier() -> None:
            clock.sync()
            if cuda:
                dist.barrier(device_ids=[local_rank])
            else:
                dist.barrier()
            clock.sync()

        def record(m: Marks) -> None:
            """A step's marks, read once its events are complete: measured or warm-up."""
            t = read_marks(m, clock)
            if m.step >= args.warmup:
                append(series, t)
            else:
                series.warmup_step_s.append(t.step_s)

        total = args.warmup + args.steps
        pending: deque[Marks] = deque()
        t0 = None
        prev_end = clock.mark()
        tracer = None
        trace_from = args.warmup + min(10, max(0, args.steps - args.trace_steps))
        for step in range(total):
            measuring = step >= args.warmup
            if args.trace_steps and cuda and step == trace_from:
                tracer = start_trace()
            if tracer is not None and step == trace_from + args.trace_steps:
                stop_trace(tracer, os.path.join(args.out_dir, f"trace-rank{rank}.json.gz"))
                tracer = None
            if step == args.warmup:
                while pending:  # the warm-up's steps: timed, kept apart
                    series.warmup_step_s.append(read_marks(pending.popleft(), clock).step_s)
                write_part(part, series, False)
                barrier()
                t0 = time.perf_counter()
                series.window_start_mono = time.monotonic()
                prev_end = clock.mark()
            start = prev_end
            pre = clock.mark()
            h0 = time.perf_counter()
            images, labels = next_batch()
            if args.sync_each_step and cuda:  # diagnostic: what pacing alone costs a loader
                torch.cuda.current_stream(device).synchronize()
            if relabel:
                labels = labels.long() % args.num_classes
            host_wait = time.perf_counter() - h0
            m_data = clock.mark()
            marks = comm.new_step()
            with autocast():
                loss = criterion(step_model(images), labels)
            loss.backward()
            m_bwd = clock.mark()
            opt.step()
            opt.zero_grad(set_to_none=True)
            m_end = clock.mark()
            prev_end = m_end
            pending.append(
                Marks(
                    step,
                    epoch,
                    int(images.shape[0]),
                    host_wait,
                    start,
                    pre,
                    m_data,
                    m_bwd,
                    m_end,
                    marks,
                )  # fmt: skip
            )
            while len(pending) > clock.lag:
                record(pending.popleft())
            if measuring and time.monotonic() - last_flush > FLUSH_EVERY_S:
                write_part(part, series, False)
                last_flush = time.monotonic()
        clock.sync()
        if t0 is not None:
            series.window_s = time.perf_counter() - t0
            series.window_end_mono = time.monotonic()
        while pending:
            record(pending.popleft())
        if cuda:
            series.peak_mem_bytes = int(torch.cuda.max_memory_allocated(device))
        barrier()  # every rank finishes its window before any leaves
        done = True
        dist.destroy_process_group()
        return 0
    except FeedbenchError as e:
        series.error = str(e)
        print(f"error: {e}", file=sys.stderr, flush=True)
        code = 2
    except Terminated:
        series.error = series.error or "stopped (SIGTERM)"
        code = 143
    except Exception as e:
        series.error = f"{type(e).__name__}: {' '.join(str(e).split())}"[:500]
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            write_part(part, series, done)
        if done and loader is not None:
            with contextlib.suppress(Exception):
                loader.close()
    # a failed rank leaves at once: its peers may be stuck in a collective and its loader's
    # workers may be gone; torchrun stops the rest of the job (and the workers' process group)
    leave_without_finalizing(code)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    leave_without_finalizing(run(args))  # its results are written: no interpreter teardown
