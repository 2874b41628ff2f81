"""Clocks for timing training steps: the host's, and CUDA events on the current stream.

A GPU step is timed where it runs: marks are events queued on the stream, read ``lag`` steps
later, so the host can run ahead of the GPU as training does; the time between two marks is the
GPU's, and the time between one step's end and the next one's start is the GPU idle, waiting
for the host (for data, a barrier). On the CPU everything is synchronous and a mark is the time.
verify's ranks (:mod:`feedbench.verify.worker.timing`) and scan's emulated GPU step
(:mod:`feedbench.scan.emulate`) share them, so the two measure a step the same way.
"""

from __future__ import annotations

import time

LAG = 2  # GPU: events of step i are read after step i + LAG is queued


class HostClock:
    """perf_counter marks (everything is synchronous)."""

    lag = 0

    def mark(self) -> float:
        return time.perf_counter()

    def seconds(self, a: float, b: float) -> float:
        return b - a

    def wait(self, m: float) -> None:
        pass

    def sync(self) -> None:
        pass


class CudaClock:
    """CUDA events on the current stream; read ``lag`` steps later so the host can run ahead."""

    lag = LAG

    def __init__(self, device) -> None:
        import torch

        self.torch = torch
        self.device = device

    def mark(self):
        e = self.torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3

    def wait(self, m) -> None:
        m.synchronize()

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.device)
