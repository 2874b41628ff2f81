"""The synthetic ceiling run again after the loaders (issue 29): on one H200 a small batch's
launch-bound step moved ±10% between runs, and a loader measured "1.10 of the ceiling" beside
a ceiling that had been slow. The ceiling is the mean of its two runs, and its drift is said."""

from __future__ import annotations

import pytest

from feedbench.verify import analysis as va
from feedbench.verify.config import Plan, VerifyConfig
from feedbench.verify.results import VerifyResult, VerifyRun
from feedbench.verify.run import fold_ceiling, job_list
from tests.verify.test_verify import FAST, _result, _run


def _with_ceiling(before: float, after: float | None, loaders: dict[str, float]) -> VerifyResult:
    synth = _run("synthetic", 1, before, 0.0)
    runs = [synth] + [_run(name, 1, ips, 0.01) for name, ips in loaders.items()]
    result = _result(runs)
    if after is not None:
        fold_ceiling(result, _run("synthetic", 1, after, 0.0), "GPU")
    return va.compare(result)


def test_the_ceiling_is_the_mean_of_its_two_runs_and_its_own_fraction_stays_one():
    r = _with_ceiling(1604.0, 1460.0, {"wds": 1768.0, "torch": 1264.0})
    synth, wds, torch = r.runs
    assert len(r.runs) == 3  # the second run is folded in, not a run of its own
    assert synth.ceiling_after_images_per_s == 1460.0
    assert synth.ceiling_drift == pytest.approx(1460 / 1604 - 1)
    assert synth.ceiling_fraction == 1.0
    assert wds.ceiling_fraction == pytest.approx(1768 / 1532)
    assert torch.ceiling_fraction == pytest.approx(1264 / 1532)


def test_a_drift_of_three_percent_or_more_is_said_in_every_verdict():
    r = _with_ceiling(1604.0, 1460.0, {"wds": 1768.0})
    text = {v.loader: v.text for v in r.verdicts}
    assert text["synthetic"] == (
        "synthetic (compute + communication ceiling): 1,604 img/s on 1 GPU; again after the "
        "loaders 1,460 img/s (-9%): the ceiling is their mean, 1,532 img/s"
    )
    assert text["wds"].endswith(
        "; the ceiling moved -9% between its runs before and after the loaders (the host's "
        "speed drifting): fractions of it are resolved to about ±4%"
    )
    assert "1.15 of the ceiling" in text["wds"]


def test_a_steady_ceiling_is_not_said_beside_the_loaders():
    r = _with_ceiling(1600.0, 1620.0, {"torch": 1590.0})
    text = {v.loader: v.text for v in r.verdicts}
    assert "moved" not in text["torch"] and "0.99 of the ceiling" in text["torch"]
    assert "again after the loaders 1,620 img/s (+1%)" in text["synthetic"]


def test_one_run_only_keeps_the_old_figures():
    r = _with_ceiling(1600.0, None, {"torch": 1200.0})
    assert r.runs[0].ceiling_after_images_per_s is None
    assert r.runs[1].ceiling_fraction == pytest.approx(0.75)
    assert "again" not in r.verdicts[0].text


def test_a_second_run_that_failed_leaves_a_warning_and_the_first_run():
    synth = _run("synthetic", 2, 3000.0, 0.0)
    result = _result([synth, _run("torch", 2, 2900.0, 0.0)])
    broken = VerifyRun("synthetic", 2, 256, 512, status="failed", error="rank 1 died")
    fold_ceiling(result, broken, "GPU")
    assert synth.ceiling_after_images_per_s is None
    assert result.warnings == [
        "the synthetic ceiling's second run on 2 GPUs did not finish (rank 1 died): the "
        "fractions there rest on its first run alone"
    ]


def _plan(device: str, loaders: list[str]) -> Plan:
    return Plan(
        device=device, backend="gloo", unit="GPU", model="smallcnn", image_size=32,
        batch_size=4, steps=6, warmup=2, loaders=loaders, sources={}, samples={}, dataset=None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("device", "asked", "loaders", "again"),
    [
        ("cuda", None, ["synthetic", "torch"], True),  # the default on a GPU
        ("cpu", None, ["synthetic", "torch"], False),  # and off without one
        ("cpu", True, ["synthetic", "torch"], True),
        ("cuda", False, ["synthetic", "torch"], False),
        ("cuda", True, ["synthetic"], False),  # nothing to bracket
        ("cuda", True, ["torch"], False),  # no ceiling (--no-synthetic)
    ],
)
def test_the_ceiling_runs_again_after_the_loaders_at_each_count(device, asked, loaders, again):
    config = VerifyConfig(data="d", gpus=(1, 2), ceiling_twice=asked)
    jobs = job_list(config, _plan(device, loaders))
    each: list[tuple[str, int, bool]] = []
    for g in (1, 2):
        each += [(n, g, False) for n in loaders] + ([("synthetic", g, True)] if again else [])
    assert jobs == each


