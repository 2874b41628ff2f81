"""PACING for the DALI loader on a GPU: how long the host waits for the caller's stream before a
batch is handed over (see ``loaders.dali_backend``, PACING).

``pace=k`` waits for the mark recorded ``k - 1`` handovers earlier (1: the previous step's end).
``lead_ms=L`` (with ``pace=1``) releases the host ``L`` ms *before* the previous step is due to
end on the GPU: the host then launches the next step's first work (DDP's buffer broadcast, the
forward's first kernels) while the GPU still finishes the last one, instead of the GPU idling
while the host does it after a full wait. When the step is due comes from the GPU's own clock:
the end of the step before (a mark the host has waited for) plus the median GPU time of the
recent steps (CUDA event timing), mapped to the host's clock by a full wait now and then.
"""

from __future__ import annotations

import collections
import statistics
import time

import torch

# The default lead, and its cap as a share of the step. Measured with ResNet-50 training on one
# H200 (57 ms steps, DDP defaults): leads of 2, 5, 8 and 12 ms gave 0.93, 0.96, 0.94 and 0.93 of
# the synthetic ceiling against 0.91 without (BENCHMARKS.md, "Pacing with a lead"): past ~10% of
# the step the host queues enough to starve DALI's kernels again, so shorter steps get less lead.
LEAD_MS = 5.0
LEAD_SHARE = 0.1
RECALIBRATE = 512  # handovers between full waits that re-anchor the GPU clock to the host's
PERIODS = 9  # recent step times (GPU clock) whose median predicts the next


def release_time(prev_done: float, periods, lead_s: float) -> float:
    """When the host may go on (host clock, s): ``lead_s`` (at most ``LEAD_SHARE`` of a step)
    before the step now on the GPU is due to end, i.e. the end of the one before
    (``prev_done``) plus the median step time."""
    step = statistics.median(periods)
    return prev_done + step - min(lead_s, LEAD_SHARE * step)


class Pacer:
    """One loader's pacing state; :meth:`wait` at every handover, :meth:`reset` when the
    caller's stream history no longer applies (a closed or rebuilt loader)."""

    def __init__(self, device: torch.device, pace: int, lead_ms: float = 0.0) -> None:
        if lead_ms and pace != 1:
            raise ValueError(f"lead_ms needs pace=1 (the host one step behind), not pace={pace}")
        self.device = device
        self.pace = pace
        self.lead_s = lead_ms / 1e3
        self._marks: collections.deque = collections.deque()
        self._periods: collections.deque = collections.deque(maxlen=PERIODS)
        self.reset()

    def reset(self) -> None:
        self._marks.clear()
        self._ref: torch.cuda.Event | None = None  # a mark whose end the host saw happen
        self._ref_host = 0.0  # ... at this host time
        self._since_ref = 0
        self._last_done: torch.cuda.Event | None = None  # the latest mark known to have ended

    def wait(self) -> None:
        mark = torch.cuda.Event(enable_timing=bool(self.lead_s))
        mark.record(torch.cuda.current_stream(self.device))
        self._marks.append(mark)
        keep = max(self.pace, 2 if self.lead_s else 1)
        while len(self._marks) > keep:
            self._marks.popleft()
        if not self.lead_s:
            self._marks[0].synchronize()
            return
        self._since_ref += 1
        if len(self._marks) < 2:
            self._full_wait(mark)
            return
        prev = self._marks[0]
        prev.synchronize()  # the step before last has ended: at most one step queued
        self._ended(prev)
        if self._ref is None or self._since_ref >= RECALIBRATE or len(self._periods) < 2:
            self._full_wait(mark)
            return
        target = release_time(self._host_time(prev), self._periods, self.lead_s)
        while not mark.query():
            left = target - time.perf_counter()
            if left <= 0:
                break
            time.sleep(min(left, 2e-4))

    def _full_wait(self, mark: torch.cuda.Event) -> None:
        """Wait for ``mark``; when the host really waited, its end is now: anchor the clocks."""
        waited = not mark.query()
        mark.synchronize()
        if waited:
            self._ref, self._ref_host, self._since_ref = mark, time.perf_counter(), 0
        self._ended(mark)

    def _ended(self, mark: torch.cuda.Event) -> None:
        """``mark`` has ended: the GPU time since the mark that ended before it is a step's."""
        if self._last_done is not None and self._last_done is not mark:
            self._periods.append(self._last_done.elapsed_time(mark) / 1e3)
        self._last_done = mark

    def _host_time(self, done: torch.cuda.Event) -> float:
        """The host time at which ``done`` (an ended timing mark) ended."""
        assert self._ref is not None
        return self._ref_host + self._ref.elapsed_time(done) / 1e3
