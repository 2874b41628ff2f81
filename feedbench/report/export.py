"""Writing a results file's document in the formats asked for (HTML, Markdown, CSV), each
atomically, from one :class:`~feedbench.report.doc.Document`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from feedbench.core.errors import NotWritten
from feedbench.core.files import write_atomic
from feedbench.report import csv_export, markdown
from feedbench.report import html as html_page
from feedbench.report.doc_scan import Projected
from feedbench.report.kinds import document, fit_projection

Target = str | os.PathLike[str] | None


def write_exports(
    kind: str, result: Any, source: str, *, html: Target = None, md: Target = None,
    csv: Target = None,
) -> list[tuple[str, Path]]:  # fmt: skip
    """Write each format given a path; return (format, path) for each written."""
    wanted = [(name, path) for name, path in (("html", html), ("md", md), ("csv", csv)) if path]
    if not wanted:
        return []
    fitted = fit_projection(result, source) if kind == "scan" else None  # text and figure
    doc = document(kind, result, source, fitted)
    written = []
    for name, path in wanted:
        _write(path, _render(name, kind, result, doc, source, fitted))
        written.append((name, Path(path)))
    return written


def _render(name: str, kind: str, result: Any, doc, source: str, fitted: Projected | None) -> str:
    if name == "html":
        return html_page.page(doc, html_page.figures(kind, result, fitted), source)
    return markdown.to_markdown(doc) if name == "md" else csv_export.to_csv(doc)


def _write(path: str | os.PathLike[str], text: str) -> None:
    try:
        write_atomic(path, text.encode("utf-8"))
    except OSError as e:
        raise NotWritten(f"cannot write {path}: {e.strerror or e}") from e
