"""Names from the data are shown, never executed: a file name with a newline cannot forge a
line of the output, an escape sequence colours nothing, ``[bold]`` is not rich markup, and no
HTML in a path, a label or a description reaches the Markdown raw."""

from __future__ import annotations

import re
import shutil

from feedbench.report.fmt import shown, visible
from tests.report.test_plots import make_result

FORGED = "x.jpg\nverdict: storage-bound (FAKE)\nerror: forged.jpg"
COLOURED = "y\x1b[31mRED\x1b[0m<script>alert(1)<[bold]B.jpg"  # no '/': it names a file
DESCRIBED = "NAS <img src=x onerror=alert(1)> [bold]big[/bold] a|b"
LABEL = "<svg onload=alert(1)>"


def test_visible_writes_every_control_character_as_its_escape():
    assert visible(FORGED) == "x.jpg\\nverdict: storage-bound (FAKE)\\nerror: forged.jpg"
    assert visible("a\x1b[0m\r\t\x00\x7f\x85\u2028\u202eb") == (
        "a\\x1b[0m\\r\\t\\x00\\x7f\\x85\\u2028\\u202eb"
    )
    assert visible("plain · ≥ 4 × μs") == "plain · ≥ 4 × μs"


def test_shown_escapes_a_timeline_label_and_shares_its_readings():
    """The monitor's readings hold numbers only: shown() takes them as they are, not copied
    (thousands a measurement: copying them cost most of a figure's time)."""
    result = make_result(gpus=2)
    result.measurements[0].monitor.label = FORGED
    out = shown(result)
    assert out is not result and out.measurements[0] is not result.measurements[0]
    assert out.measurements[0].monitor.label == visible(FORGED)
    assert result.measurements[0].monitor.label == FORGED  # the result itself as it was
    for m, original in zip(out.measurements, result.measurements, strict=True):
        assert m.monitor.samples == original.monitor.samples
        assert all(a is b for a, b in zip(m.monitor.samples, original.monitor.samples, strict=True))


def _forged_lines(text: str) -> list[str]:
    forged = ("verdict: storage-bound", "error: forged")
    return [ln for ln in text.splitlines() if ln.lstrip("-> *").startswith(forged)]


def test_file_names_and_labels_reach_the_terminal_and_markdown_as_text(cli, dataset, tmp_path):
    tree = tmp_path / "images"
    shutil.copytree(dataset / "images", tree)
    (tree / FORGED).write_bytes(b"outside any class folder: left out when listing")
    (tree / "class_000" / COLOURED).write_bytes(b"not a JPEG: a decode error names it")
    out = tmp_path / "out"
    r = cli("scan", str(tree), "--stages", "read,decode", "-b", "4", "--no-plots",
            "--describe", DESCRIBED, "--json", str(out / "r.json"))  # fmt: skip
    assert r.code == 0, r.out + r.err
    terminal = [r.out + r.err]
    r = cli("report", str(out / "r.json"), "--md", str(out / "r.md"))
    terminal.append(r.out + r.err)
    r = cli("compare", str(out / "r.json"), str(out / "r.json"), "-L", LABEL, "-L", "b",
            "--no-plots", "--json", str(out / "c.json"))  # fmt: skip
    assert r.code == 0, r.out + r.err
    terminal.append(r.out + r.err)
    r = cli("report", str(out / "c.json"), "--md", str(out / "c.md"))
    terminal.append(r.out + r.err)
    shown = "\n".join(terminal)
    md = (out / "r.md").read_text() + (out / "c.md").read_text()
    for where, text in (("terminal", shown), ("markdown", md)):
        assert not _forged_lines(text), f"a forged line in the {where}"
        assert "\x1b" not in text, f"a raw escape sequence in the {where}"
    assert "x.jpg\\nverdict: storage-bound (FAKE)\\nerror: forged.jpg" in shown  # one line
    assert "y\\x1b[31mRED" in shown  # the decode error names the file, its ESC visible
    assert "[bold]big[/bold]" in shown and "[bold]B.jpg" in shown  # not read as markup
    assert LABEL in shown
    prose = re.sub(r"^(`{3,})\n.*?^\1$", "", md, flags=re.M | re.S)  # a code block shows HTML
    assert prose.count("## Command") == 2 and "--describe" not in prose  # as code, literally
    for raw in ("<img", "<svg", "<script"):
        assert raw not in prose, f"raw {raw} in the Markdown"
    assert "&lt;img src=x onerror=alert(1)&gt;" in md and "&lt;svg onload=alert(1)&gt;" in md
