"""One DDP rank of ``feedbench verify``: train a model on a loader, time every step, write its part.

Started by :mod:`feedbench.verify` through torchrun, never by hand::

    python -m torch.distributed.run --standalone --nproc-per-node G \\
        -m feedbench.verify.worker --loader baseline --source DATA --out-dir DIR ...

Each rank trains ``warmup + steps`` steps (NCCL on GPUs, gloo on the CPU) and writes its own part
file ``DIR/rank{R}.json`` (a :class:`~feedbench.verify.results.StepSeries`) at the end of the
warm-up, every few seconds while it runs, at the end, and on the way out after an error or SIGTERM;
so when a rank dies the others' steps are still there. How each part of a step is timed:
:data:`feedbench.verify.results.TIMING`.

Here: its arguments and its run; its setup (device, process group, loader, model) is in
:mod:`feedbench.verify.worker.setup`, its timed loop in :mod:`feedbench.verify.worker.loop`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

from feedbench.core.errors import FeedbenchError
from feedbench.core.supervise import Terminated, exit_on_sigterm, leave_without_finalizing
from feedbench.core.words import count
from feedbench.scan.factory import run_exit_handlers
from feedbench.verify.config import COMPILE_MODES, CPU_AFFINITIES, STREAM_PRIORITIES
from feedbench.verify.loaders import is_user
from feedbench.verify.results import StepSeries
from feedbench.verify.worker.loop import Epochs, TimedLoop, write_part
from feedbench.verify.worker.setup import (
    Rank,
    barrier,
    build_training,
    join_group,
    open_device,
    open_loader,
    pin_cores,
)
from loaders.errors import LoaderError, last_line


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
    # after the window: blocks of this many steps on the loader and on a synthetic batch in turn
    p.add_argument("--interleave", type=int, default=0)
    # diagnostic: a CUDA kernel trace of this many measured steps (after 10), to trace-rankR.json.gz
    p.add_argument("--trace-steps", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--timeout-s", type=float, default=600.0, help="collective timeout")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    """Train and time this rank; 0 when every step is done. A failure ends the process here."""
    started_mono = time.monotonic()
    rank = Rank.from_env()
    part = os.path.join(args.out_dir, f"rank{rank.rank}.json")
    series = StepSeries(rank=rank.rank)
    done = False
    loader = None

    def last_words() -> None:
        series.error = series.error or "stopped (SIGTERM)"
        write_part(part, series, False)

    exit_on_sigterm(last_words)
    try:
        series.cpus = pin_cores(args, rank)
        rank = open_device(args, rank)
        join_group(args, rank)
        torch.manual_seed(args.seed + rank.rank)
        loader = open_loader(args, rank, series)
        training = build_training(args, rank, series)
        TimedLoop(args, rank, series, training, Epochs(loader), part, started_mono).run()
        check_fed(rank, series, loader)
        series.labels_synthesised = getattr(loader, "synthesised", False)
        series.image_height, series.image_width = getattr(loader, "image_hw", None) or (None,) * 2
        barrier(rank)  # every rank finishes its window before any leaves
        done = True
        dist.destroy_process_group()
        return 0
    except (FeedbenchError, LoaderError) as e:  # the data or the options, said in one line
        series.error = str(e)
        if getattr(e, "details", None):  # the user's loader raised: their frames, then the line
            print(e.details, file=sys.stderr, flush=True)
        print(f"error: {e}", file=sys.stderr, flush=True)
        code = 2
    except Terminated:
        series.error = series.error or "stopped (SIGTERM)"
        code = 143
    except Exception as e:
        series.error = one_line(e)[:500]
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


def one_line(e: BaseException) -> str:
    """``e`` in one line. DataLoader re-raises a worker's exception with the worker's whole
    traceback as its message ("Caught T in DataLoader worker process N. Original Traceback ...");
    its last line is what the worker raised, and says more than the frames before it."""
    text = str(e)
    if text.startswith("Caught ") and "\nOriginal Traceback" in text:
        where = text.split("\n", 1)[0].rstrip(".").partition(" in ")[2]
        return f"{last_line(text)} (in {where})"
    return f"{type(e).__name__}: {' '.join(text.split())}"


def check_fed(rank: Rank, series: StepSeries, loader) -> None:
    """A FeedbenchError when this rank's measured window trained on no image: every batch came
    empty (every sample skipped, e.g. none could be decoded), and a rate of 0 measures nothing."""
    if sum(series.images) > 0:
        return
    skipped = loader.skipped()
    if skipped:
        why = f"{count(len(skipped), 'skip')}, e.g. {skipped[0].path}: {skipped[0].reason}"
    else:
        why = "every batch it gave was empty"
    steps = count(len(series.step_s), "measured step")
    raise FeedbenchError(f"rank {rank.rank} trained on no image in its {steps}: {why}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    code = run(args)
    if is_user(args.loader):
        run_exit_handlers(code)  # the user's loader cleans up there (shared memory, files)
    leave_without_finalizing(code)  # its results are written: no interpreter teardown