@pytest.mark.slow  # three real gloo runs in torchrun: ~40 s on 2 busy cores
def test_a_real_verify_runs_the_ceiling_twice_and_keeps_one_synthetic_row(cli, dataset, tmp_path):
    from feedbench.verify import results as verify_results

    out = tmp_path / "v.json"
    r = cli("verify", str(dataset), "-c", "1", "--loader", "torch", "--ceiling-twice", *FAST,
            "--json", str(out))  # fmt: skip
    assert r.code == 0, r.out + r.err
    res = verify_results.load(out)
    assert [(x.loader, x.gpus) for x in res.runs] == [("synthetic", 1), ("torch", 1)]
    synth, torch = res.runs
    assert synth.ceiling_after_images_per_s > 0
    assert synth.ceiling_drift == pytest.approx(
        synth.ceiling_after_images_per_s / synth.images_per_s - 1
    )
    mean = (synth.images_per_s + synth.ceiling_after_images_per_s) / 2
    assert torch.ceiling_fraction == pytest.approx(torch.images_per_s / mean)
    assert f"again after the loaders {synth.ceiling_after_images_per_s:,.0f} img/s" in r.out
    # the torch loader's worker (FAST: 1) made the window's batches, its time on them recorded
    (rank,) = torch.ranks
    assert rank.worker_batches is not None and len(rank.worker_batches) == 1
    assert rank.worker_batches[0] >= 1 and rank.worker_make_s[0] > 0
    assert rank.worker_slot_wait_s == [0.0]  # no slots on the CPU
    assert torch.worker_times is not None and torch.worker_times.batches == rank.worker_batches[0]
    assert synth.worker_times is None and synth.ranks[0].worker_batches is None
    # what the torch loader chose is kept and said: the CPU decode, its worker, its cores
    from loaders.affinity import RESERVE_CORES, cpu_list, loader_cores

    cores = loader_cores(RESERVE_CORES, 0, 1)
    chosen = "decode on the CPU (simplejpeg), 1 worker, " + (
        f"on cores {cpu_list(cores)}" if cores else "on every core"
    )
    assert torch.loader_settings == rank.loader_settings == chosen and synth.loader_settings is None
    assert f"loaders ran with: torch: {chosen}" in " ".join(r.out.split())  # lines wrapped


def test_the_slowdown_is_over_the_mean_ceiling_s_step_as_the_fraction_is():
    """With the ceiling run twice, a loader's extra work per step is taken over the ceiling's
    step at the mean rate (each part stretched alike), the step the fraction compares with."""
    from feedbench.verify.results import Breakdown

    def parts(wait, fwd, optim, other):
        return Breakdown(wait, fwd, 0.0, optim, other, wait + fwd + optim + other, 0.0, 0.0)

    synth = _run("synthetic", 1, 1600.0, 0.0)
    synth.breakdown = parts(0.0, 0.036, 0.003, 0.001)  # a 40 ms step at 64 per GPU
    torch_run = _run("torch", 1, 1390.0, 0.02)
    torch_run.breakdown = parts(0.001, 0.041, 0.003, 0.001)  # 46 ms, 1 ms of it waiting
    result = _result([synth, torch_run])
    fold_ceiling(result, _run("synthetic", 1, 1455.0, 0.0), "GPU")
    va.compare(result)
    k = 1600 / ((1600 + 1455) / 2)  # the ceiling's step at the mean rate: 41.9 ms
    assert torch_run.slowdown_s == pytest.approx(0.045 - 0.040 * k)  # 3.1 ms, not 5.0
    assert torch_run.slowdown_parts_s["forward_backward_s"] == pytest.approx(0.041 - 0.036 * k)
    text = next(v.text for v in result.verdicts if v.loader == "torch")
    assert "the loader slows training by 3.1 ms per step" in text
    assert "over the synthetic ceiling's 41.9 ms step" in text


def test_a_failed_first_ceiling_is_replaced_by_the_run_after_the_loaders():
    failed = VerifyRun("synthetic", 1, 256, 256, status="failed", error="rank 0 died")
    result = _result([failed, _run("torch", 1, 1500.0, 0.01)])
    fold_ceiling(result, _run("synthetic", 1, 1600.0, 0.0), "GPU")
    va.compare(result)
    assert [(r.loader, r.status) for r in result.runs] == [
        ("synthetic", "failed"), ("torch", "ok"), ("synthetic", "ok")
    ]  # fmt: skip
    assert result.runs[1].ceiling_fraction == pytest.approx(1500 / 1600)
    assert result.warnings == [
        "the synthetic ceiling's first run on 1 GPU did not finish: the fractions there rest "
        "on its run after the loaders alone"
    ]


def test_what_each_loader_ran_with_is_said_once_or_per_rank_count():
    """verify's "loaders ran with" line: a loader's settings once when every run had the same,
    per rank count where they differ (each rank's cores, a default that moves with the
    count); runs without settings (synthetic, a user's loader, older files) say nothing."""
    from feedbench.report.verify_console import ran_with

    runs = [_run("synthetic", 1, 4000.0, 0.0), _run("dali", 1, 3900.0, 0.0),
            _run("dali", 2, 7700.0, 0.0), _run("torch", 1, 3900.0, 0.0),
            _run("torch", 2, 7600.0, 0.0), _run("torch", 4, 15000.0, 0.0)]  # fmt: skip
    cpu = "decode on the CPU, resize on the GPU, 16 threads, on cores 2-15"
    runs[1].loader_settings = runs[2].loader_settings = cpu
    runs[3].loader_settings = "decode on the CPU, 14 workers, on cores 2-15"
    runs[4].loader_settings = runs[5].loader_settings = (
        "decode on the CPU, 6 workers, on cores 4-15"
    )
    assert ran_with(runs, "GPU") == [
        f"dali: {cpu}",
        "torch on 1 GPU: decode on the CPU, 14 workers, on cores 2-15",
        "torch on 2, 4 GPUs: decode on the CPU, 6 workers, on cores 4-15",
    ]
    assert ran_with(runs[:1], "GPU") == []
