"""Run a scan: detect the source, control the cache, run the passes, gather one ScanResult.

This first version runs one consumer in this process; the multi-consumer engine builds on it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass

import psutil

from feedbench import cache
from feedbench.consumer import ProgressFn, run_pass
from feedbench.errors import FeedbenchError
from feedbench.results import CacheState, DatasetInfo, HostInfo, ScanResult, now_utc
from feedbench.sources import detect

PASSES = ("cold", "warm")


@dataclass
class ScanConfig:
    path: str
    stages: tuple[str, ...] = ("read", "decode", "augment")
    batch_size: int = 64
    passes: tuple[str, ...] = ("cold",)
    fmt: str = "auto"
    image_size: int = 224
    drop_caches: bool = False


def parse_passes(text: str) -> tuple[str, ...]:
    names = tuple(p.strip().lower() for p in text.split(",") if p.strip())
    bad = [p for p in names if p not in PASSES]
    if not names or bad:
        raise FeedbenchError(f"--passes takes cold, warm or cold,warm (got {text!r})")
    return names


def scan(
    config: ScanConfig,
    *,
    progress_start: Callable[[str, int], ProgressFn] | None = None,
    on_update: Callable[[ScanResult], None] | None = None,
) -> ScanResult:
    """Measure ``config.path``. ``on_update`` gets the result after every pass (for saving)."""
    if config.batch_size < 1:
        raise FeedbenchError("--batch-size must be at least 1")
    source, notes = detect(config.path, config.fmt)
    dataset = DatasetInfo(
        path=os.path.abspath(config.path),
        format=source.kind,
        files=len(source.files()),
        bytes=source.total_bytes(),
        samples=source.samples_hint(),
    )
    result = ScanResult(
        kind="scan",
        created_utc=now_utc(),
        command=["feedbench", *sys.argv[1:]],
        config={k: list(v) if isinstance(v, tuple) else v for k, v in asdict(config).items()},
        host=HostInfo.current(),
        dataset=dataset,
        warnings=list(notes),
    )
    ram = psutil.virtual_memory().total
    if dataset.bytes < 5 * ram:
        result.warnings.append(
            f"dataset ({dataset.bytes / 1e9:.2f} GB) is smaller than 5× RAM ({ram / 1e9:.0f} GB): "
            "in training it would stay in the page cache after the first epoch; the cold pass "
            "shows first-epoch speed, the warm pass later epochs"
        )
    units = range(source.units())
    for name in config.passes:
        state = _prepare_cache(name, source.files(), config.drop_caches, result)
        progress = progress_start(name, dataset.bytes) if progress_start else None
        outcome = run_pass(
            source,
            units,
            config.stages,
            name=name,
            batch_size=config.batch_size,
            cache=state,
            image_size=config.image_size,
            progress=progress,
        )
        result.passes.append(outcome.result)
        result.errors.extend(outcome.errors[: max(0, 20 - len(result.errors))])
        if outcome.result.partial:
            result.partial = True
            break
        if on_update:
            on_update(result)
    if dataset.samples is None and result.passes:
        p = result.passes[0]
        dataset.samples = p.samples + p.errors if not p.partial else None
    return result


def unusable(result: ScanResult) -> str | None:
    """Why a finished scan measured nothing usable (every sample failed), or None."""
    if result.passes and result.passes[0].samples == 0 and not result.partial:
        cfg = result.config
        return (
            f"no sample of {cfg['path']} could be read through {','.join(cfg['stages'])}: "
            f"{result.passes[0].errors} errors, e.g. {_first_error(result)}"
        )
    return None


def _first_error(result: ScanResult) -> str:
    if not result.errors:
        return "none recorded"
    e = result.errors[0]
    return f"{os.path.basename(e.key)}: {e.message}"


def _prepare_cache(name: str, files, drop: bool, result: ScanResult) -> CacheState:
    if name == "warm":
        return CacheState("warm", cache.residency(files).fraction)
    failures = cache.evict(files)
    if drop and not cache.drop_all_caches():
        result.warnings.append("--drop-caches needs root: only per-file eviction was done")
    resident = cache.residency(files).fraction
    if resident > 0.05:
        result.warnings.append(
            f"{resident:.0%} of the data stayed in the page cache after eviction "
            "(this filesystem ignores fadvise?): the cold pass is partly warm; try --drop-caches"
        )
    return CacheState("cold", resident, failures)
