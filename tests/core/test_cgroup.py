"""The memory limit of a process's control group, read as the kernel shows it: laid out in a
folder as /sys/fs/cgroup is (v1 and v2), and from a real group made for the test (root only)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from feedbench.core.cgroup import memory_limit

MB = 2**20


def _tree(tmp_path: Path, proc: str, files: dict[str, str]) -> tuple[str, str]:
    for rel, text in files.items():
        (tmp_path / "fs" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / rel).write_text(text)
    (tmp_path / "cgroup").write_text(proc)
    return str(tmp_path / "cgroup"), str(tmp_path / "fs")


def test_v2_takes_the_lowest_memory_max_from_the_group_up(tmp_path):
    proc, root = _tree(tmp_path, "0::/pod/app\n", {
        "cgroup.controllers": "memory", "pod/memory.max": f"{512 * MB}\n",
        "pod/app/memory.max": "max\n",
    })  # fmt: skip
    assert memory_limit(proc, root) == 512 * MB


def test_v2_without_a_limit_anywhere_is_none(tmp_path):
    proc, root = _tree(tmp_path, "0::/a\n", {"cgroup.controllers": "", "a/memory.max": "max\n"})
    assert memory_limit(proc, root) is None


def test_v1_reads_the_effective_hierarchical_limit(tmp_path):
    proc, root = _tree(tmp_path, "5:memory:/job\n4:cpu,cpuacct:/job\n0::/\n", {
        "memory/job/memory.stat": f"cache 1\nhierarchical_memory_limit {3 * MB}\nrss 2\n",
    })  # fmt: skip
    assert memory_limit(proc, root) == 3 * MB


def test_v1_unlimited_is_none_and_no_cgroups_at_all_is_none(tmp_path):
    proc, root = _tree(tmp_path, "5:memory:/\n", {
        "memory/memory.stat": "hierarchical_memory_limit 9223372036854771712\n",
    })  # fmt: skip
    assert memory_limit(proc, root) is None
    assert memory_limit(str(tmp_path / "absent"), root) is None


def _own_memory_group() -> Path | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    return None


def test_a_process_in_a_real_group_reports_its_limit_in_host_info():
    """A memory group of 256 MiB made under this process's own (cgroup v1, root): a process
    started in it records the limit; the sizing rules then weigh the data against it."""
    parent = _own_memory_group()
    if parent is None or not os.access(parent, os.W_OK):
        pytest.skip("needs a writable cgroup v1 memory controller (root on a v1 host)")
    group = parent / f"feedbench-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(256 * MB))
        code = (
            "from feedbench.core.envelope import HostInfo; "
            "print(HostInfo.current().memory_limit_bytes)"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True,
            preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())),
        )  # fmt: skip
        assert int(out.stdout) == 256 * MB
    finally:
        group.rmdir()
