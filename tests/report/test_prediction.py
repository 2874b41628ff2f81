"""``feedbench compare scan.json verify.json``: scan's predicted data wait beside verify's measured
one, for the same loader and count: a real scan of verify's stock recipe (through
``--loader feedbench.verify.loaders:stock_loader``) against a real verify of ``baseline``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from feedbench.report.prediction import STOCK_FACTORY

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stock_scan(tmp_path_factory, dataset):
    """24 images in batches of 2, one worker: 12 batches, the warm-up at most half of them (longer
    on a busy host), so at least 6 measured: enough."""
    out = tmp_path_factory.mktemp("pred") / "s.json"
    cmd = [sys.executable, "-m", "feedbench.cli", "scan", str(dataset / "images"), "--loader",
           STOCK_FACTORY, "--consumers", "1", "--batch-size", "2", "--workers", "1",
           "--step-time", "0.01", "--passes", "warm", "--no-plots", "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_the_prediction_is_set_beside_the_measurement(cli, stock_scan, verify_run, tmp_path):
    verify_json, _ = verify_run
    out = tmp_path / "p.json"
    r = cli("compare", str(stock_scan), str(verify_json), "--passes", "warm", "--json", str(out))
    assert r.code == 0, r.out + r.err
    scan, ver = json.loads(stock_scan.read_text()), json.loads(verify_json.read_text())
    point = next(p for p in scan["curve"] if p["consumers"] == 1 and p["pass_name"] == "warm")
    run = next(x for x in ver["runs"] if x["loader"] == "baseline")
    (pair,) = json.loads(out.read_text())["pairs"]
    assert pair["loader"] == "baseline" and pair["gpus"] == 1
    assert pair["predicted_au"] == point["au_mean"]
    assert pair["measured_wait"] == run["data_wait_fraction"]
    want = abs(1 - point["au_mean"] - run["data_wait_fraction"]) * 100
    assert pair["difference_points"] == pytest.approx(want)
    assert pair["same_data"]  # both read the dataset's image tree
    assert pair["not_judged"] is None  # ≥ 6 measured batches, one worker: enough to judge by
    line = next(ln for ln in r.out.splitlines() if ln.startswith("baseline at 1 GPU: "))
    assert f"scan predicted AU {point['au_mean']:.3f}" in line
    assert f"verify measured {run['data_wait_fraction']:.1%} data wait" in line
    apart = f"{pair['difference_points']:.1f} points apart"
    assert f"{'agree' if want <= 5.0 else 'disagree'}: {apart}" in line
    assert pair["resolution_points"] == 0.0  # no synthetic ceiling compared: none to resolve
    # the check is a results file like any other: shown again, as a page and as CSV
    again = cli("report", str(out), "--html", str(tmp_path / "p.html"), "--csv",
                str(tmp_path / "p.csv"))  # fmt: skip
    assert again.code == 0 and line in again.out, again.err
    page = (tmp_path / "p.html").read_text()
    assert "Did the scan predict the training run?" in page
    row = (tmp_path / "p.csv").read_text().splitlines()[1]
    assert row.startswith("baseline,1,")


def test_nothing_to_pair_is_one_line(cli, scan_json, verify_run):
    verify_json, _ = verify_run  # scan_json: scan's own pipeline, no --loader
    r = cli("compare", str(scan_json), str(verify_json))
    assert r.code == 2
    assert r.err.strip().startswith("error: no scan and verify run share a loader and count")
    assert "Traceback" not in r.err


def test_a_scan_window_too_short_to_predict_by_is_not_judged(cli, dataset, verify_run, tmp_path):
    """Two workers can have two batches ready when the window opens: the 6 batches less the
    warm-up (at least one per worker) are under the sizing rule's 10, and the pair says so
    instead of agree or disagree."""
    verify_json, _ = verify_run
    scan = tmp_path / "short.json"
    cmd = [sys.executable, "-m", "feedbench.cli", "scan", str(dataset / "images"), "--loader",
           STOCK_FACTORY, "--consumers", "1", "--batch-size", "4", "--workers", "2",
           "--step-time", "0.01", "--passes", "warm", "--no-plots", "--json",
           str(scan)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "p.json"
    r = cli("compare", str(scan), str(verify_json), "--passes", "warm", "--json", str(out))
    assert r.code == 0, r.out + r.err
    (pair,) = json.loads(out.read_text())["pairs"]
    (c,) = json.loads(scan.read_text())["measurements"][0]["per_consumer"]
    measured = c["batches"] - c["warmup_batches"]
    assert c["batches"] == 6 and 2 <= c["warmup_batches"] <= 3  # one per worker, ≤ half
    said = f"the scan measured {measured} batches per consumer (needs ≥ 10)"
    assert pair["not_judged"] == said
    assert f"not judged: {said}" in " ".join(r.out.split())
    text = " ".join(r.out.split())
    assert "n/a" in text.split("baseline at 1 GPU")[0]  # the table's agree column


@pytest.mark.parametrize(
    ("fmt", "source", "same"),
    [
        ("tree", "/d/images", True),  # a scan of a sample's root reads its images/ folder
        ("shards", "/d/shards/", True),
        ("tree", "/d/shards", False),  # the other folder: not what the scan read
        ("shards", "/d", True),
        ("tree", "/e/images", False),
    ],
)
def test_a_scan_of_a_sample_root_pairs_with_verify_of_its_folder(fmt, source, same):
    from types import SimpleNamespace

    from feedbench.core.envelope import DatasetInfo
    from feedbench.report.prediction import _same_data

    scan = SimpleNamespace(dataset=DatasetInfo("/d", fmt, 1, 1, 1))
    assert _same_data(scan, SimpleNamespace(source=source)) is same


def test_the_emulated_step_is_the_one_the_consumers_timed_alone():
    """--emulate gpu runs the model's real step: the host's length, not the profile's."""
    from types import SimpleNamespace as NS

    from feedbench.report.prediction import _step_alone

    def measurement(n, pass_name, alone):
        return NS(consumers=n, pass_name=pass_name,
                  per_consumer=[NS(step_alone_s=a) for a in alone])  # fmt: skip

    scan = NS(measurements=[measurement(1, "warm", [0.0548]), measurement(1, "warm", [0.0552]),
                            measurement(1, "warm", [0.0546]), measurement(2, "warm", [0.06, 0.06]),
                            measurement(1, "cold", [0.07])])  # fmt: skip
    assert _step_alone(scan, NS(consumers=1, pass_name="warm")) == 0.0548  # the median
    asleep = NS(
        measurements=[NS(consumers=1, pass_name="warm", per_consumer=[NS(step_alone_s=None)])]
    )
    assert _step_alone(asleep, NS(consumers=1, pass_name="warm")) is None  # the profile's, then


