"""The refusal rules, table-driven: which projections are refused and which flagged, and that
the command refuses in one line with exit 2."""

from __future__ import annotations

import pytest

from feedbench.project import rules

RULES = [
    # counts, target, broken sizing rules (None: not judged), unjudged, refused, flagged
    ([1, 2, 4, 8], None, [], [], [], []),
    ([1, 2, 4, 8], 32, [], [], [], []),  # 4× the largest: allowed
    ([1, 2, 4, 8], 33, [], [], ["beyond 4× the largest count measured (8)"], []),
    ([1, 2, 4], None, [], [], ["3 judged consumer counts (1, 2, 4); a fit needs ≥ 4"], []),
    ([], 8, [], [], ["0 judged consumer counts (none)"], []),
    ([1, 2, 4, 8], None, ["repeats disagree"], [], [], ["not valid for sizing: repeats disagree"]),
    ([1, 2, 4, 8], None, None, [], [], ["no sizing judgement"]),
    ([1, 2, 4, 8], None, [], [(16, "2 measured batches")],
     [], ["16 consumers not judged (2 measured batches): left out of the fit"]),
    ([1, 2, 4], 64, ["x"], [(8, "why")],
     ["3 judged consumer counts", "beyond 4× the largest"],
     ["not valid for sizing: x", "8 consumers"]),
]  # fmt: skip


@pytest.mark.parametrize(("counts", "target", "broken", "unjudged", "refused", "flagged"), RULES)
def test_rules(counts, target, broken, unjudged, refused, flagged):
    r = rules.check(counts, target, broken, unjudged)
    assert len(r.refused) == len(refused), r.refused
    for got, want in zip(r.refused, refused, strict=True):
        assert want in got
    assert len(r.flags) == len(flagged), r.flags
    for got, want in zip(r.flags, flagged, strict=True):
        assert want in got
