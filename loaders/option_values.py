"""The values the backends' options take, checked before anything is built or listed: a command
line (``feedbench scan/verify --loader-option``) learns of a bad value at once, not when its
ranks start. The backends check with the same functions (one source for each rule)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loaders.decode import DECODERS, decoder_missing


def _count(low: int) -> Callable[[str, Any], str | None]:
    def check(name: str, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            return f"{name} takes a whole number ≥ {low}, not {value!r}"
        return None

    return check


def _pace(name: str, value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if not isinstance(value, int) or value < 0:
        return f"pace takes 0 (off), 1 or more steps, not {value!r}"
    return None


def _milliseconds(name: str, value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return f"{name} takes milliseconds ≥ 0, not {value!r}"
    return None


def _nice(name: str, value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 19:
        return f"{name} takes a niceness from 0 to 19, not {value!r}"
    return None


def _fraction(name: str, value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        return f"{name} takes a fraction from 0 to 1, not {value!r}"
    return None


def _switch(name: str, value: Any) -> str | None:
    if value is None or value in (0, 1):  # True, False, 1, 0; None: the backend's default
        return None
    return f"{name} takes true or false, not {value!r}"


def _one_of(*choices: str) -> Callable[[str, Any], str | None]:
    listed = ", ".join(choices[:-1]) + " or " + choices[-1]

    def check(name: str, value: Any) -> str | None:
        if value not in choices:
            return f"{name} takes {listed}, not {value!r}"
        return None

    return check


def _start_method(name: str, value: Any) -> str | None:
    # a context object (from Python) is DataLoader's to check; a name must be one it takes
    methods = ("fork", "spawn", "forkserver")
    if isinstance(value, str) and value not in methods:
        return f"{name} takes {', '.join(methods[:-1])} or {methods[-1]}, not {value!r}"
    return None


def _decoder(name: str, value: Any) -> str | None:
    return _one_of(*DECODERS)(name, value) or decoder_missing(value)


# dali options whose value "gpu" needs a CUDA device (scan and verify refuse it up front)
NEEDS_GPU = ("decode", "resize")

RULES: dict[str, Callable[[str, Any], str | None]] = {
    "prefetch": _count(1),
    "shuffle_buffer": _count(0),
    "pace": _pace,
    "pace_lead_ms": _milliseconds,
    "hw_decoder_load": _fraction,
    "decode": _one_of("auto", "gpu", "cpu"),
    "resize": _one_of("auto", "gpu"),
    "decoder": _decoder,
    "worker_nice": _nice,
    "slots": _switch,
    "reserve_cores": _count(0),
    "normalize": _switch,
    "dont_use_mmap": _switch,
    "multiprocessing_context": _start_method,
}


def check_values(options: dict[str, Any]) -> None:
    """ValueError for the first option whose value its rule refuses (options without a rule,
    e.g. a function, are the backend's to check)."""
    for name, value in options.items():
        rule = RULES.get(name)
        why = rule(name, value) if rule else None
        if why:
            raise ValueError(why)