def _prediction(
    difference: float, resolution: float, not_judged: str | None = None, scan_spread: float = 0.0
):
    from feedbench.report.prediction import Prediction

    return Prediction(
        loader="torch", gpus=1, pass_name="warm", scan_label="s", verify_label="v",
        predicted_au=0.9, predicted_wait=0.1, scan_step_s=0.03, measured_wait=0.02,
        measured_wait_max=0.02, verify_compute_step_s=0.03, ceiling_fraction=0.85,
        same_data=True, difference_points=difference, not_judged=not_judged,
        resolution_points=resolution, scan_resolution_points=scan_spread,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("difference", "resolution", "verdict", "agrees"),
    [
        (4.0, 7.0, "agree", True),
        (8.0, 7.0, "unresolved", None),  # 3 points past the bar, within verify's ±7
        (12.0, 7.0, "unresolved", None),  # at the edge: 5 + 7
        (12.5, 7.0, "disagree", False),
        (8.0, 0.0, "disagree", False),  # a steady ceiling resolves it
    ],
)
def test_a_difference_within_verifys_own_drift_is_unresolved(
    difference, resolution, verdict, agrees
):
    """verify's ceiling measured before and after its loaders moved by 2 × resolution (a host's
    drift): a fraction of it is known only to ± that, and so is the scan's distance from it."""
    from feedbench.report.prediction import sentence

    p = _prediction(difference, resolution)
    assert (p.verdict, p.agrees) == (verdict, agrees)
    line = sentence(p)
    assert f"{verdict}: {difference:.1f} points apart" in line
    assert ("±7 points" in line) == (verdict == "unresolved")


