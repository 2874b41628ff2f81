"""What the scan's parent and each of its consumers do before measuring, without torch (the
parent imports none: a bad path or option answers at once): open the source the config names."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from feedbench.core.errors import FeedbenchError
from feedbench.scan.config import ScanConfig
from feedbench.scan.factory import is_user_spec
from feedbench.scan.sources import Source, detect, detect_files

SCAN_PID_ENV = "FEEDBENCH_SCAN_PID"  # set by a local scan for its consumers (not by torchrun)


def open_source(
    config: ScanConfig, progress: Callable[[int], None] | None = None
) -> tuple[Source, list[str]]:
    """The source ``config`` names, with its read options set, and notes for the results;
    ``progress(files)`` while a local folder is listed."""
    if is_user_spec(config.loader):  # the user's loader reads the path its own way
        source, notes = detect_files(config.path, progress), []
    else:
        source, notes = detect(config.path, config.fmt, progress)
        if source.kind == "records":
            notes += _record_stages(config, source.fmt)
    # THE READING THREAD (local shards) only where reading is the whole job, the storage test
    # (`--stages read`): there the tar walk must not stand in for the storage. In a pipeline a
    # worker reads in series with its other stages, as a WebDataset worker does, and each stage's
    # time stays its own (a thread would turn the read stage's time into time spent waiting and
    # "read alone would run N× faster" into a guess). The results record what was used.
    config.read_thread = bool(
        config.read_thread
        and source.kind == "shards"
        and not source.remote
        and not config.read_ahead_mb
        and tuple(config.stages) == ("read",)
        and config.loader is None
    )
    source.set_options(
        direct=config.direct,
        latency_s=config.read_latency_s,
        read_ahead=int(config.read_ahead_mb * (1 << 20)),
        read_thread=config.read_thread,
    )
    if config.index is not None:
        source.expected = expected_per_shard(config, source)
    return source, notes


def expected_per_shard(config: ScanConfig, source: Source) -> np.ndarray:
    """Each shard's sample count by the loaders' index at ``config.index``: what a shard cut
    short should have held. Where no file is there the shards are indexed (each read once, its
    headers walked) and it is saved there, as ``build_loader(..., index=PATH)`` does; the
    consumers then load it (mapped: milliseconds)."""
    from loaders.data import SampleIndex, open_index
    from loaders.data.index import listed_as
    from loaders.data.remote import redact_url
    from loaders.errors import LoaderError

    path = str(config.index)
    if source.kind != "shards" or config.loader is not None:
        raise FeedbenchError("--index: for tar shards read by the scan itself (not --loader)")
    try:
        if os.path.exists(path):
            index = SampleIndex.load(path)
        else:
            index = open_index(source.layout)
            index.listed = listed_as(config.path or "", config.fmt)
            index.save(path)
    except LoaderError as e:
        raise FeedbenchError(f"--index: {e}") from None
    files = source.files()
    same = index.kind == "shards" and len(index.shards) == len(files)
    pairs = zip(index.shards, files, strict=False)  # (same: the lengths are equal)
    if not same or any(redact_url(a) != redact_url(str(b)) for a, b in pairs):
        raise FeedbenchError(
            f"--index: {path} is the index of {index.listed}, not of these {len(files)} shards: "
            "give another path, or delete the file to index them again"
        )
    return index.samples_per_shard()


def _record_stages(config: ScanConfig, fmt: str) -> list[str]:
    """Data files go through read and their format's decode only (augment, collate and
    transfer are image stages): ``config.stages`` cut to those, and a note when that drops one."""
    from loaders.data.records import has_decode

    allowed = ("read", "decode") if has_decode(fmt) else ("read",)
    kept = tuple(s for s in config.stages if s in allowed)
    dropped = [s for s in config.stages if s not in allowed]
    config.stages = kept
    if not dropped:
        return []
    return [f"format {fmt}: stages {','.join(kept)} ({','.join(dropped)}: images only)"]


def check_direct(source: Source) -> None:
    """--direct: one O_DIRECT read of the first file, so a filesystem without it fails at once."""
    from loaders.data import read_file

    try:
        read_file(str(source.files()[0]), direct=True)
    except OSError as e:
        raise FeedbenchError(
            f"--direct: O_DIRECT reads fail on this filesystem ({e.strerror or e})"
        ) from e
