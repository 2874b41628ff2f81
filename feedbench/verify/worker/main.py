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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from feedbench.core.choices import option_value
from feedbench.core.envelope import to_dict
from feedbench.core.errors import FeedbenchError
from feedbench.core.files import write_atomic
from feedbench.core.supervise import Terminated, exit_on_sigterm, leave_without_finalizing
from feedbench.scan.factory import run_exit_handlers
from feedbench.verify.config import COMPILE_MODES, CPU_AFFINITIES, STREAM_PRIORITIES
from feedbench.verify.loaders import LIBRARY, VerifyLoader, is_user, make_loader
from feedbench.verify.results import SYNTHETIC, PairedBlock, StepSeries
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
# steps on a batch made on the device before the loader starts: cudnn's algorithm search, the
# allocator, DDP's bucket rebuild and torch.compile happen there, not while the loader runs ahead
PRIME_STEPS = 3
# At the warm-up's end, batches the loader holds ready are taken without a step (at most this
# many, and half an epoch): a slow warm-up step after the loader started (a user's images of
# another shape searched by cudnn, a recompile, a pause) let it fill its queue, and a window
# that began with that queue would read it instead of the loader's rate.
SKIP_READY_MAX = 64
READY_S = 0.005  # a next() this quick took a batch that was ready; a longer one waited for it


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
    torch.cuda.synchronize()
    tracer.stop()
    tracer.export_chrome_trace(path)


def write_part(path: str, series: StepSeries, done: bool) -> None:
    write_atomic(path, json.dumps({"done": done, "series": to_dict(series)}) + "\n")


