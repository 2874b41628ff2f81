"""``feedbench report``: re-render any results file (scan, verify, compare) on the console, or as
one self-contained HTML page: the same rich tables and sentences as the command printed, and
its plots embedded as PNG. Never measures; everything comes from the file."""

from __future__ import annotations

import base64
import html
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

from feedbench.errors import FeedbenchError
from feedbench.results import SCHEMA_VERSION, write_atomic

KINDS = ("scan", "verify", "compare")


def kind_of(path: str | os.PathLike[str]) -> str:
    """What a results file holds, or one clear error."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FeedbenchError(f"no such results file: {path}") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FeedbenchError(f"{path} is not a feedbench results file: {e}") from None
    if not isinstance(data, dict) or "schema_version" not in data:
        raise FeedbenchError(f"{path} is not a feedbench results file (no schema_version)")
    kind = data.get("kind", "scan")
    if kind not in KINDS:
        raise FeedbenchError(f"{path} holds {kind!r} results: report reads {', '.join(KINDS)}")
    return kind


def load_comparison(path: str | os.PathLike[str]):
    from feedbench.compare import Column, Comparison, Ranking
    from feedbench.results import CurvePoint, from_dict

    data = json.loads(Path(path).read_text())
    if data.get("schema_version") != SCHEMA_VERSION:
        raise FeedbenchError(
            f"{path} has schema_version {data.get('schema_version')}; "
            f"this feedbench reads {SCHEMA_VERSION}"
        )
    try:
        columns = []
        for col in data["columns"]:
            points = {int(k): from_dict(CurvePoint, v) for k, v in col["points"].items()}
            columns.append(from_dict(Column, {**col, "points": {}}))
            columns[-1].points = points
        cmp = from_dict(Comparison, {**data, "columns": [], "rankings": []})
        cmp.columns = columns
        cmp.rankings = [from_dict(Ranking, r) for r in data.get("rankings", [])]
    except (KeyError, TypeError, ValueError) as e:
        raise FeedbenchError(f"{path} does not match the compare results schema: {e}") from None
    return cmp


def load_any(path: str | os.PathLike[str]) -> tuple[str, Any]:
    kind = kind_of(path)
    if kind == "scan":
        from feedbench.results import load

        return kind, load(path)
    if kind == "verify":
        from feedbench.verify_results import load as load_verify

        return kind, load_verify(path)
    return kind, load_comparison(path)


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
