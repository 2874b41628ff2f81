"""feedbench report: any results file shown again, on the console and as one HTML page."""

from __future__ import annotations

import html
import json
import re

import pytest


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_a_scan_is_shown_again_and_as_html_with_its_plots(cli, scan_json, tmp_path):
    verdict = json.loads(scan_json.read_text())["verdict"]["text"]
    page = tmp_path / "scan.html"
    r = cli("report", str(scan_json), "--html", str(page))
    assert r.code == 0, r.out + r.err
    assert _flat(f"verdict: {verdict}") in _flat(r.out)
    text = page.read_text()
    assert text.startswith("<!doctype html>") and text.rstrip().endswith("</html>")
    assert text.count("data:image/png;base64,") >= 2  # scaling and timeline
    assert "scaling (samples/s" in text and "verdict" in text
    assert "not valid for sizing" in text  # 24 images: the page says it, as the terminal did
    assert "storage: " in text and "client: " in text and " cores, " in text  # what was tested
    # the answer first (the verdict, whether it may size), and the exact command last
    lead = re.findall(r"<p class=lead>(.*?)</p>", text)
    assert lead and lead[0] == html.escape(verdict) and lead[-1].startswith("not valid for sizing")
    assert (
        text.index("<p class=lead>") < text.index("<pre")
        and "command: <code>feedbench scan" in text
    )


def test_a_verify_result_is_shown_again(cli, verify_run, tmp_path):
    out, first = verify_run
    again = cli("report", str(out), "--html", str(tmp_path / "v.html"))
    assert again.code == 0, again.err
    line = next(ln for ln in first.splitlines() if ln.startswith("baseline:"))
    assert _flat(line) in _flat(again.out)  # the same verdict, from the file
    assert "data:image/png;base64," in (tmp_path / "v.html").read_text()


def test_a_comparison_is_shown_again(cli, scan_json, tmp_path):
    cmp = tmp_path / "c.json"
    r = cli("compare", str(scan_json), str(scan_json), "-L", "a", "-L", "b", "--json", str(cmp))
    assert r.code == 0, r.out + r.err
    again = cli("report", str(cmp), "--html", str(tmp_path / "c.html"))
    assert again.code == 0, again.err
    assert "throughput by consumer count" in again.out
    ranking = next(ln for ln in r.out.splitlines() if ln.startswith("at 1 consumer"))
    assert _flat(ranking) in _flat(again.out)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, r"no such results file"),
        ("{not json", r"is not a feedbench results file"),
        ('{"schema_version": 2, "kind": "recipe"}', r"holds 'recipe' results: report reads scan"),
        ('{"kind": "scan"}', r"no schema_version"),
    ],
)
def test_bad_files_are_one_line_and_exit_2(cli, tmp_path, content, message):
    path = tmp_path / "x.json"
    if content is not None:
        path.write_text(content)
    r = cli("report", str(path))
    assert r.code == 2, r.out + r.err
    assert re.search(r"^error: ", r.err) and re.search(message, _flat(r.err)), r.err
    assert "Traceback" not in r.err
