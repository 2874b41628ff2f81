"""Every kind of results file, and what reporting does with each: load, show, draw."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rich.console import Console

from feedbench.core import envelope
from feedbench.core.errors import FeedbenchError
from feedbench.report import (
    compare,
    compare_console,
    compare_plots,
    prediction,
    scan_console,
    scan_plots,
    verify_console,
    verify_plots,
)
from feedbench.scan import results as scan_results
from feedbench.verify import results as verify_results

KINDS = {
    "scan": (scan_results.ScanResult, scan_console.render_scan),
    "verify": (verify_results.VerifyResult, verify_console.render_verify),
    "compare": (compare.Comparison, compare_console.render_compare),
    "prediction": (prediction.PredictionCheck, prediction.render),
}


def load_any(path: str | os.PathLike[str]) -> tuple[str, Any]:
    """(kind, result) of any results file, or one clear error."""
    data = envelope.read(path)
    kind = data.get("kind", "scan")
    if kind not in KINDS:
        raise FeedbenchError(f"{path} holds {kind!r} results: report reads {', '.join(KINDS)}")
    return kind, envelope.load(path, kind, KINDS[kind][0], data)


def render(kind: str, result: Any, console: Console) -> None:
    KINDS[kind][1](result, console)


def plots(kind: str, result: Any, directory: str) -> list[Path]:
    """The command's own figures, written to ``directory``."""
    if kind == "scan":
        return scan_plots.write_all(result, directory, "scan") if result.measurements else []
    if kind == "verify":
        return verify_plots.write_plots(result, directory, "verify") if result.runs else []
    if kind == "prediction":
        return []
    p = compare_plots.compare_plot(result, Path(directory) / "compare-scaling.png")
    return [p] if p is not None else []


def headline(kind: str, result: Any) -> list[str]:
    """The answer first, in a sentence or two: what a reader of the page needs before tables."""
    if kind == "scan":
        lines = [result.verdict.text] if result.verdict else []
        z = result.sizing
        if z is not None and z.accelerators_fed is not None and result.accelerator:
            name = result.accelerator.get("name") or "accelerator"
            lines.insert(0, f"Feeds {compare.fed_text(z.accelerators_fed, z.accelerators_fed_std)}"
                            f" × {name} at AU ≥ {z.target_au:.0%}.")  # fmt: skip
        if z is not None:
            lines.append(z.label())
        return lines
    if kind == "compare":
        return [result.winner] if result.winner else list(result.summary[:1])
    if kind == "prediction":
        return [prediction.sentence(p) for p in result.pairs]
    return [v.text for v in result.verdicts[:1]] if getattr(result, "verdicts", None) else []
