#!/usr/bin/env python3
"""How long feedbench's commands take to answer before any measuring: wall time of commands that
only start up (help, a bad path, compare of two small results files) and of the smallest whole
scan, and whether each process imported torch. Interleaved repeats; median, min and max per command.

    python scripts/bench_startup.py [--repeat 7] [--python PY] [--cwd CHECKOUT] [--out FILE]

``--python`` / ``--cwd``: another interpreter or checkout (an older commit in a worktree, with
``PYTHONPATH`` set to it), to measure before and after a change on the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def commands(scan_json: str, tiny_json: str) -> dict[str, list[str]]:
    """What a user types that should answer at once (no data is read by any of them), and the
    smallest whole scan (the sample's 36 images read once: its time is mostly the parent's)."""
    compare = ["-m", "feedbench", "compare", scan_json, scan_json, "--no-plots"]
    tiny = ["-m", "feedbench", "scan", str(ROOT / "sample_data" / "images"), "--stages", "read",
            "-b", "4", "--workers", "1", "--no-plots", "--json", tiny_json]  # fmt: skip
    return {
        "feedbench --help": ["-m", "feedbench", "--help"],
        "feedbench scan /no/such/path": ["-m", "feedbench", "scan", "/no/such/path"],
        "feedbench compare a.json a.json --no-plots": compare,
        "python -c 'import loaders.data'": ["-c", "import loaders.data"],
        "feedbench scan SAMPLE/images --stages read --no-plots": tiny,
    }


def imports_torch(python: str, cwd: Path, env: dict[str, str], argv: list[str]) -> bool:
    """Whether the command's process imports torch (run once more with a check at exit)."""
    code = (
        "import atexit, os, sys\n"
        "atexit.register(lambda: os.write(2, b'\\nTORCH=%d\\n' % ('torch' in sys.modules)))\n"
    )
    if argv[0] == "-m":
        code += f"import runpy; sys.argv = {[argv[1], *argv[2:]]!r}\n"
        code += f"runpy.run_module({argv[1]!r}, run_name='__main__', alter_sys=True)\n"
    else:
        code += argv[1] + "\n"
    p = subprocess.run([python, "-c", code], cwd=cwd, env=env, capture_output=True, text=True)
    return "TORCH=1" in p.stderr


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--cwd", type=Path, default=ROOT, help="the checkout to run from")
    p.add_argument("--out", type=Path, help="results JSON")
    args = p.parse_args()
    env = dict(os.environ, PYTHONPATH=str(args.cwd), COLUMNS="100")
    with tempfile.TemporaryDirectory() as tmp:
        scan_json = str(Path(tmp) / "a.json")
        sample = ROOT / "sample_data"  # a tiny real scan to compare
        subprocess.run([args.python, "-m", "feedbench", "scan", str(sample), "--no-plots",
                        "--json", scan_json], cwd=args.cwd, env=env, check=True,
                       capture_output=True)  # fmt: skip
        cmds = commands(scan_json, str(Path(tmp) / "tiny.json"))
        walls: dict[str, list[float]] = {name: [] for name in cmds}
        for _ in range(args.repeat):
            for name, argv in cmds.items():
                t0 = time.perf_counter()
                subprocess.run([args.python, *argv], cwd=args.cwd, env=env, capture_output=True)
                walls[name].append(time.perf_counter() - t0)
        res = {}
        for name, argv in cmds.items():
            w = walls[name]
            torch = imports_torch(args.python, args.cwd, env, argv)
            res[name] = {"median_s": statistics.median(w), "min_s": min(w), "max_s": max(w),
                         "runs": len(w), "imports_torch": torch}  # fmt: skip
            print(f"{name:46s} {res[name]['median_s']:6.2f} s (min {min(w):.2f}, max {max(w):.2f})"
                  f"  torch imported: {res[name]['imports_torch']}")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"cwd": str(args.cwd), "results": res}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
