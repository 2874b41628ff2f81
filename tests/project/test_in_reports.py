"""The projection where a scan is reported: the scan's page (HTML, Markdown) and the compare
page show what ``feedbench plan`` computes for the same file, or plan's refusal, in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from feedbench.core import envelope
from feedbench.project.console import num
from feedbench.report import compare
from feedbench.report.doc_compare import compare_document
from feedbench.report.html import caption, figures, page
from tests.project.scans import scan, usl_rates
from tests.report.pages import flat, read_page

RECORDED = Path(__file__).resolve().parents[2] / "benchmarks" / "2026-12-03-devvm-plan"
LAT10 = RECORDED / "scan-lat10.json.gz"  # 1, 2, 4, 8, 16 consumers, reads slowed by 10 ms


def _band(b: dict | list) -> str:
    lo, hi = (b["low"], b["high"]) if isinstance(b, dict) else b[2:]
    value = b["value"] if isinstance(b, dict) else b[1]
    return f"{num(value)} ({num(lo)}–{num(hi)})"


def _plan(cli, src, tmp_path) -> dict:
    r = cli("plan", str(src), "--json", str(tmp_path / "plan.json"), "--no-plots")
    assert r.code == 0, r.err
    return json.loads((tmp_path / "plan.json").read_text())


def _too_few(tmp_path) -> Path:
    path = tmp_path / "few.json"
    envelope.save(scan({1: [100.0, 101.0], 2: [190.0, 192.0], 4: [350.0, 356.0]}), path)
    return path


def test_the_scan_page_shows_plans_projection_band_and_held_out_check(cli, tmp_path):
    cold = _plan(cli, LAT10, tmp_path)["passes"][0]
    html, md = tmp_path / "s.html", tmp_path / "s.md"
    r = cli("report", str(LAT10), "--html", str(html), "--md", str(md))
    assert r.code == 0, r.err
    shown = read_page(html.read_text())
    assert shown.sections[:3] == ["answer", "summary", "projection"]
    lines = shown.by_class["projected"]
    n, *_ = cold["curve"][-1]
    assert cold["chosen"] == "amdahl" and n == 64  # the recorded plan-lat10.json's choice
    assert lines[0] == (
        f"cold pass, chosen: Amdahl (κ = 0) by lowest AICc; at 64 consumers (4× the largest "
        f"measured): {_band(cold['curve'][-1])} samples/s"
    )
    knee = f"knee N*: none (Amdahl has no peak); ceiling: {_band(cold['ceiling'])}"
    assert lines[1].startswith(knee)
    h = cold["held_out"]
    assert h["fitted_counts"] == [1, 2, 4, 8] and h["within"] is True
    held = (
        f"held-out check: fitted on 1, 2, 4, 8, predicted 16: {_band(h['predicted'])} samples/s;"
        f" measured {num(h['measured'])} ({h['repeats']} repeats), {h['error']:+.1%}: inside "
        "the band"
    )
    assert held in lines
    assert lines[-1].startswith("clients: one client measured")
    # the plan's figure among the page's, and the same lines in the Markdown
    assert flat(caption("plan", demand=False)) in flat(shown.text_of["charts"])
    text = md.read_text()
    assert "## Projection" in text and f"- {held}" in text


def test_the_scan_page_fits_its_projection_once_for_text_and_figure(tmp_path, monkeypatch):
    from feedbench.project import projection
    from feedbench.report.export import write_exports
    from feedbench.report.kinds import load_any

    fits = []
    fit = projection.plan
    monkeypatch.setattr(projection, "plan", lambda *a, **k: fits.append(a[1]) or fit(*a, **k))
    kind, result = load_any(LAT10)
    html, md = tmp_path / "s.html", tmp_path / "s.md"
    write_exports(kind, result, str(LAT10), html=html, md=md)
    assert fits == [str(LAT10)]  # one fit: the page's text and its figure both draw it
    shown = read_page(html.read_text())
    assert shown.by_class["projected"][0].startswith("cold pass, chosen: Amdahl")
    assert flat(caption("plan", demand=False)) in flat(shown.text_of["charts"])
    assert "## Projection" in md.read_text()


@pytest.mark.parametrize("appetite", [None, 100.0])
def test_captions_name_the_accelerators_demand_only_where_the_figure_draws_it(appetite, tmp_path):
    """A scan with no accelerator (no --profile, --rate or --step-time) has no demand to draw:
    its captions do not promise one."""
    result = scan(usl_rates([1, 2, 4, 8, 16], 150.0, 0.05, 0.002, 0.03, seed=2), appetite)
    got = [f.caption for f in figures("scan", result)]
    demand = appetite is not None
    assert got == [caption("scan-scaling", demand), caption("plan", demand)]
    assert all(("demand" in c) is demand for c in got), got
    envelope.save(result, tmp_path / "s.json")
    cmp = compare.compare([str(tmp_path / "s.json")] * 2, ["a", "b"])
    (fig,) = figures("compare", cmp)
    assert fig.caption == caption("compare-scaling", demand)
    assert ("demand" in fig.caption) is demand


def test_a_scan_with_too_few_counts_shows_plans_refusal(cli, tmp_path):
    src = _too_few(tmp_path)
    r = cli("plan", str(src), "--no-plots", "--json", str(tmp_path / "p.json"))
    assert r.code == 2
    refusal = r.err.strip().removeprefix("error: ")
    assert refusal.startswith("no projection: cold: 3 judged consumer counts (1, 2, 4)")
    md = tmp_path / "few.md"
    assert cli("report", str(src), "--md", str(md)).code == 0
    text = md.read_text()
    section = text[text.index("## Projection") : text.index("## System under test")]
    assert section.splitlines()[2] == f"- {flat(refusal)}"
    assert "held-out" not in section


def test_the_compare_page_shows_one_projection_line_per_scan(cli, tmp_path):
    cold = _plan(cli, LAT10, tmp_path)["passes"][0]
    cmp = compare.compare([str(LAT10), str(_too_few(tmp_path))], ["lat10", "few"])
    compare.save(cmp, tmp_path / "c.json")  # kept in the comparison: the page reads it back
    again = compare.load(tmp_path / "c.json")
    shown = read_page(page(compare_document(again, "c.json"), [], "c.json"))
    lat10, few = shown.by_class["projected"]
    h = cold["held_out"]
    assert lat10 == (
        f"lat10: Amdahl (κ = 0), at 64 consumers (4× the largest measured): "
        f"{_band(cold['curve'][-1])} samples/s; held-out check at 16: {h['error']:+.1%}, inside "
        "the band"
    )
    assert few.startswith("few: no projection: cold: 3 judged consumer counts (1, 2, 4)")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # scipy's, on the way to its ValueError
def test_points_no_fit_takes_leave_the_page_a_refusal_not_a_traceback():
    from feedbench.project.section import one_line

    zero = scan({n: [0.0, 0.0] for n in (1, 2, 4, 8)})
    assert one_line(zero, "z.json", "cold") == (
        "no projection: cold: nothing delivered at 1, 2, 4, 8 consumers: no curve to fit"
    )


def test_plan_of_rates_of_zero_is_one_error_line(cli, tmp_path):
    path = tmp_path / "z.json"
    envelope.save(scan({n: [0.0, 0.0] for n in (1, 2, 4, 8)}), path)
    r = cli("plan", str(path), "--no-plots", "--json", str(tmp_path / "p.json"))
    assert r.code == 2, r.out + r.err
    assert r.err.strip() == (
        "error: no projection: cold: nothing delivered at 1, 2, 4, 8 consumers: no curve to fit"
    )
