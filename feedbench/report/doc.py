"""A results file as a document: the one shape the HTML page, the Markdown and the CSV render.

Each kind (scan, compare, verify) builds a :class:`Document` once (``doc_*`` modules); the
exporters only lay it out. Table rows keep their numbers as numbers (the CSV writes them as the
results file holds them); the text a person reads is made per column, when shown.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Row = dict[str, Any]


@dataclass(frozen=True)
class Shown:
    """One column a person reads: its heading and the text of a row's cell."""

    label: str
    text: Callable[[Row], str]
    align: str = "right"


@dataclass
class Table:
    """Rows of raw values, shown through ``columns`` and exported through ``csv`` (the CSV
    header, with its unit, and the row key it reads). ``csv_rows``, where given, are the rows
    the CSV writes instead: more than a page shows (a scan's every repeat beside its mean)."""

    title: str
    rows: list[Row]
    columns: list[Shown]
    csv: list[tuple[str, str]] = field(default_factory=list)
    note: str | None = None
    csv_rows: list[Row] | None = None

    def cells(self) -> list[list[str]]:
        return [[c.text(r) for c in self.columns] for r in self.rows]

    def records(self) -> list[list[Any]]:
        rows = self.rows if self.csv_rows is None else self.csv_rows
        return [[r.get(key) for _, key in self.csv] for r in rows]


@dataclass
class SystemBlock:
    """One system under test: facts as (what, value), and what makes its numbers not the
    system's own (``flags``: slowed on purpose, partial results)."""

    title: str
    facts: list[tuple[str, str]]
    flags: list[str] = field(default_factory=list)


@dataclass
class Document:
    kind: str
    title: str
    subtitle: str
    answer: list[str]  # the headline: the first sentence is the answer, the rest support it
    valid: bool | None  # valid for sizing; None where the kind has no sizing rules
    broken: list[str]  # each broken sizing rule, in words
    summary: Table
    tables: list[Table] = field(default_factory=list)
    systems: list[SystemBlock] = field(default_factory=list)
    method: list[tuple[str, str]] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)  # verdicts, rankings: sentences
    # the scaling projection (feedbench plan's, made from the results): lines, and what they are
    projection: list[str] = field(default_factory=list)
    projection_note: str = ""
    warnings: list[str] = field(default_factory=list)
    command: str = ""
    created_utc: str = ""
    tool_version: str = ""


def dash(x: Any, fmt: Callable[[Any], str] = str) -> str:
    """``fmt(x)``, or an em dash for a value the results do not hold."""
    return "—" if x is None else fmt(x)


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def command_text(argv: list[str] | None) -> str:
    """The command as a shell would take it back (each argument quoted where it needs to be)."""
    import shlex

    return shlex.join(argv or [])


def side_by_side(systems: list[SystemBlock]) -> Table:
    """Several systems' facts as one table: a row per fact, a column per system, so that a
    reader compares them across."""
    whats: list[str] = []
    for b in systems:  # a fact one system has alone goes after the fact it follows there
        at = -1
        for what, _ in b.facts:
            if what not in whats:
                whats.insert(at + 1, what)
            at = whats.index(what)
    rows = [{"what": w, **{str(i): dict(b.facts).get(w, "—") for i, b in enumerate(systems)}}
            for w in whats]  # fmt: skip
    columns = [Shown("", lambda r: r["what"], "left")] + [
        Shown(b.title, lambda r, k=str(i): r[k], "left") for i, b in enumerate(systems)
    ]
    return Table(title="The systems side by side", rows=rows, columns=columns)