def test_not_judged_wins_over_unresolved():
    from feedbench.report.prediction import sentence

    p = _prediction(8.0, 7.0, not_judged="the scan measured 3 batches per consumer (needs ≥ 10)")
    assert (p.verdict, p.agrees) == ("not judged", None)
    assert "not judged: the scan measured 3" in sentence(p)


def test_the_resolution_is_half_the_drift_of_the_synthetic_run_at_that_count():
    from types import SimpleNamespace as NS

    from feedbench.report.prediction import _resolution

    ver = NS(runs=[NS(loader="synthetic", gpus=1, ceiling_drift=-0.14),
                   NS(loader="synthetic", gpus=2, ceiling_drift=0.02),
                   NS(loader="torch", gpus=1, ceiling_drift=None)])  # fmt: skip

    def run(gpus, fraction):
        return NS(gpus=gpus, ceiling_fraction=fraction, paired=None)

    assert _resolution(ver, run(1, 0.8)) == pytest.approx(7.0)
    assert _resolution(ver, run(2, 0.9)) == pytest.approx(1.0)
    assert _resolution(ver, run(4, 0.9)) == 0.0  # no ceiling run there
    assert _resolution(ver, run(1, None)) == 0.0  # waits compared instead


def test_a_paired_verify_is_judged_by_its_paired_fraction_and_interval():
    """verify --interleave: its fraction paired in one process replaces the one against its
    ceiling run, and half its 95% interval replaces half the ceiling's drift."""
    from types import SimpleNamespace as NS

    from feedbench.report.prediction import _difference, _fraction, _resolution, sentence
    from feedbench.verify.results import Paired

    ver = NS(runs=[NS(loader="synthetic", gpus=1, ceiling_drift=-0.14)])
    paired = Paired(block_steps=40, pairs=8, ceiling_step_s=0.02, slowdown_s=0.001,
                    slowdown_lo_s=0.0005, slowdown_hi_s=0.0015, ceiling_fraction=0.93,
                    ceiling_fraction_lo=0.91, ceiling_fraction_hi=0.95)  # fmt: skip
    run = NS(gpus=1, ceiling_fraction=0.80, paired=paired, data_wait_fraction=0.02)
    assert _fraction(run) == 0.93
    assert _resolution(ver, run) == pytest.approx(2.0)  # not the ceiling's ±7
    assert _difference(0.90, run) == pytest.approx(3.0)  # against 0.93, not 0.80
    one = NS(gpus=1, ceiling_fraction=0.8, data_wait_fraction=0.02,
             paired=Paired(40, 1, 0.02, 0.001, None, None, 0.93, None, None))  # fmt: skip
    assert _resolution(ver, one) == 0.0  # one pair: no interval to widen it by
    p = _prediction(6.0, 2.0)  # 1 point past the bar, within the interval's ±2
    p.paired = True
    line = sentence(p)
    assert "(paired in one process)" in line
    assert "verify's paired fraction is known to ±2 points (95%)" in line


@pytest.mark.parametrize(
    ("difference", "verify_res", "scan_res", "verdict"),
    [
        (8.0, 0.0, 4.0, "unresolved"),  # the scan's repeats alone spread ±4
        (12.0, 3.0, 4.0, "unresolved"),  # at the edge: 5 + 3 + 4
        (12.5, 3.0, 4.0, "disagree"),
        (4.0, 0.0, 4.0, "agree"),
    ],
)
def test_the_scans_repeat_spread_widens_what_is_left_open(
    difference, verify_res, scan_res, verdict
):
    """A scan whose repeats' AUs spread (a start-up inside one, a host that drifted) predicts only
    to ± half their range: a difference within it and verify's drift is not called a miss."""
    from feedbench.report.prediction import sentence

    p = _prediction(difference, verify_res, scan_spread=scan_res)
    assert p.verdict == verdict
    line = sentence(p)
    assert "scan predicted AU 0.900 ± 0.040 " in line  # the spread beside the prediction
    assert ("the scan's AU is known to ±4 points" in line) == (verdict == "unresolved")
    assert ("verify's ceiling moved" in line) == (verdict == "unresolved" and verify_res > 0)


