"""The verify job's watch tells a rank from a helper torchrun starts (feedbench.verify.job)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from feedbench.verify.job import WORKER_MODULE, _is_rank


@pytest.mark.parametrize(("local_rank", "nested", "rank"), [
    (None, False, False),  # torchrun's command line but not its per-rank environment: a helper
    ("0", False, True),  # the environment torchrun gives a rank
    (None, True, True),  # verify inside a torchrun job: the command line is all there is
])  # fmt: skip
def test_a_process_with_torchruns_command_line_is_a_rank_only_with_a_ranks_environment(
    local_rank, nested, rank
):
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_RANK"}
    if local_rank is not None:
        env["LOCAL_RANK"] = local_rank
    # what a helper forked by torchrun looks like before its exec: the worker module named in
    # its arguments (here as an argument the sleeping interpreter ignores)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "-m",
                             WORKER_MODULE], env=env)  # fmt: skip
    try:
        seen = psutil.Process(proc.pid)
        deadline = time.monotonic() + 10
        while WORKER_MODULE not in seen.cmdline():  # until its exec: before, it is pytest
            assert time.monotonic() < deadline, seen.cmdline()
            time.sleep(0.01)
        assert _is_rank(seen, nested) is rank
    finally:
        proc.kill()
        proc.wait()
