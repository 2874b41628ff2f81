"""Diagnostic (``FEEDBENCH_SCHEDSTAT=DIR``): how the training process's threads were scheduled in
the measured window: per thread, CPU time and time spent runnable but waiting for a core (the
kernel's ``/proc/self/task/TID/schedstat``), and involuntary context switches. A loader that
slows the step by taking the launch thread's core shows here as run-queue wait."""

from __future__ import annotations

import json
import os


def snapshot() -> dict[int, tuple[str, int, int, int]]:
    """``{tid: (name, run_ns, wait_ns, involuntary switches)}`` for this process's threads."""
    out: dict[int, tuple[str, int, int, int]] = {}
    for tid in os.listdir("/proc/self/task"):
        base = f"/proc/self/task/{tid}"
        try:
            with open(f"{base}/comm") as f:
                name = f.read().strip()
            with open(f"{base}/schedstat") as f:
                run_ns, wait_ns, _ = (int(x) for x in f.read().split())
            nvcsw = 0
            with open(f"{base}/status") as f:
                for line in f:
                    if line.startswith("nonvoluntary_ctxt_switches"):
                        nvcsw = int(line.split()[1])
        except (OSError, ValueError):
            continue
        out[int(tid)] = (name, run_ns, wait_ns, nvcsw)
    return out


def write(path: str, before: dict, after: dict, steps: int, extra: dict) -> None:
    """Per thread of ``after``: ms per step running and waiting, switches per step."""
    rows = []
    for tid, (name, run, wait, sw) in after.items():
        b = before.get(tid, (name, 0, 0, 0))
        rows.append(
            {
                "tid": tid,
                "name": name,
                "main": tid == os.getpid(),
                "run_ms_per_step": (run - b[1]) / 1e6 / max(1, steps),
                "wait_ms_per_step": (wait - b[2]) / 1e6 / max(1, steps),
                "invol_per_step": (sw - b[3]) / max(1, steps),
            }
        )
    rows.sort(key=lambda r: -r["run_ms_per_step"])
    with open(path, "w") as f:
        json.dump({**extra, "steps": steps, "threads": rows[:12]}, f, indent=1)
