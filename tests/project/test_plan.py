"""``feedbench plan`` on scans of known curves: the projection, its band, the held-out check,
the cost per fed accelerator, the figure, and the refusals as one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from feedbench.core import envelope
from feedbench.project import projection
from tests.project.scans import scan, usl_rates

COUNTS = [1, 2, 4, 8, 16]
TRUE = (150.0, 0.05, 0.002)  # λ, σ, κ: the knee at √(0.95 / 0.002) ≈ 21.8


def write(tmp_path, result, name="scan.json"):
    path = tmp_path / name
    envelope.save(result, path)
    return str(path)


def test_plan_projects_the_knee_with_its_band_and_checks_the_largest_count(cli, tmp_path):
    src = write(tmp_path, scan(usl_rates(COUNTS, *TRUE, 0.03, seed=1), appetite=100.0))
    r = cli("plan", src, "--at", "32", "--cost", "64000", "--json", str(tmp_path / "p.json"))
    assert r.code == 0, r.err
    p = json.loads((tmp_path / "p.json").read_text())
    assert p["kind"] == "plan" and p["demand"] == pytest.approx(90.0)  # 100/s at AU 0.9
    cold = p["passes"][0]
    assert cold["chosen"] == "usl" and cold["reach"] == 64
    knee = cold["knee"]
    assert knee["low"] <= 21.8 <= knee["high"]
    # fed: N while N × 90 ≤ X(N); the true curve crosses 90·N where X(N)/N = 90, at N ≈ 14.2
    assert 11 <= cold["fed"]["value"] <= 17 and cold["fed"]["low"] <= cold["fed"]["value"]
    at = cold["fed_at_target"]
    assert cold["usd_per_fed"]["value"] == pytest.approx(64000 / at["value"])
    held = cold["held_out"]
    assert held["consumers"] == 16 and held["fitted_counts"] == [1, 2, 4, 8]
    assert held["within"] is True and abs(held["error"]) < 0.1 and held["too_wide"] is False
    assert "held-out check: fitted on 1, 2, 4, 8, predicted 16" in r.out
    assert "cannot go past one client" in r.out
    assert r.out.splitlines()[1].startswith("Slowed on purpose: 10 ms added to every file read")
    assert "flag: the scan emulated an accelerator step: no consumer took more" in r.out
    assert (tmp_path / "p.png").exists()


def test_the_figure_holds_points_band_demand_and_knee(tmp_path):
    from feedbench.project.plots import plan_figure

    result = scan(usl_rates(COUNTS, *TRUE, 0.03, seed=2), appetite=100.0)
    ask = projection.Ask(demand=90.0)
    env = {"kind": "plan", "created_utc": "", "command": [], "config": {}}
    plan = projection.plan(result, "s.json", ask, None, env, 100.0, 0.9)
    ax = plan_figure(plan).axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[0] == "95% band" and labels[1] == "fit: USL"
    assert "demand of N accelerators (90/s each)" in labels
    assert any(lb.startswith("knee N* ≈ 2") for lb in labels)
    demand = next(line for line in ax.get_lines() if line.get_label().startswith("demand"))
    assert demand.get_ydata()[-1] == pytest.approx(64 * 90)
    assert ax.get_xlim() == (0, 64) and ax.get_ylabel() == "aggregate samples/s"
    (note,) = [t.get_text() for t in ax.texts]
    assert note.startswith("held-out check:\nfitted on 1, 2, 4, 8, predicted 16: ")
    assert "\nmeasured " in note


def test_unjudged_counts_are_left_out_and_flagged(cli, tmp_path):
    rates = usl_rates([*COUNTS, 32], *TRUE, 0.03, seed=3)
    rates[32] = [10.0, 10.0, 10.0]  # a count no figure may come from: every repeat failed
    result = scan(rates)
    for m in result.measurements:
        if m.consumers == 32:
            m.failed = "stalled"
    r = cli("plan", write(tmp_path, result), "--json", str(tmp_path / "p.json"), "--no-plots")
    assert r.code == 0, r.err
    # judged by today's sizing rules on load, whatever the file says
    assert "flag: 32 consumers not judged (no repeat completed): left out of the fit" in r.out
    assert "flag: not valid for sizing: " in r.out and "a measurement failed" in r.out
    assert "emulated an accelerator step" not in r.out  # no step: the storage's own curve
    p = json.loads((tmp_path / "p.json").read_text())
    assert "32" not in p["passes"][0]["points"] and p["passes"][0]["reach"] == 64


@pytest.mark.parametrize(
    ("counts", "args", "message"),
    [
        ([1, 2, 4], [], r"no projection: cold: 3 judged consumer counts \(1, 2, 4\)"),
        (COUNTS, ["--at", "65"], r"target 65 is beyond 4× the largest count measured \(16\)"),
        (COUNTS, ["--cost", "100"], r"--cost needs a demand"),
        (COUNTS, ["--passes", "warm"], r"has no warm pass \(it has cold\)"),
        (COUNTS, ["--target-au", "1.5", "--rate", "10"], r"--target-au 1.5"),
    ],
)
def test_refusals_are_one_line(cli, tmp_path, counts, args, message):
    import re

    src = write(tmp_path, scan(usl_rates(counts, *TRUE, 0.03, seed=4)))
    r = cli("plan", src, "--json", str(tmp_path / "p.json"), *args)
    assert r.code == 2, r.out + r.err
    assert re.search(message, r.err) and len(r.err.strip().splitlines()) == 1, r.err
    assert "Traceback" not in r.err and not (tmp_path / "p.json").exists()


def test_report_shows_a_plan_with_its_band_and_held_out_check(cli, tmp_path):
    src = write(tmp_path, scan(usl_rates(COUNTS, *TRUE, 0.03, seed=5), appetite=100.0))
    plan_json = tmp_path / "p.json"
    assert cli("plan", src, "--at", "32", "--no-plots", "--json", str(plan_json)).code == 0
    html, md, csv = tmp_path / "p.html", tmp_path / "p.md", tmp_path / "p.csv"
    r = cli("report", str(plan_json), "--html", str(html), "--md", str(md), "--csv", str(csv))
    assert r.code == 0, r.err
    assert "held-out check: fitted on 1, 2, 4, 8, predicted 16" in r.out  # the terminal's
    text = md.read_text()
    assert text.startswith("# How far does this storage scale?")
    assert "**cold pass, USL: " in text and "accelerators fed at AU ≥ 90%" in text
    assert "held-out check: fitted on 1, 2, 4, 8, predicted 16" in text
    assert "cannot go past one client" in text
    assert "## System under test" in text and "**described as**: test NAS" in text
    assert "> **Slowed on purpose: 10 ms added to every file read" in text  # the scan's
    assert "**CPU**: " in text
    page = html.read_text()
    assert page.count("data:image/png;base64,") == 1 and "held-out check" in page
    rows = csv.read_text().splitlines()
    assert rows[0].startswith("pass,model,lambda (samples/s),sigma,kappa")
    assert [r.split(",")[1] for r in rows[1:]] == ["usl", "amdahl", "limit"]


def test_a_cap_no_point_reaches_is_bounded_below_only():
    from feedbench.project import fit

    rates = usl_rates(COUNTS, 100.0, 0.0, 0.0, 0.01, seed=6)  # linear: no ceiling measured
    n = [c for c, xs in rates.items() for _ in xs]
    f = fit.fit("limit", n, [x for xs in rates.values() for x in xs])
    lo, hi = f.intervals["cap"]
    assert lo == pytest.approx(max(max(xs) for xs in rates.values())) and hi == float("inf")
    p = projection.summary(f)
    assert p.intervals["cap"][1] is None  # JSON holds no Infinity
    knee, _ = projection.knee_bands(f)
    assert knee.high is None


def test_a_pass_with_too_few_counts_is_refused_and_the_other_projected(cli, tmp_path):
    from tests.project.scans import measurement

    result = scan(usl_rates(COUNTS, *TRUE, 0.03, seed=7))
    warm = usl_rates([1, 2, 4], *TRUE, 0.03, seed=8)
    result.measurements += [measurement(n, x, i + 1, "warm") for n, xs in warm.items()
                            for i, x in enumerate(xs)]  # fmt: skip
    r = cli("plan", write(tmp_path, result), "--no-plots", "--json", str(tmp_path / "p.json"))
    assert r.code == 0, r.err
    assert "refused: warm: 3 judged consumer counts (1, 2, 4); a fit needs ≥ 4" in r.out
    p = json.loads((tmp_path / "p.json").read_text())
    assert [x["pass_name"] for x in p["passes"]] == ["cold"] and len(p["refused"]) == 1


def test_a_rate_flat_from_one_consumer_leaves_the_per_consumer_rate_bounded_below_only():
    from feedbench.project import fit

    rates = {n: [150.0 * (1 + 0.02 * k) for k in (-1, 0, 1)] for n in COUNTS}  # flat: at the cap
    n = [c for c, xs in rates.items() for _ in xs]
    f = fit.fit("limit", n, [x for xs in rates.values() for x in xs])
    lo, hi = f.intervals["per_consumer"]
    assert lo == pytest.approx(f.params["cap"]) and hi == float("inf")
    assert np.allclose(projection.draw_rates(f, np.array([1.0, 64.0])), f.draws[:, [1, 1]])


def test_the_knee_of_a_curve_no_consumer_adds_to_is_one_consumer():
    knee, rate = projection.knee_of("usl", np.array([200.0, 1.0, 0.05]))
    assert knee == 1.0 and rate == pytest.approx(200.0)


def test_a_held_out_band_wider_than_its_prediction_says_the_check_says_little(cli, tmp_path):
    # the S3 curve of BENCHMARKS: up at 2, halved at 4, flat after
    rates = {1: [289.0, 320.0, 258.0], 2: [300.0, 296.0, 304.0], 4: [149.0, 117.0, 181.0],
             8: [156.0, 133.0, 179.0], 16: [146.0, 114.0, 178.0]}  # fmt: skip
    r = cli("plan", write(tmp_path, scan(rates)), "--no-plots", "--json", str(tmp_path / "p.json"))
    assert r.code == 0, r.err
    held = json.loads((tmp_path / "p.json").read_text())["passes"][0]["held_out"]
    assert held["too_wide"] is True
    assert "a band wider than the prediction itself: the check says little" in r.out


def test_a_knee_past_four_times_the_largest_count_is_flagged_as_extrapolated():
    result = scan(usl_rates(COUNTS, 150.0, 0.01, 0.0002, 0.002, seed=9), appetite=100.0)
    env = {"kind": "plan", "created_utc": "", "command": [], "config": {}}
    plan = projection.plan(result, "s.json", projection.Ask(demand=90.0), None, env, 100.0, 0.9)
    (p,) = plan.passes
    assert p.chosen == "usl" and p.knee.value > 64  # true knee ≈ 70
    assert any(f.startswith("the knee (N* ≈ ") and "extrapolated" in f for f in p.flags)
