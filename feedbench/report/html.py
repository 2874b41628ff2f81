"""``feedbench report --html``: any results file (scan, verify, compare) as one self-contained
page: the answer first (with "not valid for sizing" and why), the summary table, the charts,
the system under test, the method and warnings, the exact command. Styles are inline and the
charts are PNG data URIs: the page loads nothing, so it opens offline and prints as it shows.
Never measures; everything comes from the file."""

from __future__ import annotations

import base64
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2

from feedbench.report import compare_plots, scan_plots
from feedbench.report.doc import Document, side_by_side
from feedbench.report.doc_scan import Projected
from feedbench.report.kinds import fit_projection, plots

# what each figure shows, by the end of its file name; "{demand}" is DEMAND's clause where the
# figure draws the accelerators' demand (the results hold an accelerator's rate), else nothing
CAPTIONS = {
    "scan-scaling": "Throughput against consumers (mean ± std over repeats){demand}. Below: "
    "each stage's own rate.",
    "scan-au": "Accelerator utilisation against consumers, mean and worst consumer, with the "
    "target AU.",
    "scan-timeline": "Resources during every measurement, one after another: CPU cores busy, "
    "disk and network MB/s (and GPU when present).",
    "compare-scaling": "Samples/s and MB/s against consumers, one line per system{demand}.",
    "verify-scaling": "Training images/s against ranks, per loader, with the synthetic ceiling.",
    "verify-breakdown": "Where each training step's time goes, per loader and rank count.",
    "plan": "Measured aggregate samples/s (mean, min–max over repeats), the chosen model's "
    "curve with its 95% band to 4× the largest count{demand}, the knee.",
}
_DEMAND_LINE = ", with the accelerators' demand: N × one accelerator's samples/s"
DEMAND = {"scan-scaling": _DEMAND_LINE, "compare-scaling": _DEMAND_LINE,
          "plan": ", the demand of N accelerators"}  # fmt: skip


def caption(stem: str, demand: bool) -> str:
    """What the figure ``stem`` shows: the accelerators' demand named only where it is drawn."""
    return CAPTIONS.get(stem, stem).replace("{demand}", DEMAND.get(stem, "") if demand else "")


def _demand_drawn(kind: str, result: Any, fitted: Projected | None) -> dict[str, bool]:
    """Which figures draw the accelerators' demand, by the rule each figure draws it by."""
    plan = result if kind == "plan" else fitted[0] if fitted is not None else None
    return {
        "scan-scaling": kind == "scan" and scan_plots.accelerator_rate(result) is not None,
        "compare-scaling": kind == "compare" and compare_plots.draws_demand(result),
        "plan": plan is not None and plan.demand is not None,
    }


@dataclass
class Embedded:
    caption: str
    src: str  # a data: URI


def _template() -> jinja2.Template:
    files = resources.files("feedbench.report") / "templates"
    env = jinja2.Environment(autoescape=True, trim_blocks=False, undefined=jinja2.StrictUndefined)
    return env.from_string(files.joinpath("page.html").read_text(encoding="utf-8"))


def figures(kind: str, result: Any, fitted: Projected | None = None) -> list[Embedded]:
    """The command's own plots, drawn again from the results, as PNG data URIs (a scan's
    projection: ``fitted`` where the page fitted it already, else fitted here)."""
    if kind == "scan" and fitted is None:
        fitted = fit_projection(result, "")
    demand = _demand_drawn(kind, result, fitted)
    out = []
    with tempfile.TemporaryDirectory(prefix="feedbench-report-") as d:
        for p in plots(kind, result, d, fitted):
            data = base64.b64encode(p.read_bytes()).decode("ascii")
            uri = f"data:image/png;base64,{data}"
            out.append(Embedded(caption(p.stem, demand.get(p.stem, False)), uri))
    return out


def page(doc: Document, figs: list[Embedded], source: str) -> str:
    css = (resources.files("feedbench.report") / "templates" / "page.css").read_text("utf-8")
    validity = {True: "valid", False: "invalid", None: "plain"}[doc.valid]
    return _template().render(
        doc=doc,
        figures=figs,
        css=css,
        validity=validity,
        source=Path(source).name,
        side_by_side=side_by_side,
    )
