"""A figure with its band: the one shape every projected figure of a plan takes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Band:
    """A figure and its 95% band (None: unbounded on that side, e.g. no peak)."""

    value: float | None
    low: float | None
    high: float | None
