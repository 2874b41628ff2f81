#!/usr/bin/env python3
"""What DALI's external source of dealt paths costs the training thread, per batch (issue 29).

The dali backend on a tree feeds each batch's file paths through ``fn.external_source``
(:class:`loaders.dali_feed.DealtFiles`); DALI runs that callback and takes its output in
``schedule_run``, on the thread that iterates the loader: the training thread. This times that
part (``Pipeline._run_input_callbacks``) for the paths given as a list of one array per sample
(as before) and as one NUL-padded batch × longest array (``DealtFiles.paths``), in CPU pipelines
that read the files (``fn.io.file.read``), and checks that both read the same bytes.

    python scripts/bench_dali_paths.py --data /tmp/fb4k/images --batch 64 --runs 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from loaders import open_index  # noqa: E402
from loaders.dali_feed import DealtFiles  # noqa: E402
from loaders.errors import LoaderError  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True, help="a tree of JPEGs")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.pipeline import Pipeline

    try:
        index = open_index(args.data)
    except LoaderError as e:
        sys.exit(f"error: {e}")
    n = len(index)
    dealt = DealtFiles(index.paths, n, 0, 1, 0, args.batch, n // args.batch, (0, 0))
    off, buf = dealt.offsets, dealt.buffer
    forms = {
        "one array per sample": lambda info: [
            buf[off[i] : off[i + 1]] for i in dealt(info)[1].reshape(-1)
        ],
        "one padded array": lambda info: dealt(info)[0],
    }
    spent = {"s": 0.0}
    run_callbacks = Pipeline._run_input_callbacks

    def timed(self, *a, **k):
        t0 = time.perf_counter()
        try:
            return run_callbacks(self, *a, **k)
        finally:
            spent["s"] += time.perf_counter() - t0

    Pipeline._run_input_callbacks = timed
    pipes, first = {}, {}
    for name, source in forms.items():

        @pipeline_def(batch_size=args.batch, num_threads=2, device_id=None)
        def pipe(source=source):
            paths = fn.external_source(
                source=source, batch=True, batch_info=True, dtype=types.UINT8
            )
            return fn.io.file.read(paths)

        pipes[name] = pipe()
        pipes[name].build()
        (out,) = pipes[name].run()
        first[name] = [np.array(out[i]).tobytes() for i in range(args.batch)]
    same = len({tuple(v) for v in first.values()}) == 1
    print(f"the same bytes read both ways: {same}")
    results: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(args.rounds):  # interleaved: the host's drift shared out
        for name, pp in pipes.items():
            spent["s"] = 0.0
            for _ in range(args.runs):
                pp.run()
            results[name].append(1e3 * spent["s"] / args.runs)
    for name, ms in results.items():
        print(f"{name:22s} {statistics.mean(ms):.3f} ms a batch of {args.batch} "
              f"(rounds: {', '.join(f'{m:.3f}' for m in ms)})")  # fmt: skip


if __name__ == "__main__":
    main()
