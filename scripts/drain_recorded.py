"""verify's drain and turn-wait rules on recorded results: every loader run of every verify
results file given (default: all under benchmarks/), with its window's data wait in the first
half and the last quarter, whether the drain rule flags it, and whether its waits came once per
round of its workers' turns (``TURNS``, with the verdict's words).

    python scripts/drain_recorded.py [FILES...]
"""

from __future__ import annotations

import glob
import sys

from feedbench.core.errors import FeedbenchError
from feedbench.verify import results as verify_results
from feedbench.verify.analysis import compare
from feedbench.verify.diagnose import DRAIN_MIN_STEPS, _wait_share, turn_waits_text
from feedbench.verify.results import SYNTHETIC


def main(paths: list[str], argv_named: bool = False) -> None:
    runs = flagged = turns = 0
    for path in paths:
        try:
            result = verify_results.load(path)
        except (FeedbenchError, ValueError, KeyError, TypeError) as e:
            if argv_named:  # a file asked for by name is said when skipped; a glob's others not
                print(f"skipped {path}: {str(e).splitlines()[0]}", file=sys.stderr)
            continue  # not a verify results file
        compare(result)
        for run in result.runs:
            ranks = [r for r in run.ranks if len(r.step_s) >= DRAIN_MIN_STEPS]
            if run.loader == SYNTHETIC or not ranks:
                continue
            s, n = ranks[0], len(ranks[0].step_s)
            runs += 1
            flagged += run.drain is not None
            turns += run.turn_waits is not None
            print(
                f"{path}: {run.loader} {run.per_gpu_batch}/GPU: first half "
                f"{_wait_share(s, 0, n // 2):.1%}, last quarter {_wait_share(s, n - n // 4, n):.1%}"
                + (" DRAIN" if run.drain else "")
                + (f" TURNS: {turn_waits_text(run.turn_waits)}" if run.turn_waits else "")
            )
    print(f"{runs} loader runs, {flagged} flagged as draining, {turns} waiting once a round")


if __name__ == "__main__":
    named = sys.argv[1:]
    main(named or sorted(glob.glob("benchmarks/**/*.json*", recursive=True)), bool(named))
