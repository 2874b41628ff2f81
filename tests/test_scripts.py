"""The analysis scripts in scripts/ that the benchmarks' figures come from."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def test_trace_streams_sums_kernel_time_per_stream_and_overlap(tmp_path):
    """Two streams: 7 runs [0, 10] and [20, 30] ms, 13 runs [5, 25] ms; a copy on 7."""

    def kernel(stream, start_ms, end_ms, name):
        return {
            "ph": "X", "cat": "kernel", "name": name, "ts": start_ms * 1e3,
            "dur": (end_ms - start_ms) * 1e3, "args": {"stream": stream},
        }  # fmt: skip

    events = [
        kernel(7, 0, 10, "conv_fwd"),
        kernel(7, 20, 30, "conv_bwd"),
        kernel(13, 5, 25, "dali::resize"),
        {
            "ph": "X",
            "cat": "gpu_memcpy",
            "name": "HtoD",
            "ts": 1e3,
            "dur": 2e3,
            "args": {"stream": 7},
        },
        {"ph": "M", "name": "process_name", "args": {"name": "python"}},
    ]
    path = tmp_path / "trace-rank0.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    r = subprocess.run(
        [sys.executable, str(SCRIPTS / "trace_streams.py"), str(path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    out = " ".join(r.stdout.split())
    assert re.search(r"window 30\.0 ms, some kernel running 30\.0 ms \(100\.0%\)", out), out
    assert "stream 7: 2 kernels, 20.0 ms of kernels, 20.0 ms busy, 10.0 ms of it beside" in out
    assert "stream 13: 1 kernels, 20.0 ms of kernels, 20.0 ms busy, 10.0 ms of it beside" in out
    assert "20.00 ms dali::resize" in out and "10.00 ms conv_fwd" in out
    assert "stream 7: 1 copies/sets, 2.0 ms" in out


def test_trace_streams_gaps_of_the_busiest_stream(tmp_path):
    """Stream 7: kernels [0, 10], [10.01, 20], a copy [25, 26], a kernel [26.02, 40] ms: idle
    10 µs + 20 µs (short) and 5 ms (long, between 'b' and the copy)."""
    events = [
        {"ph": "X", "cat": cat, "name": name, "ts": a * 1e3, "dur": (b - a) * 1e3,
         "args": {"stream": 7}}
        for cat, name, a, b in [("kernel", "a", 0, 10), ("kernel", "b", 10.01, 20),
                                ("gpu_memcpy", "HtoD", 25, 26), ("kernel", "c", 26.02, 40)]
    ]  # fmt: skip
    events.append({"ph": "X", "cat": "kernel", "name": "d", "ts": 0, "dur": 1e3,
                   "args": {"stream": 9}})  # fmt: skip
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    r = subprocess.run(
        [sys.executable, str(SCRIPTS / "trace_streams.py"), str(path), "--gaps", "1"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    out = " ".join(r.stdout.split())
    want = "idle between its operations: 5.03 ms; in 2 gaps < 30 µs: 0.03 ms, in 1 longer: 5.00 ms"
    assert want in out, out
    assert "at 20.00 ms: 5.00 ms idle after 'b' before 'HtoD'" in out, out
    assert out.count("idle between") == 1  # only the busiest stream


def test_trace_streams_bad_input_is_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    for path, why in ((tmp_path / "missing.json.gz", "No such file"), (bad, "not a Chrome trace")):
        r = subprocess.run(
            [sys.executable, str(SCRIPTS / "trace_streams.py"), str(path)],
            capture_output=True, text=True,
        )  # fmt: skip
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith(f"error: {path}: {why}"), r.stderr
