"""What every results file says about the host that wrote it, and about itself (finished?)."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from feedbench.core.envelope import _nvml_gpu_count


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
