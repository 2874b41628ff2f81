"""``feedbench report --md``: a results file as Markdown for a procurement document: the answer
(with "not valid for sizing" and why), the summary table, the system under test and the command.
Plain CommonMark plus pipe tables (GitHub, GitLab, Confluence, pandoc all read them)."""

from __future__ import annotations

import re

from feedbench.report.doc import Document, Table
from feedbench.report.fmt import visible

_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def _text(text: str) -> str:
    """Text as Markdown shows it, never as markup it runs: control characters visible (a name
    cannot start a line of its own), backslashes kept, ``<``, ``>`` and ``&`` as entities (no
    raw HTML from a path, a label or a results file reaches the page)."""
    text = visible(text).replace("\\", "\\\\")
    return re.sub("[&<>]", lambda m: _HTML[m.group()], text)


def _cell(text: str) -> str:
    """A table cell's text: as :func:`_text`, pipes escaped, so the row stays one row."""
    return " ".join(_text(text).replace("|", "\\|").split())


def _fenced(code: str) -> list[str]:
    """``code`` in a fence longer than any run of backticks in it (a command line quoting one
    cannot close the block early); inside it Markdown reads no HTML."""
    fence = "`" * max(3, 1 + max((len(r) for r in re.findall("`+", code)), default=0))
    return [fence, visible(code), fence]


def table(t: Table) -> list[str]:
    heads = [_cell(c.label) or " " for c in t.columns]
    rule = ["---:" if c.align == "right" else ":---" for c in t.columns]
    lines = [f"**{_text(t.title)}**", "", "| " + " | ".join(heads) + " |"]
    lines += ["| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(_cell(x) for x in row) + " |" for row in t.cells()]
    if t.note:
        lines += ["", f"_{_text(t.note)}_"]
    return lines


def _validity(doc: Document) -> list[str]:
    if doc.valid is None:
        return []
    if doc.valid:
        return ["**Valid for sizing**: the run follows every sizing rule.", ""]
    return ["**Not valid for sizing**: this run is a measurement, not a basis for buying:", ""] + [
        f"- {_text(reason)}" for reason in doc.broken
    ] + [""]  # fmt: skip


def to_markdown(doc: Document) -> str:
    lines = [f"# {_text(doc.title)}", "", f"_{_text(doc.subtitle)}_", ""]
    if doc.answer:
        lines += [f"**{_text(doc.answer[0])}**", ""] + [f"{_text(x)}\n" for x in doc.answer[1:]]
    lines += _validity(doc)
    for block in doc.systems:
        lines += [f"> **{_text(block.title)}: {_text(flag)}**\n" if len(doc.systems) > 1
                  else f"> **{_text(flag)}**\n" for flag in block.flags]  # fmt: skip
    lines += ["## Summary", "", *table(doc.summary), ""]
    if doc.projection:
        lines += ["## Projection", ""] + [f"- {_text(x)}" for x in doc.projection] + [""]
        lines += [f"_{_text(doc.projection_note)}_", ""] if doc.projection_note else []
    lines += ["## System under test", ""]
    for block in doc.systems:
        if len(doc.systems) > 1:
            lines += [f"### {_text(block.title)}", ""]
        lines += [f"- **{_text(what)}**: {_text(value)}" for what, value in block.facts] + [""]
    if doc.warnings:
        lines += ["## Warnings", ""] + [f"- {_text(w)}" for w in doc.warnings] + [""]
    made = f"_feedbench {doc.tool_version}, results written {doc.created_utc}._"
    lines += ["## Command", "", *_fenced(doc.command), "", made, ""]
    return "\n".join(lines)
