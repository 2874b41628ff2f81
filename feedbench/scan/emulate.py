"""The emulated accelerator step on a real GPU (``scan --emulate gpu``).

A sleep cannot see a loader slow the step it feeds; at small batches that is where the loss
is (issue 29: the training thread launching kernels is the bottleneck, and a loader's threads,
copies and GPU decode slow it). Here a step does what a training step does to the host and the
device: the consumer's main thread launches real kernels (bf16 matmuls, sized by a calibration)
spread over the profile's host time per step. As in training, the thread does not wait for
the GPU: it takes the next batch while the GPU still runs the step, and every step is timed on
the GPU between events, as verify times its steps (:mod:`feedbench.core.clocks`). The data wait
is then what the GPU waited, not what the host did (a step the GPU needs 57 ms for hides a
`next()` of a few ms, as training does). A loader that takes the GIL, the cores or the GPU from
it makes the step longer than the same step measured alone before and after the pass (the mean:
a launch-bound step's own length drifts with the host, as verify's ceiling does): that excess
is the step's inflation, and it counts against the accelerator utilisation as verify's slower
step does against its ceiling.

Where the profile names a model torchvision has (``resnet50-h200``), the step is that model's
own training step (forward and backward under bf16 autocast, channels_last, SGD) on a batch
made on the GPU: its host work is the real launch thread's, whose length differs from host to
host (run 9 in BENCHMARKS: 37.7 ms a step at 64 per GPU where run 8's host took 30.8), so a
matmul calibration to the profile's figures would time another machine's step.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from feedbench.core.clocks import CudaClock

MODES = ("auto", "gpu", "sleep")
MATMUL_N = 2048  # one kernel ≈ 20-30 µs on an H200: a step of 14-55 ms is 500-2,500 launches
# steps measured alone, before and after each pass: the step's own length here, their mean
# (the loader's cost is the window's mean over it: a median under a right-skewed step would
# count the skew as the loader's); a launch-bound step moved ±4 ms step to step on an H200 at
# 64 per GPU
IDLE_STEPS = 24


def resolve(mode: str, consumers: int) -> str:
    """The mode every consumer runs: ``auto`` is ``gpu`` where each consumer has a GPU of its
    own (two sharing one would slow each other's steps), else ``sleep``."""
    if mode == "auto":
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return "gpu" if 0 < consumers <= gpus else "sleep"
    return mode


@dataclass
class Timing:
    """What the emulated step is made of: the host's time launching and the device's time
    computing, per step (the step lasts about the longer of the two); or, with ``model``, that
    model's real training step on ``batch_size`` images of ``image_size``."""

    host_s: float
    device_s: float
    model: str = ""  # a torchvision model name: train it instead of timed matmuls
    batch_size: int = 0
    image_size: int = 224
    # the model in DDP over the consumers: only with synced steps (--async-steps lets consumers
    # take different numbers of steps, and a DDP step is a collective every rank must join)
    ddp: bool = True


class StepOnGpu:
    """What both GPU steps share. ``step()`` queues one step's work from this thread and
    returns without waiting for the GPU (``ahead``): the host runs ahead as a training loop
    does, and the step is timed on the GPU, between events on the current stream (``clock``,
    read :data:`~feedbench.core.clocks.LAG` steps later). ``idle_s`` is the mean of
    ``IDLE_STEPS`` steps timed so with no loader running, so a step's time beyond it is what the
    loader cost it. Built once per consumer, measured alone again before and after every pass
    (:func:`feedbench.scan.consumer.bracket_step_alone`)."""

    idle_s: float
    clock: CudaClock
    ahead = True  # step() returns before the GPU has run the step: time it with ``clock``
    late_s = owed_s = 0.0  # the sleep accelerator's fields: none owed here

    def step(self) -> float:
        """Queue one step; returns the host's time doing so (not the step's length)."""
        raise NotImplementedError

    @property
    def step_s(self) -> float:
        return self.idle_s

    def measure_alone(self) -> float:
        """The step's mean length on the GPU over ``IDLE_STEPS`` steps now (kept as
        ``idle_s``), queued as the consumer loop queues them."""
        clock, spans = self.clock, []
        for _ in range(IDLE_STEPS):
            start = clock.mark()
            self.step()
            spans.append((start, clock.mark()))
            if len(spans) > clock.lag:
                clock.wait(spans[-1 - clock.lag][1])
        clock.sync()
        self.idle_s = statistics.fmean(clock.seconds(a, b) for a, b in spans)
        return self.idle_s


class GpuAccelerator(StepOnGpu):
    """Kernels launched from this thread: ``device_s`` of matmuls per step on ``device``,
    their launches spread over ``host_s``."""

    def __init__(self, timing: Timing, device: torch.device) -> None:
        self.timing, self.device = timing, device
        self.clock = CudaClock(device)
        with torch.cuda.device(device):
            self.a = torch.randn(MATMUL_N, MATMUL_N, device=device, dtype=torch.bfloat16)
            self.b = torch.randn_like(self.a)
            self.out = torch.empty_like(self.a)
            self.kernel_s = self._kernel_time()
        self.launches = max(1, round(timing.device_s / self.kernel_s))
        self.measure_alone()

    def _kernel_time(self, repeats: int = 50) -> float:
        """One matmul's device time, from CUDA events over ``repeats`` after a warm-up."""
        for _ in range(5):
            torch.matmul(self.a, self.b, out=self.out)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            torch.matmul(self.a, self.b, out=self.out)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / repeats

    def step(self) -> float:
        """One step: the launches with the host's work between them."""
        t0 = time.perf_counter()
        with torch.cuda.device(self.device):
            host_work(self._launch, self.launches, self.timing.host_s)
        return time.perf_counter() - t0

    def _launch(self) -> None:
        torch.matmul(self.a, self.b, out=self.out)


def host_work(launch: Callable[[], None], launches: int, host_s: float) -> None:
    """``launch`` ``launches`` times, with ``host_s`` of this thread's CPU time spread over them.

    CPU time, not wall time: a training thread has a fixed amount of work a step, so a loader
    that takes its core or holds the GIL makes the step longer. Paced by the wall clock, the
    thread would catch up after any wait and the step would hide exactly that cost."""
    c0 = time.thread_time()
    gap = host_s / launches
    for i in range(launches):
        launch()
        due = c0 + (i + 1) * gap
        while time.thread_time() < due:  # the host's own work between launches (GIL held)
            pass


MODEL_WARMUP = 10  # steps before the idle ones: cudnn's algorithm search, the allocator
_NCCL: list = []  # the consumers' NCCL group, made once per process (a collective)


def in_ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``model`` in DistributedDataParallel over every consumer's GPU, as training runs it.

    DDP's own host work (its reducer, bucket hooks, buffer broadcast) is a large part of a
    small batch's step: ResNet-50 at 64 on one H200 took 17-26 ms a step bare and 27-35 ms in
    DDP of one rank (BENCHMARKS, run 10). Every consumer builds its step at the same point of
    the run, so the group's creation, a collective over the consumers' gloo group, lines up;
    outside a process group (a consumer run alone, tests) the model stays bare."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if not dist.is_initialized():
        return model
    if not _NCCL:
        _NCCL.append(dist.new_group(backend="nccl"))
    return DDP(model, device_ids=[device.index], process_group=_NCCL[0])


class ModelAccelerator(StepOnGpu):
    """A real training step of ``timing.model`` from this thread on ``device``: forward and
    backward under bf16 autocast (channels_last, as verify trains), SGD, then wait for the
    GPU."""

    def __init__(self, timing: Timing, device: torch.device) -> None:
        from feedbench.verify.worker.models import build_model

        self.timing, self.device = timing, device
        self.clock = CudaClock(device)
        torch.backends.cudnn.benchmark = True
        with torch.cuda.device(device):
            model = build_model(timing.model, 1000).to(device, memory_format=torch.channels_last)
            self.model = in_ddp(model, device) if timing.ddp else model
            self.optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            self.loss = torch.nn.CrossEntropyLoss()
            n, size = max(1, timing.batch_size), timing.image_size
            self.images = torch.randn(n, 3, size, size, device=device).contiguous(
                memory_format=torch.channels_last
            )
            self.labels = torch.randint(0, 1000, (n,), device=device)
        for _ in range(MODEL_WARMUP):
            self.step()
        self.measure_alone()

    def step(self) -> float:
        t0 = time.perf_counter()
        with torch.cuda.device(self.device):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = self.loss(self.model(self.images), self.labels)
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - t0
