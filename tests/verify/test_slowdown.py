"""verify names a loader that slows the training step it feeds (issue 29), from results recorded
on one H200 (benchmarks/2026-12-03-h200-smallbatch: ResNet-50 bf16, 1 GPU, 8,192 JPEGs)."""

from __future__ import annotations

import gzip
import io
import json

import pytest
from rich.console import Console

from feedbench.report.verify_console import render_verify
from feedbench.verify import analysis as vr
from feedbench.verify.results import VerifyResult, load
from tests.conftest import ROOT

RECORDED = ROOT / "benchmarks" / "2026-12-03-h200-smallbatch"


def _recorded(name: str) -> VerifyResult:
    path = RECORDED / f"{name}.json.gz"
    return load(path, json.loads(gzip.decompress(path.read_bytes())))


def _together(ceiling: str, loader: str) -> VerifyResult:
    """The two recorded runs (the synthetic ceiling and a loader) as one verify's results."""
    result = _recorded(ceiling)
    result.runs = result.runs + _recorded(loader).runs
    return vr.compare(result)


def _work_ms(run) -> float:
    b = run.breakdown
    return (b.step_s - b.data_wait_s) * 1e3


@pytest.mark.parametrize(
    ("ceiling", "loader", "named"),
    [
        # DALI decoding on the GPU at 64 per GPU, 16 threads: fwd+bwd 47.8 ms against 28.0
        ("call1/b64-synthetic", "call1/b64-dali-r0", True),
        # the same with 2 threads: still 3.8 ms slower a step, more than its 1 ms of data wait
        ("call2/b64-synthetic", "call2/b64-dali-w2", True),
        # DALI decoding on the CPU at 64 (the new default there): as fast as the ceiling
        ("call2/b64-synthetic", "call2/b64-dali-cpu", False),
        # torch at 256: fed, no slower than the ceiling
        ("call1/b256-synthetic", "call2/b256-torch", False),
    ],
)
def test_the_slowdown_is_named_when_it_is_the_loss(ceiling, loader, named):
    result = _together(ceiling, loader)
    synth, run = result.runs
    expected = _work_ms(run) - _work_ms(synth)
    assert run.slowdown_s * 1e3 == pytest.approx(expected)
    assert sum(run.slowdown_parts_s.values()) * 1e3 == pytest.approx(expected, abs=0.05)
    assert synth.slowdown_s is None  # the ceiling is not compared with itself
    verdict = next(v for v in result.verdicts if v.loader == run.loader)
    assert verdict.slowdown_s == run.slowdown_s
    said = f"the loader slows training by {expected:.1f} ms per step"
    assert (said in verdict.text) is named
    if named:  # the parts, and that it is more than the wait
        fwd = run.slowdown_parts_s["forward_backward_s"] * 1e3
        assert f"fwd+bwd {fwd:+.1f}" in verdict.text
        assert "more than it waits for data" in verdict.text
        assert "data wait" in verdict.text  # the wait is still reported beside it


def test_the_console_shows_the_slowdown_column_and_the_verdict():
    result = _together("call1/b64-synthetic", "call1/b64-dali-r0")
    out = io.StringIO()
    render_verify(result, Console(file=out, width=250, force_terminal=False))
    text = out.getvalue()
    run = result.runs[1]
    assert "slower" in text
    assert f"{run.slowdown_s * 1e3:+.1f}" in text
    assert "the loader slows training by" in " ".join(text.split())


def test_no_ceiling_no_slowdown():
    result = vr.compare(_recorded("call1/b64-dali-r0"))
    run = result.runs[0]
    assert run.slowdown_s is None and run.slowdown_parts_s is None
    assert "slows training" not in result.verdicts[0].text
