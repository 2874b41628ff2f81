"""When a projection may be made, and what it must carry with it.

A fit to a few points says little past them: a projection is refused with fewer than
:data:`MIN_COUNTS` consumer counts, or at a target beyond :data:`MAX_REACH` × the largest count
measured; a scan not valid for sizing, or points that could not be judged, are flagged in every
output that shows the projection (a fit to wrong points is worse than no fit).
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIN_COUNTS = 4  # distinct consumer counts a fit needs: three parameters and one to spare
MAX_REACH = 4  # a projection goes at most this many times past the largest measured count


@dataclass
class Rules:
    """What the rules make of one pass: refusals (no projection) and flags (a projection that
    says what weakens it)."""

    refused: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)


def check(
    counts: list[int],
    target: int | None,
    sizing_broken: list[str] | None,
    unjudged: list[tuple[int, str]],
) -> Rules:
    """The rules on one pass: ``counts`` the judged consumer counts fitted, ``target`` the count
    asked for (None: none), ``sizing_broken`` the sizing rules the scan breaks (None: the file
    has no sizing judgement), ``unjudged`` (count, why) left out of the fit."""
    r = Rules()
    if len(counts) < MIN_COUNTS:
        have = ", ".join(map(str, sorted(counts))) or "none"
        r.refused.append(
            f"{len(counts)} judged consumer count{'s' if len(counts) != 1 else ''} ({have}); "
            f"a fit needs ≥ {MIN_COUNTS} (scan e.g. --consumers 1,2,4,8)"
        )
    reach = MAX_REACH * max(counts) if counts else 0
    if target is not None and counts and target > reach:
        r.refused.append(
            f"target {target} is beyond {MAX_REACH}× the largest count measured ({max(counts)}): "
            f"project to ≤ {reach}, or measure further"
        )
    if sizing_broken is None:
        r.flags.append("the scan carries no sizing judgement (an older file): not checked")
    elif sizing_broken:
        r.flags.append("not valid for sizing: " + "; ".join(sizing_broken))
    for n, why in unjudged:
        r.flags.append(
            f"{n} consumer{'s' if n != 1 else ''} not judged ({why}): left out of the fit"
        )
    return r


def reach(counts: list[int]) -> int:
    """The largest count a projection may go to."""
    return MAX_REACH * max(counts)
