"""The warm-up rule: where a consumer's measured window starts in one pass.

A loader starts up at every pass (workers forked, a DALI pipeline built, queues filled, a GPU
decoder and memory pools warming), and that can last well past its first batch: a DataLoader's
W workers deliver their first batches together after their start, then at their steady pace;
DALI hands over its prefetched batches at once, then runs slowly for a while. A warm-up of a
fixed count of batches measures the rest of that start-up as if it were the loader's pace.

The rule, decided after the pass from when each batch was ready (:func:`warmup_end`):

* at least ``--warmup`` batches, and one per batch the loader can have ready
  (:func:`~feedbench.scan.sizing.loader_ahead`), so the batches that start-up queued are taken;
* then batch by batch, while the next :data:`BLOCK` batches (or one per batch ready, if more)
  come more than :data:`SLOWER` times slower than the pass's steady pace (the mean time between
  batches over its second half; and by over :data:`NOISE_S` a batch): a loader still that slow
  is starting up;
* never past a stall (one wait ≥ :data:`~feedbench.scan.sizing.STALL_FACTOR` × the pace and
  ≥ :data:`~feedbench.scan.sizing.STALL_MIN_S`): a pause amid steady batches is the storage's,
  for the window to show, not start-up;
* never past half the pass (but for ``--warmup`` itself): the pace is the second half's, and a
  window must remain. A loader still slow there, or with more batches ready than half the pass
  holds, is reported as not settled (a warning), not measured as settled.

``--warmup 0`` measures every batch, start-up included.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from feedbench.scan.sizing import STALL_FACTOR, STALL_MIN_S

# a block of batches this much slower than the steady pace is still start-up (a margin over the
# pace's noise between blocks on a busy host)
SLOWER = 1.25
# batches per block, at least: the pace of fewer is one worker's burst or one late wake-up
BLOCK = 4
# and slower by at least this much a batch: batches a fraction of a millisecond apart (small
# reads from the page cache) differ by more than SLOWER from timer and scheduler noise alone
NOISE_S = 0.001


def least_warmup(warmup: int, ahead: int) -> int:
    """The warm-up's least batches: ``warmup`` (``--warmup``) and one per batch the loader can
    have ready (``ahead``); none with ``warmup`` 0."""
    return max(warmup, ahead) if warmup > 0 else 0


def warmup_end(ready: Sequence[float], start: float, warmup: int, ahead: int) -> tuple[int, bool]:
    """(warm-up batches, settled) for a pass whose batches were ready at ``ready`` (seconds,
    in order; the pass started at ``start``), ``warmup`` the least asked for (0: none) and
    ``ahead`` the batches the loader can have ready. ``settled`` is False when the loader was
    still slower than its steady pace at half the pass (the warm-up then ends there)."""
    minimum = least_warmup(warmup, ahead)
    n = len(ready)
    if minimum <= 0 or n <= warmup:  # none asked for, or --warmup itself takes it all
        return minimum, True
    if minimum > max(warmup, n // 2):  # more batches ready than half the pass: it may be all
        return max(warmup, n // 2), False  # start-up; measure the rest, and say so
    t = np.concatenate([[start], np.asarray(ready, dtype=np.float64)])  # t[i]: batch i ready
    tail = n - n // 2
    pace = (t[n] - t[n - tail]) / tail  # the mean time between batches, second half
    block = max(BLOCK, ahead)
    stall = max(STALL_MIN_S, STALL_FACTOR * pace)
    last = max(minimum, n // 2)
    for k in range(minimum, last + 1):
        if t[k + 1] - t[k] >= stall:  # the next batch waits as a stall does: in the window
            return k, True
        j = min(n, k + block)
        if (t[j] - t[k]) / (j - k) <= SLOWER * pace + NOISE_S:
            return k, True
    return last, False