def test_the_scan_resolution_is_half_the_range_of_its_completed_repeats():
    from types import SimpleNamespace as NS

    from feedbench.report.prediction import _scan_resolution

    def m(au, consumers=1, pass_name="warm", failed=False, partial=False):
        return NS(consumers=consumers, pass_name=pass_name, au_mean=au, failed=failed,
                  partial=partial)  # fmt: skip

    scan = NS(measurements=[m(0.33), m(0.93), m(0.94), m(0.10, consumers=2),
                            m(0.05, pass_name="cold"), m(0.01, failed=True),
                            m(0.02, partial=True)])  # fmt: skip
    # issue 29's DALI scan: 0.33, 0.93, 0.94 → ±30.5 points; other counts, passes and
    # failed or partial repeats do not count
    assert _scan_resolution(scan, NS(consumers=1, pass_name="warm")) == pytest.approx(30.5)
    assert _scan_resolution(scan, NS(consumers=2, pass_name="warm")) == 0.0  # one repeat


def test_a_step_alone_that_moved_over_a_pass_widens_the_scans_resolution():
    """Run 20's wds scan: the model's step alone was 24.2 ms before the pass and 30.9 ms after
    (the host's speed), the AU 0.813 measured against their mean. The AU is then known to no
    better than 0.813 × 6.7 / 55.1 = ±9.9 points, though one repeat has no spread; the mean of
    several repeats to the mean of theirs; a step timed once (or a sleep) adds nothing."""
    from types import SimpleNamespace as NS

    from feedbench.report.prediction import _scan_resolution

    def m(au, before, after):
        c = NS(step_alone_before_s=before, step_alone_after_s=after)
        return NS(consumers=1, pass_name="warm", au_mean=au, failed=False, partial=False,
                  per_consumer=[c])  # fmt: skip

    point = NS(consumers=1, pass_name="warm")
    drifted = NS(measurements=[m(0.813, 0.0242, 0.0309)])
    assert _scan_resolution(drifted, point) == pytest.approx(0.813 * 0.0067 / 0.0551 * 100)
    steady = NS(measurements=[m(0.90, 0.0300, 0.0300), m(0.94, 0.0300, 0.0303)])
    assert _scan_resolution(steady, point) == pytest.approx(2.0)  # the spread is more
    # the mean AU of three repeats, one of which drifted: a third of its ±9.9
    mixed = NS(measurements=[m(0.813, 0.0242, 0.0309), m(0.813, 0.03, 0.03), m(0.813, 0.03, 0.03)])
    assert _scan_resolution(mixed, point) == pytest.approx(0.813 * 0.0067 / 0.0551 * 100 / 3)
    assert _scan_resolution(NS(measurements=[m(0.9, None, None)]), point) == 0.0


def test_a_verify_window_that_drained_leaves_a_lower_prediction_open():
    """verify's torch at 0.85 of the ceiling, its last quarter at 0.77 (a queue filled in a slow
    step drained inside the window): a scan at 0.78 is 7 points below the whole but within the
    drain, so unresolved; a scan 7 points above it gains nothing from the drain (it only
    overstates)."""
    from dataclasses import replace
    from types import SimpleNamespace as NS

    from feedbench.report.prediction import _drain_points, sentence

    run = NS(ceiling_fraction=0.85, drain=NS(last_quarter_ceiling_fraction=0.77))
    assert _drain_points(run) == pytest.approx(8.0)
    assert _drain_points(NS(ceiling_fraction=0.85, drain=None)) == 0.0
    below = replace(_prediction(7.0, 0.0), predicted_au=0.78, verify_drain_points=8.0)
    assert below.verdict == "unresolved"
    assert "its last quarter ran 8 points below the whole" in sentence(below)
    above = replace(_prediction(7.0, 0.0), predicted_au=0.92, verify_drain_points=8.0)
    assert above.verdict == "disagree" and "drained" not in sentence(above)
