"""The DALI backend's errors in one line: DALI stops on a file it cannot read or decode and says
so in many lines, often without the file; these name the file (checked again on the CPU, in
parallel) and why."""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from loaders.dali_feed import dali_reason
from loaders.decode import CpuDecoder, DecodeError
from loaders.errors import LoaderError

# samples checked per round of the thread pool: the first bad one in listing order is named,
# and memory stays bounded on a listing of millions
CHECK_STEP = 4096


def diagnose(error: Exception, index, rank: int, threads: int) -> LoaderError:
    """DALI's multi-line ``error`` → one line naming the file (found by checking ``index``'s
    samples on the CPU where DALI did not name it)."""
    text = str(error)
    m = re.search(
        r"(?:File mapping failed|Failed to open file|Failed to read file)[^/]*(/\S+)", text
    )
    if m:
        path = m.group(1).rstrip(".,;'\"")
        why = (
            "zero-byte file"
            if os.path.isfile(path) and os.path.getsize(path) == 0
            else ("cannot read the file")
        )
        return LoaderError(f"cannot read {path}: {why} (the DALI backend stops on bad files)")
    bad = find_undecodable(index, threads)
    if bad is not None:
        where, why = bad
        return LoaderError(
            f"cannot decode {where}: {why} (the DALI backend stops on undecodable images: "
            "remove or replace the file)"
        )
    return LoaderError(f"DALI pipeline failed on rank {rank}: {dali_reason(text)}")


def find_undecodable(index, threads: int) -> tuple[str, str] | None:
    """The first sample of ``index`` (in listing order) that the CPU decoder cannot decode, and
    why."""
    checker = CpuDecoder(size=8, train=False)
    scratch = np.empty((8, 8, 3), np.uint8)

    def check(i: int) -> str | None:
        try:
            data = index.read(i)
            checker.decode_into(data, scratch.copy(), np.random.default_rng(0))
        except (OSError, DecodeError) as e:
            return str(e) or type(e).__name__
        return None

    n = len(index)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for start in range(0, n, CHECK_STEP):
            chunk = range(start, min(n, start + CHECK_STEP))
            for i, why in zip(chunk, pool.map(check, chunk), strict=True):
                if why is not None:
                    return index.describe(i), why
    return None
