"""Mid-epoch resumption: the loader state dict, its checks, and which samples a resumed epoch has.

The state counts the batches the CALLER received in the epoch (prefetched batches that workers or
DALI made beyond them are not counted: a resumed loader makes them again). It is a small plain
dict of ints, bools and lists (DALI adds its pipeline checkpoint as bytes), safe for ``torch.save``.

Positions, for the backends that can resume on another world size (torch): an epoch's samples in
order (train: the epoch's permutation; eval: ``0 … N − 1``) are dealt to ``W`` ranks as
DistributedSampler (train: padded by repeating from the start, rank r takes every W-th) or as
contiguous ranges (eval). After every rank took ``k`` batches of ``B``, the samples not yet seen
are, in order: train, the positions from ``W·k·B`` on (all ranks took the first ``W·k·B``
positions between them); eval, each rank's range after its first ``k·B``. Those are dealt again
to the new ranks by the same rule, so each is seen exactly once in the epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

STATE_FORMAT = 1
# what a resumed loader must share with the one that saved the state
MUST_MATCH = ("backend", "num_samples", "batch_size", "seed", "train", "drop_last")


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed epoch starts: ``batches`` already taken on this world size, after the
    ``earlier`` parts of the epoch, each ``(world_size, batches)``, ran on other world sizes."""

    epoch: int
    batches: int = 0
    earlier: tuple[tuple[int, int], ...] = ()
    extra: dict = field(default_factory=dict)  # a backend's own state (DALI's checkpoint)


def deal(samples: np.ndarray, rank: int, world_size: int, train: bool) -> np.ndarray:
    """Rank ``rank``'s part of ``samples``: DistributedSampler's (train) or a contiguous range."""
    n = len(samples)
    if not train:
        return samples[n * rank // world_size : n * (rank + 1) // world_size]
    if n == 0:
        return samples
    total = -(-n // world_size) * world_size
    return np.resize(samples, total)[rank::world_size]  # np.resize repeats from the start


def unseen(samples: np.ndarray, world_size: int, batches: int, batch_size: int, train: bool):
    """The samples of ``samples`` no rank has seen after each of ``world_size`` took ``batches``."""
    taken = batches * batch_size
    if train:
        return samples[world_size * taken :]
    n = len(samples)
    parts = [
        samples[n * r // world_size : n * (r + 1) // world_size][taken:] for r in range(world_size)
    ]
    return np.concatenate(parts) if parts else samples


def resumed_indices(
    samples: np.ndarray, point: ResumePoint, rank: int, world_size: int, batch_size: int, train
) -> np.ndarray:
    """This rank's indices for the epoch part that starts at ``point`` (before its skipped
    ``point.batches``): the earlier parts' unseen samples, dealt to this world size."""
    for world, batches in point.earlier:
        samples = unseen(samples, world, batches, batch_size, train)
    return deal(samples, rank, world_size, train)


def check_state(state: dict, expected: dict) -> None:
    """ValueError (one line) unless ``state`` is a loader state made with ``expected``'s values."""
    if not isinstance(state, dict) or "format" not in state:
        raise ValueError("not a loader state: pass what loader.state_dict() returned")
    if state["format"] != STATE_FORMAT:
        raise ValueError(
            f"loader state format {state['format']!r} is not {STATE_FORMAT}: "
            "it was saved by another version of loaders"
        )
    for key in MUST_MATCH:
        if state.get(key) != expected[key]:
            raise ValueError(
                f"the loader state was saved with {key}={state.get(key)!r}, this loader has "
                f"{key}={expected[key]!r}: build the loader with the arguments it was saved with"
            )
    for key in ("epoch", "batches", "world_size"):
        if not isinstance(state.get(key), int) or state[key] < 0:
            raise ValueError(f"loader state: {key} must be an integer ≥ 0, got {state.get(key)!r}")
