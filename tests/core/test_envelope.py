"""What every results file says about the host that wrote it, and about itself (finished?);
how a results file's values are checked against their types on load."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

from feedbench.core.envelope import SchemaMismatch, _nvml_gpu_count, from_dict


def test_host_info_names_torch_s_build_without_importing_torch():
    """A process that has not imported torch (compare, report, a scan's parent) records the
    same torch version, build suffix included, as torch itself; it imports torch only where the
    driver reports a GPU, to name the GPUs as torch sees them."""
    code = (
        "import json, sys\nfrom feedbench.core.envelope import HostInfo\nh = HostInfo.current()\n"
        "print(json.dumps([h.torch, h.cuda_devices, 'torch' in sys.modules]))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    version, gpus, imported = json.loads(r.stdout)
    assert version == torch.__version__
    if _nvml_gpu_count() == 0:
        assert gpus == [] and not imported
    else:
        assert gpus == [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def test_a_write_made_mid_run_says_partial_and_unfinished(tmp_path):
    from feedbench.core import envelope
    from feedbench.core.envelope import DatasetInfo
    from feedbench.scan import results as scan_results
    from feedbench.scan.results import ScanResult

    r = ScanResult(kind="scan", created_utc="2026-12-03T07:00:00+00:00", command=["feedbench"],
                   config={}, dataset=DatasetInfo("/d", "tree", 1, 1, 1))  # fmt: skip
    envelope.save(envelope.unfinished(r), tmp_path / "r.json")
    back = scan_results.load(tmp_path / "r.json")
    assert back.partial and back.stopped_by == "unfinished" and back.failure.startswith("unfin")
    assert not r.partial and r.stopped_by is None and r.failure is None  # the run's own: as was
    r.partial, r.stopped_by, r.failure = True, "failed", "the storage stalled"
    assert envelope.unfinished(r) is r  # already says why it is partial


@dataclass
class _Series:
    step_s: list[float]
    counts: tuple[int, ...]
    names: list[str]
    flags: list[bool]


@pytest.mark.parametrize(("field", "values", "said"), [
    ("step_s", [0.1, 2, "x"], "step_s[2]: expected a number, got 'x'"),
    ("step_s", [0.1, True], "step_s[1]: expected a number, got True"),
    ("counts", [1, 2.5], "counts[1]: expected an integer, got 2.5"),
    ("counts", [False], "counts[0]: expected an integer, got False"),
    ("names", ["a", None], "names[1]: expected a string, got null"),
    ("flags", [True, 1], "flags[1]: expected true or false, got 1"),
])  # fmt: skip
def test_lists_of_numbers_and_strings_are_checked_element_by_element(field, values, said):
    good = {"step_s": [0.5, 1], "counts": [1, 2], "names": ["a"], "flags": [False]}
    got = from_dict(_Series, good)
    assert got == _Series([0.5, 1.0], (1, 2), ["a"], [False])
    assert type(got.step_s[1]) is float and isinstance(got.counts, tuple)
    with pytest.raises(SchemaMismatch) as e:
        from_dict(_Series, {**good, field: values})
    assert str(e.value) == said
