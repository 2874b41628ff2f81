"""Counts in words, for every output and the verdict: "1 consumer", "3 batches"."""

from __future__ import annotations


def plural(word: str) -> str:
    """The plural of ``word`` (of its last word): "batch" → "batches", "loading process" →
    "loading processes", "consumer" → "consumers"."""
    return word + ("es" if word.endswith(("ch", "sh", "s", "x")) else "s")


def count(n: int | float, word: str) -> str:
    """``n`` and ``word``, plural unless ``n`` is one: "1 consumer", "3 batches"."""
    return f"{n:,} {word if n == 1 else plural(word)}"


def setup_text(consumers: int, workers: int) -> str:
    """How a measurement loaded its data: "2 consumers × 1 worker"; with no workers each
    consumer loads in its own process ("1 consumer, loading in its own process")."""
    if workers == 0:
        own = "its own process" if consumers == 1 else "their own processes"
        return f"{count(consumers, 'consumer')}, loading in {own}"
    return f"{count(consumers, 'consumer')} × {count(workers, 'worker')}"
