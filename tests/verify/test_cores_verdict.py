"""A loader that waits for data: the verdict says whether the host's cores explain it, from the
run's busy cores (psutil, the measured window) against the machine's count. Recorded H200
results (run 13) and the rule's edges."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from feedbench.core.timeline import STEAL_SAID
from feedbench.verify import results as verify_results
from feedbench.verify.analysis import CPU_FULL, WAIT_EXPLAINED, compare, cores_text, steal_text

RUN13 = Path(__file__).resolve().parents[2] / "benchmarks" / "2026-12-04-h200-run13"


def _verdicts(name: str) -> dict[str, str]:
    result = verify_results.load(RUN13 / f"{name}.json.gz")
    compare(result)
    return {v.loader: v.text for v in result.verdicts}


def test_recorded_h200_runs_say_whether_the_cpu_explains_the_wait():
    """256 per GPU: wds waited 9.2% with 14.8 of 16 cores busy (the CPU); 64 per GPU: dali
    waited 4.2% with 6.8 busy (not the cores); torch and wds under 3% say nothing of cores."""
    at256 = _verdicts("check-b256-r1")
    assert "it waited with 14.8 of 16 cores busy: the host's CPU is the limit" in at256["wds"]
    assert "cores busy" not in at256["torch"] and "cores busy" not in at256["dali"]
    at64 = _verdicts("check-b64-r1")
    assert "it waited with 6.8 of 16 cores busy: not for cores" in at64["dali"]
    assert "cores busy" not in at64["torch"] + at64["wds"] + at64["synthetic"]


@pytest.mark.parametrize(
    ("wait", "busy", "said"),
    [
        (WAIT_EXPLAINED - 1e-4, 16.0, None),  # fed: nothing to explain
        (WAIT_EXPLAINED, CPU_FULL * 16, "the host's CPU is the limit"),
        (0.2, CPU_FULL * 16 - 0.1, "not for cores"),
        (0.2, None, None),  # busy cores not measured (an older file)
        (None, 8.0, None),
    ],
)
def test_the_rule_at_its_edges(wait, busy, said):
    text = cores_text(NS(data_wait_fraction=wait, busy_cores_mean=busy), 16)
    assert (text is None) if said is None else (said in text)


@pytest.mark.parametrize(
    ("steal", "said"),
    [
        (None, False),  # not read: an older file
        (0.0, False),  # bare metal
        (STEAL_SAID * 16 - 0.01, False),
        (STEAL_SAID * 16, True),
        (1.5, True),
    ],
)
def test_steal_is_said_from_a_hundredth_of_the_machine(steal, said):
    text = steal_text(NS(steal_cores_mean=steal), 16)
    assert (text is not None) == said
    if said:
        assert f"the hypervisor took {steal:.2f} of 16 cores' time (steal)" in text


def test_a_recorded_run_with_steal_says_so_in_every_verdict():
    """Run 13's 64 per GPU, with its windows given 0.5 cores of steal (the field is newer than
    the run): every loader's verdict, the ceiling's too, says it; unread, none does."""
    result = verify_results.load(RUN13 / "check-b64-r1.json.gz")
    compare(result)
    assert not any("steal" in v.text for v in result.verdicts)
    result = verify_results.load(RUN13 / "check-b64-r1.json.gz")
    for run in result.runs:
        run.steal_cores_mean = 0.5
    compare(result)
    assert all("the hypervisor took 0.50 of 16 cores' time" in v.text for v in result.verdicts)
