"""The host time of one batch's labels to the GPU (DALI loader's ``_outputs``): a fresh
``pin_memory()`` per batch against a reused pinned buffer whose last copy's event is checked.
Run on the GPU machine: ``python3 scripts/bench_label_copy.py`` (prints µs per batch, the median
of 5 rounds of 2,000 batches)."""

from __future__ import annotations

import statistics
import time

import torch


def fresh(labels: torch.Tensor, device) -> torch.Tensor:
    return labels.pin_memory().to(device, non_blocking=True)


class Reused:
    def __init__(self, depth: int = 4) -> None:
        self.bufs: list = [None] * depth
        self.events: list = [None] * depth
        self.i = 0

    def __call__(self, labels: torch.Tensor, device) -> torch.Tensor:
        i, self.i = self.i, (self.i + 1) % len(self.bufs)
        if self.bufs[i] is None or self.bufs[i].numel() < labels.numel():
            self.bufs[i] = torch.empty(labels.numel(), dtype=labels.dtype, pin_memory=True)
        elif self.events[i] is not None:
            self.events[i].synchronize()
        view = self.bufs[i][: labels.numel()].view(labels.shape)
        view.copy_(labels)
        out = view.to(device, non_blocking=True)
        self.events[i] = torch.cuda.Event()
        self.events[i].record()
        return out


def rate(copy, n: int, device) -> float:
    labels = torch.randint(0, 1000, (n,), dtype=torch.int64)
    for _ in range(200):
        copy(labels, device)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(2000):
        copy(labels, device)
    return (time.perf_counter() - t0) / 2000 * 1e6


if __name__ == "__main__":
    dev = torch.device("cuda", 0)
    for n in (64, 256):
        for name, copy in (("pin_memory() per batch", fresh), ("reused pinned buffer", Reused())):
            us = [rate(copy, n, dev) for _ in range(5)]
            print(
                f"{n} labels, {name}: {statistics.median(us):.1f} µs "
                f"(min {min(us):.1f}, max {max(us):.1f})"
            )
