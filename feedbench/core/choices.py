"""Parsing and checking what a user typed: counts, lists, choices, KEY=VALUE options.

Every function raises :class:`FeedbenchError` with one line that names the flag and what it
takes; configs are built from their results, never from unchecked text.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from feedbench.core.errors import FeedbenchError


def _items(text: str, flag: str, example: str) -> list[str]:
    items = [x.strip() for x in str(text).split(",")]
    if not text.strip() or any(not x for x in items):
        raise FeedbenchError(f"{flag} takes a comma-separated list like {example} (got {text!r})")
    return items


def parse_counts(text: str, flag: str) -> tuple[int, ...]:
    """``"1,2,4,8"`` → (1, 2, 4, 8); ``"8"`` → (8,). Sorted, unique, each ≥ 1."""
    items = _items(text, flag, "1,2,4,8")
    try:
        counts = sorted({int(x) for x in items})
    except ValueError:
        raise FeedbenchError(f"{flag} takes counts like 1,2,4,8 (got {text!r})") from None
    if counts[0] < 1:
        raise FeedbenchError(f"{flag} takes counts ≥ 1 (got {text!r})")
    return tuple(counts)


def parse_names(text: str, flag: str, choices: Iterable[str] | None = None) -> tuple[str, ...]:
    """``"cold, Warm"`` → ("cold", "warm"): lower-cased, first occurrence kept; each one of
    ``choices`` when given."""
    names = tuple(dict.fromkeys(x.lower() for x in _items(text, flag, "a,b")))
    if choices is not None:
        for name in names:
            choose(name, choices, flag)
    return names


def choose(value: str, choices: Iterable[str], flag: str) -> str:
    """``value`` (lower-cased) if it is one of ``choices``, else one clear error."""
    options = tuple(choices)
    got = str(value).strip().lower()
    if got not in options:
        raise FeedbenchError(f"{flag} takes {', '.join(options)} (got {value!r})")
    return got


def at_least(value: float | None, low: float, flag: str, what: str = "") -> None:
    """``value`` ≥ ``low`` (None: not given, fine)."""
    if value is not None and value < low:
        raise FeedbenchError(f"{flag} must be at least {low:g}{what} (got {value:g})")


def option_value(text: str) -> Any:
    """``"0.99"`` → 0.99, ``"4"`` → 4, ``"true"`` → True, anything else stays a string."""
    low = text.strip().lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def key_value(item: str, flag: str) -> tuple[str, Any]:
    """``"KEY=VALUE"`` → (key, typed value); one clear error otherwise."""
    key, eq, text = item.partition("=")
    key = key.strip()
    if not eq or not key:
        raise FeedbenchError(f"{flag} takes KEY=VALUE, not {item!r}")
    return key, option_value(text)
