"""``feedbench report``: re-render any results file (scan, verify, compare) on the console, or as
one self-contained HTML page: the same rich tables and sentences as the command printed, and
its plots embedded as PNG. Never measures; everything comes from the file."""

from __future__ import annotations

import base64
import html
import io
import os
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

from feedbench.errors import FeedbenchError
from feedbench.results import write_atomic

KINDS = ("scan", "verify", "compare")


def load_any(path: str | os.PathLike[str]) -> tuple[str, Any]:
    """(kind, result) of any results file, or one clear error."""
    from feedbench import results
    from feedbench.compare import Comparison
    from feedbench.verify_results import VerifyResult

    data = results.read(path)
    kind = data.get("kind", "scan")
    classes = {"scan": results.ScanResult, "verify": VerifyResult, "compare": Comparison}
    if kind not in classes:
        raise FeedbenchError(f"{path} holds {kind!r} results: report reads {', '.join(KINDS)}")
    return kind, results.load(path, kind, classes[kind], data)


def render(kind: str, result: Any, console: Console) -> None:
    if kind == "scan":
        from feedbench.render import render_scan

        render_scan(result, console)
    elif kind == "verify":
        from feedbench.verify_results import render_verify

        render_verify(result, console)
    else:
        from feedbench.render import render_compare

        render_compare(result, console)


def plots(kind: str, result: Any, directory: str) -> list[Path]:
    """The command's own figures, written to ``directory``."""
    if kind == "scan":
        from feedbench.plots import write_all

        return write_all(result, directory, "scan") if result.measurements else []
    if kind == "verify":
        from feedbench.verify_results import write_plots

        return write_plots(result, directory, "verify") if result.runs else []
    from feedbench.plots import compare_plot

    p = compare_plot(result, Path(directory) / "compare.png")
    return [p] if p is not None else []


def to_html(kind: str, result: Any, source: str, width: int = 110) -> str:
    """One page: the console rendering (colours kept, inline styles) and the plots as data URIs."""
    console = Console(record=True, width=width, file=io.StringIO(), color_system="truecolor")
    render(kind, result, console)
    pre = '<pre style="font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px">'
    body = console.export_html(inline_styles=True, code_format=pre + "{code}</pre>")
    images = []
    with tempfile.TemporaryDirectory(prefix="feedbench-report-") as d:
        for p in plots(kind, result, d):
            data = base64.b64encode(p.read_bytes()).decode()
            images.append(
                f'<figure><img alt="{html.escape(p.stem)}" src="data:image/png;base64,{data}">'
                f"<figcaption>{html.escape(p.stem)}</figcaption></figure>"
            )
    title = f"feedbench {kind}: {Path(source).name}"
    return (
        '<!doctype html>\n<html><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}"
        "img{max-width:100%}figure{margin:1.5em 0}figcaption{color:#555;font-size:90%}</style>"
        f"</head><body><h1>{html.escape(title)}</h1>\n{body}\n{''.join(images)}\n"
        "</body></html>\n"
    )


def write_html(kind: str, result: Any, source: str, target: str | os.PathLike[str]) -> Path:
    try:
        write_atomic(target, to_html(kind, result, source))
    except OSError as e:
        raise FeedbenchError(f"cannot write {target}: {e.strerror or e}") from e
    return Path(target)
