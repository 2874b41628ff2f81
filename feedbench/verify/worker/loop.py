"""A verify rank's timed training loop (:class:`TimedLoop`: its warm-up, measured window and
paired phase), the batch sources it steps through (:class:`Epochs`, :class:`Repeat`), the part
file it writes (:func:`write_part`) and its diagnostic CUDA trace."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from feedbench.core.envelope import to_dict
from feedbench.core.errors import FeedbenchError
from feedbench.core.files import write_atomic
from feedbench.verify.loaders import LIBRARY, VerifyLoader
from feedbench.verify.results import SYNTHETIC, PairedBlock, StepSeries
from feedbench.verify.worker.setup import Rank, Training, barrier
from feedbench.verify.worker.timing import Marks, append, read_marks

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
        self.queue(self.train(step), self.record)
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
                    self.queue(self.train(step), lambda m: self.file_paired(m, owner))
                    step += 1
                    if time.monotonic() - self.flushed_mono > self.flush_every_s:
                        write_part(self.part, self.series, False)
                        self.flushed_mono = time.monotonic()
            self.drain(lambda m: self.file_paired(m, owner))
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
        self.refill()
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
        faster one refills it in the unmeasured steps that follow (:meth:`refill`)."""
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

    def refill(self) -> None:
        """As many unmeasured steps as batches were taken ready (their times go with the
        warm-up's), before the window starts.

        Taking the ready batches frees every worker at once, and workers freed together make
        their next batches together: a loader with twice the step's supply then waits in the
        window's first steps until that round is made (run 16, wds at 256 per GPU: 0.4-0.5 s
        in steps 1-8 of the window, none after; 6-7.5% of a 100-step window). In training that
        happens once, at the start. A loader slower than the step waits through these steps as
        it would in the window, so its rate there is not changed."""
        for _ in range(self.series.skipped_ready or 0):
            self.queue(self.train(-1), self.record)  # a step number before the window's: warm-up
        self.drain(self.record)

    def queue(self, m: Marks, file) -> None:
        """A step's marks queued; those ``clock.lag`` steps old are read and filed (``file``)."""
        self.pending.append(m)
        while len(self.pending) > self.clock.lag:
            file(self.pending.popleft())

    def drain(self, file) -> None:
        """Every queued step's marks read (after the device is done) and filed."""
        self.clock.sync()
        while self.pending:
            file(self.pending.popleft())

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
