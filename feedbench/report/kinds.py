"""Every kind of results file, and what reporting does with each: load, show, draw, and make
into a document (for the HTML page, the Markdown and the CSV)."""

from __future__ import annotations

import os
import typing
from pathlib import Path
from typing import Any

from rich.console import Console

from feedbench.core import envelope
from feedbench.core.errors import FeedbenchError
from feedbench.project import console as plan_console
from feedbench.project import doc_plan, projection, section
from feedbench.project import plots as plan_plots
from feedbench.report import (
    compare,
    compare_console,
    compare_plots,
    doc_compare,
    doc_scan,
    doc_verify,
    prediction,
    scan_console,
    scan_plots,
    verify_console,
    verify_plots,
)
from feedbench.report.current_rules import load_scan
from feedbench.report.doc import Document
from feedbench.report.doc_scan import Projected
from feedbench.report.fmt import shown
from feedbench.scan import results as scan_results
from feedbench.verify import results as verify_results

KINDS = {
    "scan": (scan_results.ScanResult, scan_console.render_scan),
    "verify": (verify_results.VerifyResult, verify_console.render_verify),
    "compare": (compare.Comparison, compare_console.render_compare),
    "prediction": (prediction.PredictionCheck, prediction.render),
    "plan": (projection.Plan, plan_console.render_plan),
}


def load_any(path: str | os.PathLike[str]) -> tuple[str, Any]:
    """(kind, result) of any results file, or one clear error."""
    data = envelope.read(path)
    kind = data.get("kind", "scan")
    if kind not in KINDS:
        raise FeedbenchError(f"{path} holds {kind!r} results: report reads {', '.join(KINDS)}")
    if kind == "scan":  # judged by today's sizing rules, whichever feedbench wrote it
        return kind, load_scan(path, data)[0]
    result = envelope.load(path, kind, KINDS[kind][0], data)
    if kind == "verify":  # the renderers read its config and host: checked like its fields
        try:
            envelope.check_fields({"host": envelope.HostInfo}, data, "", ("host",))
            envelope.check_fields(_verify_config_types(), result.config, "config")
        except envelope.SchemaMismatch as e:
            raise FeedbenchError(f"{path}: {e}") from None
    return kind, result


def _verify_config_types() -> dict[str, Any]:
    """A verify's config: its :class:`VerifyConfig`, and what planning added to it."""
    from feedbench.verify.config import VerifyConfig

    added = {"options_per_loader": dict[str, dict[str, Any]], "sources": dict[str, str],
             "loader_code": dict[str, Any], "loaders": list[str],
             "ddp_options": dict[str, Any]}  # fmt: skip
    return typing.get_type_hints(VerifyConfig) | added


def render(kind: str, result: Any, console: Console, wide: bool = False) -> None:
    """The results in the terminal; ``wide``: a scan's every column."""
    if kind == "scan":
        scan_console.render_scan(result, console, wide)
    else:
        KINDS[kind][1](result, console)


def fit_projection(result: scan_results.ScanResult, source: str) -> Projected:
    """What ``feedbench plan`` makes of a scan by default: fitted once for a page's text
    (:func:`document`) and its figure (:func:`plots`)."""
    return section.default_plan(shown(result), source)


def plots(kind: str, result: Any, directory: str, fitted: Projected | None = None) -> list[Path]:
    """The command's own figures, written to ``directory`` (a scan's: with its projection,
    ``fitted`` where the page fitted it already)."""
    if kind == "scan":
        if not result.measurements:
            return []
        target = result.sizing.target_au if result.sizing and result.sizing.target_au else None
        target = target or result.config.get("target_au") or 0.9
        drawn = scan_plots.write_all(result, directory, "scan", target=target)
        # the page's Projection, drawn as plan draws it
        plan, _ = fitted if fitted is not None else section.default_plan(result, "")
        projected = plan_plots.plan_plot(plan, Path(directory) / "plan.png") if plan else None
        return drawn + ([projected] if projected is not None else [])
    if kind == "verify":
        return verify_plots.write_plots(result, directory, "verify") if result.runs else []
    if kind == "prediction":
        return []
    if kind == "plan":
        drawn = plan_plots.plan_plot(result, Path(directory) / "plan.png")
        return [drawn] if drawn is not None else []
    p = compare_plots.compare_plot(result, Path(directory) / "compare-scaling.png")
    return [p] if p is not None else []


def document(kind: str, result: Any, source: str, fitted: Projected | None = None) -> Document:
    """The results as a document (answer, summary table, system, method, command): what the
    HTML page, the Markdown and the CSV lay out (a scan's with its projection ``fitted``
    where the page fitted it already)."""
    if kind == "scan":  # names from the data: control characters visible
        return doc_scan.scan_document(shown(result), source, fitted)
    build = {"verify": doc_verify.verify_document, "compare": doc_compare.compare_document,
             "prediction": prediction.prediction_document,
             "plan": doc_plan.plan_document}[kind]  # fmt: skip
    return build(shown(result), source)  # names from the data: control characters visible
