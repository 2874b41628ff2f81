"""``feedbench report --md``: a results file as Markdown for a procurement document: the answer
(with "not valid for sizing" and why), the summary table, the system under test and the command.
Plain CommonMark plus pipe tables (GitHub, GitLab, Confluence, pandoc all read them)."""

from __future__ import annotations

from feedbench.report.doc import Document, Table


def _cell(text: str) -> str:
    """A table cell's text: pipes escaped and line breaks folded, so the row stays one row."""
    return " ".join(text.replace("\\", "\\\\").replace("|", "\\|").split())


def table(t: Table) -> list[str]:
    heads = [_cell(c.label) or " " for c in t.columns]
    rule = ["---:" if c.align == "right" else ":---" for c in t.columns]
    lines = [f"**{t.title}**", "", "| " + " | ".join(heads) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(_cell(x) for x in row) + " |" for row in t.cells()]
    if t.note:
        lines += ["", f"_{t.note}_"]
    return lines


def _validity(doc: Document) -> list[str]:
    if doc.valid is None:
        return []
    if doc.valid:
        return ["**Valid for sizing**: the run follows every sizing rule.", ""]
    return ["**Not valid for sizing**: this run is a measurement, not a basis for buying:", ""] + [
        f"- {reason}" for reason in doc.broken
    ] + [""]  # fmt: skip


def to_markdown(doc: Document) -> str:
    lines = [f"# {doc.title}", "", f"_{doc.subtitle}_", ""]
    if doc.answer:
        lines += [f"**{doc.answer[0]}**", ""] + [f"{line}\n" for line in doc.answer[1:]]
    lines += _validity(doc)
    for block in doc.systems:
        lines += [f"> **{block.title}: {flag}**\n" if len(doc.systems) > 1 else f"> **{flag}**\n"
                  for flag in block.flags]  # fmt: skip
    lines += ["## Summary", "", *table(doc.summary), ""]
    lines += ["## System under test", ""]
    for block in doc.systems:
        if len(doc.systems) > 1:
            lines += [f"### {block.title}", ""]
        lines += [f"- **{what}**: {value}" for what, value in block.facts] + [""]
    if doc.warnings:
        lines += ["## Warnings", ""] + [f"- {w}" for w in doc.warnings] + [""]
    made = f"_feedbench {doc.tool_version}, results written {doc.created_utc}._"
    lines += ["## Command", "", "```", doc.command, "```", "", made, ""]
    return "\n".join(lines)