@dataclass
class Rank:
    """Who this process is in the job (torchrun's environment) and where it trains: its device
    and the clock that marks its steps (set by :func:`open_device`)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1  # ranks on this machine
    device: Any = None  # torch.device
    clock: Any = field(default_factory=HostClock)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Rank:
        world = int(env.get("WORLD_SIZE", "1"))
        return cls(
            rank=int(env.get("RANK", "0")),
            world=world,
            local_rank=int(env.get("LOCAL_RANK", "0")),
            local_world=int(env.get("LOCAL_WORLD_SIZE", str(world))),
        )

    @property
    def cuda(self) -> bool:
        return self.device is not None and self.device.type == "cuda"


def pin_cores(args: argparse.Namespace, rank: Rank) -> str:
    """With ``--cpu-affinity split``, pin this process to its share of the cores; the cores it
    runs on, as the kernel lists them. Called before CUDA, torch's thread pools and the loader
    start: their threads inherit it."""
    if args.cpu_affinity == "split":
        share = share_of_cpus(os.sched_getaffinity(0), rank.local_rank, rank.local_world)
        os.sched_setaffinity(0, share)
    return cpu_list(os.sched_getaffinity(0))


def open_device(args: argparse.Namespace, rank: Rank) -> Rank:
    """``rank`` with its device and clock: its GPU and CUDA events (on the highest-priority
    stream with ``--stream-priority high``), or the CPU and perf_counter."""
    if args.device != "cuda":
        return replace(rank, device=torch.device("cpu"), clock=HostClock())
    if not torch.cuda.is_available():
        raise FeedbenchError("--device cuda, but CUDA is not available to this rank")
    device = torch.device("cuda", rank.local_rank)
    torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = True
    if args.stream_priority == "high":
        # every op of this rank (model, loader copies, events) on the device's highest-priority
        # stream: a GPU loader's kernels (DALI's, on its own priority-0 stream) then yield to
        # training's
        from loaders import high_priority_stream

        torch.cuda.set_stream(high_priority_stream(device))
    return replace(rank, device=device, clock=CudaClock(device))


def join_group(args: argparse.Namespace, rank: Rank) -> None:
    """Join the job's process group (NCCL on GPUs, gloo on the CPU; torchrun's rendezvous)."""
    dist.init_process_group(
        "nccl" if rank.cuda else "gloo",
        timeout=timedelta(seconds=args.timeout_s),
        **({"device_id": rank.device} if rank.cuda else {}),
    )


def barrier(rank: Rank) -> None:
    """Every rank here, with its device idle, before and after."""
    rank.clock.sync()
    if rank.cuda:
        dist.barrier(device_ids=[rank.local_rank])
    else:
        dist.barrier()
    rank.clock.sync()


def key_values(items: list[str]) -> dict[str, Any]:
    """``["KEY=VALUE", ...]`` → ``{KEY: value}`` (numbers and booleans as such)."""
    return {k: option_value(v) for k, _, v in (o.partition("=") for o in items)}


def open_loader(args: argparse.Namespace, rank: Rank, series: StepSeries) -> VerifyLoader:
    """This rank's loader (its shard, batches on its device), recorded in ``series``; a
    FeedbenchError when it holds no full batch."""
    loader = make_loader(
        args.loader, args.source, args.batch_size, rank=rank.rank, world_size=rank.world,
        local_rank=rank.local_rank, image_size=args.image_size, workers=args.workers,
        seed=args.seed, device=rank.device, num_classes=args.num_classes,
        dtype=torch.bfloat16 if rank.cuda else torch.float32, channels_last=rank.cuda,
        synthetic_batches=args.synthetic_batches, options=key_values(args.option),
    )  # fmt: skip
    series.workers = loader.workers
    try:
        series.batches_per_epoch = len(loader)
    except TypeError:  # the user's iterable loader: its epochs are counted as they end
        return loader
    if series.batches_per_epoch < 1:
        raise FeedbenchError(
            f"{args.loader}: no full batch of {args.batch_size} per rank on {rank.world} ranks: "
            "the dataset is too small"
        )
    return loader


@dataclass
class Training:
    """What a step trains with."""

    ddp: DDP
    model: Any  # what a step calls: ``ddp``, or its torch.compile'd wrapper
    comm: CommTimer  # the all-reduce hook's marks
    criterion: Any
    optimizer: Any


def ddp_settings(ddp: DDP) -> str:
    """The settings DDP runs with, read back from DDP itself (defaults where not asked)."""
    return (
        f"broadcast_buffers={ddp.broadcast_buffers} "
        f"gradient_as_bucket_view={ddp.gradient_as_bucket_view} "
        f"static_graph={ddp.static_graph} bucket_cap_mb={ddp.bucket_bytes_cap / 2**20:g}"
    )


def build_training(args: argparse.Namespace, rank: Rank, series: StepSeries) -> Training:
    """The model in DDP (``--ddp-option`` settings, the timed all-reduce hook), compiled when
    asked, with its loss and optimizer; what DDP and compile run with is recorded in ``series``."""
    model = build_model(args.model, args.num_classes)
    ddp_kw = key_values(args.ddp_option)
    if rank.cuda:
        model = model.to(rank.device, memory_format=torch.channels_last)
        ddp = DDP(model, device_ids=[rank.local_rank], output_device=rank.local_rank, **ddp_kw)
    else:
        ddp = DDP(model, **ddp_kw)
    series.ddp = ddp_settings(ddp)
    comm = CommTimer(rank.clock, rank.world)
    ddp.register_comm_hook(comm, timed_allreduce)
    step_model: Any = ddp
    if args.compile != "off":  # compiled at the first warm-up step(s)
        mode = None if args.compile == "default" else args.compile
        step_model = torch.compile(ddp, mode=mode)
        series.compiled = args.compile
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    return Training(ddp, step_model, comm, torch.nn.CrossEntropyLoss(), optimizer)


class Epochs:
    """A loader's batches without end: when an epoch runs out the next starts (``set_epoch``,
    then a new iterator). ``epoch`` is the epoch of the batch last returned."""

    def __init__(self, loader: VerifyLoader) -> None:
        self.loader = loader
        self.epoch = 0
        self._it: Iterator | None = None
        self._taken = 0  # batches of this epoch

    def __iter__(self) -> Epochs:
        return self

    def __next__(self) -> tuple[Any, Any]:
        while True:
            if self._it is None:
                self.loader.set_epoch(self.epoch)
                self._it = iter(self.loader)
                self._taken = 0
            try:
                batch = next(self._it)
                self._taken += 1
                return batch
            except StopIteration:
                if not self._taken:  # the next epoch would be as empty: no end to waiting
                    raise FeedbenchError(
                        f"{self.loader.name}: epoch {self.epoch} yielded no batch"
                    ) from None
                self._it = None
                self.epoch += 1


class Repeat:
    """One batch without end, as the synthetic loader gives it (the paired phase's blocks)."""

    epoch = 0

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.batch = (images, labels)

    def __iter__(self) -> Repeat:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.batch


class TimedLoop:
    """``warmup + steps`` training steps, each timed (:data:`feedbench.verify.results.TIMING`)
    into ``series``: a step's marks are read ``clock.lag`` steps later (the host runs ahead of
    the GPU); warm-up steps go to ``warmup_step_s`` only; the measured window starts after a
    barrier; the part file is rewritten at the window's start and every ``flush_every_s``."""

    def __init__(
        self, args: argparse.Namespace, rank: Rank, series: StepSeries, training: Training,
        batches: Epochs, part: str, flushed_mono: float | None = None,
    ) -> None:  # fmt: skip
        self.args, self.rank, self.series, self.training = args, rank, series, training
        self.batches, self.part, self.clock = batches, part, rank.clock
        self.relabel = args.loader in LIBRARY  # labels from .cls files may exceed num_classes
        self.flush_every_s = FLUSH_EVERY_S
        self.flushed_mono = time.monotonic() if flushed_mono is None else flushed_mono
        self.pending: deque[Marks] = deque()  # steps whose marks are not read yet
        self.t0: float | None = None  # perf_counter at the window's start
        self.trace_from = args.warmup + min(10, max(0, args.steps - args.trace_steps))
        self.tracer = None
        self.prev_end = self.clock.mark()
        self.workers0 = None  # the loader's workers' totals at the window's start

    def run(self) -> None:
        self.prime()
        for step in range(self.args.warmup + self.args.steps):
            self.step(step)
        self.finish()
        if self.args.interleave > 0 and self.args.loader != SYNTHETIC:
            self.paired(self.args.interleave)

    def step(self, step: int) -> None:
        """Train step number ``step`` (counted from the first warm-up step) and file its marks."""
        self.trace(step)
        if step == self.args.warmup:
            self.start_window()
        self.pending.append(self.train(step))
        while len(self.pending) > self.clock.lag:
            self.record(self.pending.popleft())
        if step >= self.args.warmup and time.monotonic() - self.flushed_mono > self.flush_every_s:
            write_part(self.part, self.series, False)
            self.flushed_mono = time.monotonic()

    def prime(self) -> None:
        """Train ``PRIME_STEPS`` steps on a batch made here, before the loader's first batch.

        The first step is slow (ResNet-50 at 256 on an H200: 6.8 s, cudnn's search); a loader
        started before it fills its queue meanwhile (16 workers x 4 batches), and a short window
        then drains that queue instead of measuring the loader's rate: run 13's torch loader read
        0% data wait at 256 for 70 steps while it made fewer images a second than the step
        takes. Started after this, a loader slower than the step cannot get ahead of it."""
        t = self.training
        t0 = time.perf_counter()
        images, labels = self.made_batch()
        for _ in range(PRIME_STEPS):
            t.comm.new_step()
            with self.autocast():
                loss = t.criterion(t.model(images), labels)
            loss.backward()
            t.optimizer.step()
            t.optimizer.zero_grad(set_to_none=True)
        self.clock.sync()
        self.series.primed_s = time.perf_counter() - t0
        self.prev_end = self.clock.mark()

    def made_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch made on the device, in the layout the loaders deliver."""
        args, device = self.args, self.rank.device
        images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
        if self.rank.cuda:
            images = images.contiguous(memory_format=torch.channels_last)
        labels = torch.randint(0, args.num_classes, (args.batch_size,), device=device)
        return images, labels

    def paired(self, block_steps: int) -> None:
        """After the window: blocks of ``block_steps`` steps on a batch made on the device and
        on the loader's batches in turn, synthetic first and last, as many loader steps as the
        window had (at least two blocks), each block's steps timed into ``series.paired``.

        The loader is not drained between blocks: its workers rest while a synthetic block runs
        (its queue full), as a loader that keeps up rests in training, so a loader block costs
        the step what such a loader costs it; its waits are not judged here (the window's are)."""
        loader_batches = self.batches
        synthetic = Repeat(*self.made_batch())
        blocks = max(2, -(-self.args.steps // block_steps))
        sources = ["synthetic", *["loader", "synthetic"] * blocks]
        barrier(self.rank)
        step = self.args.warmup + self.args.steps
        owner: dict[int, PairedBlock] = {}
        self.prev_end = self.clock.mark()
        try:
            for source in sources:
                block = PairedBlock(source)
                self.series.paired.append(block)
                self.batches = loader_batches if source == "loader" else synthetic
                for _ in range(block_steps):
                    owner[step] = block
                    self.pending.append(self.train(step))
                    while len(self.pending) > self.clock.lag:
                        self.file_paired(self.pending.popleft(), owner)
                    step += 1
                    if time.monotonic() - self.flushed_mono > self.flush_every_s:
                        write_part(self.part, self.series, False)
                        self.flushed_mono = time.monotonic()
            self.clock.sync()
            while self.pending:
                self.file_paired(self.pending.popleft(), owner)
        finally:
            self.batches = loader_batches

    def file_paired(self, m: Marks, owner: dict[int, PairedBlock]) -> None:
        """A paired-phase step's times, added to its block's."""
        t, block = read_marks(m, self.clock), owner.pop(m.step)
        block.images += t.images
        block.step_s.append(t.step_s)
        block.data_wait_s.append(t.data_wait_s)

    def train(self, step: int) -> Marks:
        """One step: next batch, forward + backward (DDP's all-reduce), optimizer; its marks."""
        clock, t, args = self.clock, self.training, self.args
        start = self.prev_end
        pre = clock.mark()
        h0 = time.perf_counter()
        images, labels = next(self.batches)
        if args.sync_each_step and self.rank.cuda:  # diagnostic: what pacing alone costs a loader
            torch.cuda.current_stream(self.rank.device).synchronize()
        if self.relabel:
            labels = labels.long() % args.num_classes
        host_wait = time.perf_counter() - h0
        m_data = clock.mark()
        comm = t.comm.new_step()
        with self.autocast():
            loss = t.criterion(t.model(images), labels)
        loss.backward()
        m_bwd = clock.mark()
        t.optimizer.step()
        t.optimizer.zero_grad(set_to_none=True)
        m_end = clock.mark()
        self.prev_end = m_end
        n = int(images.shape[0])
        return Marks(step, self.batches.epoch, n, host_wait, start, pre, m_data, m_bwd, m_end, comm)

    def autocast(self):
        if self.rank.cuda:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def record(self, m: Marks) -> None:
        """A step's marks, read once its events are complete: measured or warm-up."""
        t = read_marks(m, self.clock)
        if m.step >= self.args.warmup:
            append(self.series, t)
        else:
            self.series.warmup_step_s.append(t.step_s)

    def start_window(self) -> None:
        """The end of the warm-up: its steps filed apart, the batches the loader holds ready
        taken, the part written, every rank met."""
        while self.pending:  # the warm-up's steps: timed, kept apart
            self.series.warmup_step_s.append(read_marks(self.pending.popleft(), self.clock).step_s)
        self.skip_ready()
        write_part(self.part, self.series, False)
        self.flushed_mono = time.monotonic()  # just written: the next flush is due from here
        barrier(self.rank)
        self.t0 = time.perf_counter()
        self.series.window_start_mono = time.monotonic()
        self.prev_end = self.clock.mark()
        self.workers0 = self.worker_times()
        if os.environ.get("FEEDBENCH_SCHEDSTAT"):  # diagnostic: the threads' scheduling
            from feedbench.verify.worker import schedstat

            self.sched0 = schedstat.snapshot()

    def skip_ready(self) -> None:
        """Take the batches the loader holds ready, without a step, until a ``next()`` waits
        (``READY_S``) or ``SKIP_READY_MAX`` (half an epoch, if less) are taken; then every rank
        takes as many as the most any took, so their epochs stay in step. A loader slower than
        the step then starts the window with its queue empty, as it runs in a long training; a
        faster one refills its queue in the window's first steps."""
        epoch = self.series.batches_per_epoch or 2 * SKIP_READY_MAX
        # --warmup 0 measures from the loader's first batch on, its start-up included: none taken
        cap = min(SKIP_READY_MAX, epoch // 2) if self.args.warmup else 0
        taken = 0
        while taken < cap:
            t0 = time.perf_counter()
            next(self.batches)
            taken += 1
            if time.perf_counter() - t0 > READY_S:
                break
        most = torch.tensor([taken], device=self.rank.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        self.series.skipped_ready = int(most.item())
        for _ in range(self.series.skipped_ready - taken):
            next(self.batches)

    def finish(self) -> None:
        """The end of the measured window: the last steps read, the window's length recorded."""
        self.clock.sync()
        if self.t0 is not None:
            self.series.window_s = time.perf_counter() - self.t0
            self.series.window_end_mono = time.monotonic()
            self.record_workers()
        if getattr(self, "sched0", None) is not None:
            from feedbench.verify.worker import schedstat

            folder = os.environ["FEEDBENCH_SCHEDSTAT"]
            os.makedirs(folder, exist_ok=True)
            name = f"{self.args.loader}-b{self.args.batch_size}-{os.getpid()}.json"
            extra = {"loader": self.args.loader, "options": self.args.option,
                     "workers": self.args.workers, "window_s": self.series.window_s,
                     "cpus": self.series.cpus}  # fmt: skip
            schedstat.write(os.path.join(folder, name), self.sched0, schedstat.snapshot(),
                            self.args.steps, extra)  # fmt: skip
        while self.pending:
            self.record(self.pending.popleft())
        if self.rank.cuda:
            self.series.peak_mem_bytes = int(torch.cuda.max_memory_allocated(self.rank.device))

    def worker_times(self):
        """The loader's workers' running totals now (None: it keeps none)."""
        loader = self.batches.loader if isinstance(self.batches, Epochs) else None
        return loader.worker_times() if loader is not None else None

    def record_workers(self) -> None:
        """Each worker's batches, seconds making them and waiting for a slot in the window."""
        start, end = self.workers0, self.worker_times()
        if start is None or end is None:
            return
        done = end - start
        self.series.worker_batches = [int(x) for x in done[:, 0]]
        self.series.worker_make_s = [float(x) for x in done[:, 1]]
        self.series.worker_slot_wait_s = [float(x) for x in done[:, 2]]

    def trace(self, step: int) -> None:
        """The diagnostic CUDA trace (``--trace-steps``): started and stopped at its steps."""
        args = self.args
        if args.trace_steps and self.rank.cuda and step == self.trace_from:
            self.tracer = start_trace()
        if self.tracer is not None and step == self.trace_from + args.trace_steps:
            name = f"trace-rank{self.rank.rank}.json.gz"
            stop_trace(self.tracer, os.path.join(args.out_dir, name))
            self.tracer = None


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
        series.labels_synthesised = getattr(loader, "synthesised", False)
        series.image_height, series.image_width = getattr(loader, "image_hw", None) or (None,) * 2
        barrier(rank)  # every rank finishes its window before any leaves
        done = True
        dist.destroy_process_group()
        return 0
    except FeedbenchError as e:
        series.error = str(e)
        if e.details:  # the user's loader raised: their frames, then the line
            print(e.details, file=sys.stderr, flush=True)
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
    code = run(args)
    if is_user(args.loader):
        run_exit_handlers(code)  # the user's loader cleans up there (shared memory, files)
    leave_without_finalizing(code)  # its results are written: no interpreter teardown
