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

from feedbench.core.errors import FeedbenchError
from feedbench.core.files import write_atomic
from feedbench.report.kinds import headline, plots, render


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
    lead = "".join(f"<p class=lead>{html.escape(line)}</p>" for line in headline(kind, result))
    command = html.escape(" ".join(getattr(result, "command", []) or []))
    return (
        '<!doctype html>\n<html><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}"
        "img{max-width:100%}figure{margin:1.5em 0}figcaption{color:#555;font-size:90%}"
        ".lead{font-size:120%;font-weight:600}code{font-size:90%}"
        "@media print{body{margin:0;max-width:none}figure{break-inside:avoid}}</style>"
        f"</head><body><h1>{html.escape(title)}</h1>\n{lead}\n{body}\n{''.join(images)}\n"
        f"<p>command: <code>{command}</code></p></body></html>\n"
    )


def write_html(kind: str, result: Any, source: str, target: str | os.PathLike[str]) -> Path:
    try:
        write_atomic(target, to_html(kind, result, source))
    except OSError as e:
        raise FeedbenchError(f"cannot write {target}: {e.strerror or e}") from e
    return Path(target)
