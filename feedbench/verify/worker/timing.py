"""How a rank times its steps: clocks (host, CUDA events), the all-reduce comm hook, one
step's marks and their reading into seconds (:data:`feedbench.verify.results.TIMING`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# the clocks live in core, shared with scan's GPU step; the rank imports them from here
from feedbench.core.clocks import LAG, CudaClock, HostClock  # noqa: F401
from feedbench.verify.results import COLUMNS, PARTS, StepSeries


@dataclass
class CommTimer:
    """State of :func:`timed_allreduce`: one (ready, done) mark pair per bucket, per step."""

    clock: Any
    world: int
    group: Any = None
    marks: list = field(default_factory=list)

    def new_step(self) -> list:
        self.marks = []
        return self.marks


def timed_allreduce(state: CommTimer, bucket):
    """DDP's default all-reduce (average), marked when the bucket is ready and when it is reduced.

    The completion mark is taken in the future's callback: on gloo the callback runs when the
    all-reduce has finished; on NCCL it runs at once on a stream that waits for the all-reduce,
    so the CUDA event recorded there completes with it.
    """
    import torch.distributed as dist

    marks = state.marks
    ready = state.clock.mark()
    tensor = bucket.buffer()
    tensor.div_(state.world)
    fut = dist.all_reduce(tensor, group=state.group, async_op=True).get_future()

    def done(f):
        marks.append((ready, state.clock.mark()))
        return f.value()[0]

    return fut.then(done)


def union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -float("inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


@dataclass
class Marks:
    step: int
    epoch: int
    images: int
    host_wait_s: float
    start: Any  # the previous step's end
    pre: Any  # just before next(loader)
    data: Any  # batch on the device
    bwd: Any  # backward done (DDP has waited for every all-reduce)
    end: Any  # optimizer done
    comm: list


@dataclass
class StepTimes:
    """One step in seconds: ``parts`` holds every part of :data:`PARTS` (each also read as an
    attribute, ``t.data_wait_s``); they add up to ``step_s``."""

    step: int
    epoch: int
    images: int
    parts: dict[str, float]
    step_s: float
    allreduce_busy_s: float
    host_wait_s: float
    buckets: int

    def __getattr__(self, name: str) -> float:  # only for names that are not fields
        parts = self.__dict__.get("parts", {})
        if name in parts:
            return parts[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def read_marks(m: Marks, clock) -> StepTimes:
    """Turn one step's marks into seconds (see TIMING in :mod:`feedbench.verify.results`)."""
    clock.wait(m.end)
    s = clock.seconds
    step = s(m.start, m.end)
    data = s(m.pre, m.data)
    fb = s(m.data, m.bwd)
    opt = s(m.bwd, m.end)
    exposed = busy = 0.0
    if m.comm:
        spans = [(s(m.start, a), s(m.start, b)) for a, b in m.comm]
        last_ready = max(a for a, _ in spans)
        last_done = max(b for _, b in spans)
        bwd_end = s(m.start, m.bwd)
        exposed = min(max(0.0, last_done - last_ready), max(0.0, bwd_end - last_ready), fb)
        busy = union_length(spans)
    # in the order of PARTS: data wait, forward + backward, exposed all-reduce, optimizer, other
    seconds = (data, fb - exposed, exposed, opt, step - data - fb - opt)
    parts = dict(zip(PARTS, seconds, strict=True))
    return StepTimes(
        step=m.step,
        epoch=m.epoch,
        images=m.images,
        parts=parts,
        step_s=step,
        allreduce_busy_s=busy,
        host_wait_s=m.host_wait_s,
        buckets=len(m.comm),
    )


def append(series: StepSeries, t: StepTimes) -> None:
    """Add one measured step to ``series``: a value to each of its per-step columns."""
    for name in COLUMNS:
        getattr(series, name).append(getattr(t, name))
