#!/usr/bin/env python3
"""Open and close spawned-worker loaders many times; count workers that abort at their exit.

A spawned DataLoader worker ends with a full interpreter shutdown, and torch's worker loop leaves
its result queue's feeder thread running: caught mid-pickle by that shutdown, the worker aborts
("terminate called without an active exception") and ``loader.close()`` raises
(``loaders.torch_backend._let_the_feeder_finish``). Timing-dependent: run two at once on a small
machine. Usage: ``python scripts/stress_spawn_close.py [--rounds 30] [--nice 10]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loaders import build_loader  # noqa: E402
from tests.loaders.test_loaders import make_tiny  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--nice", type=int, default=10, help="worker_nice")
    p.add_argument("--backend", default="wds", choices=("wds", "torch"))
    args = p.parse_args()
    data = make_tiny(Path(tempfile.mkdtemp()), n=64, per_shard=16)
    source = data["shards" if args.backend == "wds" else "tree"]
    aborted = 0
    for _ in range(args.rounds):
        loader = build_loader(source, args.backend, 16, image_size=16, workers=2, device="cpu",
                              multiprocessing_context="spawn", worker_nice=args.nice)  # fmt: skip
        batches = iter(loader)
        next(batches), next(batches)
        try:
            loader.close()
        except RuntimeError as e:  # torch: "DataLoader worker (pid N) is killed by signal: ..."
            aborted += 1
            print(e, flush=True)
    print(f"{aborted} of {args.rounds} loaders had a worker abort at close")
    return 1 if aborted else 0


if __name__ == "__main__":
    raise SystemExit(main())
