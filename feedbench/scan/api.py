"""``feedbench.measure``: a scan of the user's own loader from Python (a notebook, a training
script), over the same config and run code as ``feedbench scan --loader``."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from feedbench.core.errors import FeedbenchError
from feedbench.scan.config import ScanConfig
from feedbench.scan.results import ScanResult


def measure(
    loader: str | Callable[..., Iterable[Any]],
    path: str | os.PathLike[str] | None = None,
    *,
    consumers: int | Sequence[int] = (1,),
    step_time_s: float | None = None,
    rate: float | None = None,
    profile: str | None = None,
    batch_size: int | None = None,
    workers: int | None = None,
    passes: Sequence[str] = ("cold",),
    repeat: int = 1,
    warmup_batches: int = 1,
    options: dict[str, Any] | None = None,
    seed: int = 0,
    target_au: float = 0.9,
    stall_timeout_s: float = 60.0,
) -> ScanResult:
    """Measure a loader as ``feedbench scan PATH --loader SPEC`` does; returns the ScanResult
    the CLI writes (save it with :func:`feedbench.core.envelope.save`, render it with
    ``feedbench report``).

    ``loader``: a factory function defined at module level in a ``.py`` file (the consumer
    processes import it again), ``"file.py:function"`` / ``"module:function"``, or ``"torch"``,
    ``"dali"``, ``"wds"``. The factory gets the keywords it takes among rank, world_size,
    local_rank, batch_size, workers, seed, epoch and path, plus ``options``. ``path``: the data
    the cold cache is applied to (None: the page cache is left as it is). Bad input or the
    loader's own error raise :class:`~feedbench.core.errors.FeedbenchError`; so does a scan that
    measured nothing usable or failed (``result.failure``), as the CLI exits non-zero.
    """
    from feedbench.scan.run import outcome, scan

    config = ScanConfig(
        path=os.fspath(path) if path is not None else None,  # type: ignore[arg-type]
        consumers=(consumers,) if isinstance(consumers, int) else tuple(consumers),
        step_s=step_time_s,
        rate=rate,
        profile=profile,
        batch_size=batch_size,
        workers=workers,
        passes=tuple(passes),
        repeat=repeat,
        warmup_batches=warmup_batches,
        seed=seed,
        target_au=target_au,
        stall_timeout_s=stall_timeout_s,
        loader=loader if isinstance(loader, str) else spec_of(loader),
        loader_options=dict(options or {}),
    )
    result = scan(config)
    result.command = ["feedbench.measure", config.loader or "", config.path or ""]
    problem = outcome(result)
    if problem:
        raise problem
    return result


def spec_of(factory: Callable[..., Any]) -> str:
    """``module:function`` for a factory the consumer processes can import again; a script's
    own function (``__main__``) by its file."""
    name = getattr(factory, "__qualname__", "")
    module = getattr(factory, "__module__", None)
    if not name or "<" in name or module is None:
        raise FeedbenchError(
            f"measure: {factory!r} is not a module-level function; define the factory at the "
            "top level of a .py file (each consumer process imports it)"
        )
    if module in ("__main__", "__mp_main__"):
        file = getattr(sys.modules.get(module), "__file__", None)
        if not file:
            raise FeedbenchError(
                "measure: the factory must live in a .py file (each consumer process imports "
                "it), not in a notebook or an interactive session"
            )
        return f"{os.path.abspath(file)}:{name}"
    return f"{module}:{name}"
