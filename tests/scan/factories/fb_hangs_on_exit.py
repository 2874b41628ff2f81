"""A loader whose clean-up hangs on the way out: its batches all come, then, alone (one consumer),
it registers an exit handler that never returns (as a native library's teardown stuck on a store
that stopped answering would). The handler blocks in C with the GIL held, so the consumer's
exit-handler guard (a timer thread) cannot end it either: only the scan's stall watch can."""

import atexit
import ctypes

import torch


def _hang() -> None:
    ctypes.PyDLL(None).pause()  # a C call that keeps the GIL: returns on a signal only


def make_loader(world_size, batch_size, batches=3):
    if world_size == 1:
        atexit.register(_hang)
    return [torch.zeros(batch_size, 3) for _ in range(batches)]
