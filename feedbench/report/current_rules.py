"""A scan results file judged by today's sizing rules, whichever feedbench wrote it.

A results file keeps the sizing its scan computed; the rules have changed since some files
were written (accelerators fed bounded by the rate, the measured-window rule), and a comparison
that shows two files judged by different rules side by side misleads a purchase. So compare
and report recompute the sizing from the file's measurements with the very function a scan
ends with (:func:`feedbench.scan.sizing.assess`), and say in one warning what that changed.
"""

from __future__ import annotations

import math
import os
import typing
from typing import Any

from feedbench.core import envelope
from feedbench.core.errors import FeedbenchError
from feedbench.report.fmt import fed_text
from feedbench.scan import results as scan_results
from feedbench.scan.config import ScanConfig
from feedbench.scan.results import NOT_VALID, ScanResult, Sizing
from feedbench.scan.sizing import assess
from feedbench.scan.verdict import judge
from feedbench.version import __version__


def load_scan(
    path: str | os.PathLike[str], data: dict[str, Any] | None = None
) -> tuple[ScanResult, str | None]:
    """A scan results file with its sizing recomputed by today's rules, and where that differs
    from the stored sizing one warning (also first in its warnings) naming the file, the
    version that wrote it and what changed."""
    if data is None:
        data = envelope.read(path)
    result = scan_results.load(path, data)
    try:  # the rules below read the config and host: checked like the file's own fields
        envelope.check_fields({"host": envelope.HostInfo}, data, "", ("host",))
        hints = typing.get_type_hints(ScanConfig)
        envelope.check_fields(hints, result.config, "config", ("stages", "batch_size"))
    except envelope.SchemaMismatch as e:
        raise FeedbenchError(f"{path}: {e}") from None
    # a file without tool_version loads as this version's: the raw JSON says who wrote it
    return result, rejudge(result, str(path), data.get("tool_version"))


def target_au(result: ScanResult) -> float:
    """The AU target the scan sized at: its config's, else its stored sizing's, else the
    default a scan uses."""
    stored = result.sizing.target_au if result.sizing else None
    return float(result.config.get("target_au") or stored or ScanConfig.target_au)


def rejudge(result: ScanResult, path: str, written_by: str | None) -> str | None:
    """Replace ``result``'s sizing (and its verdict's words) by today's; the warning (also
    added to its warnings) when that changed what it says, else None."""
    old = result.sizing
    new = assess(result, target_au(result))
    result.sizing = new
    if result.verdict is not None:  # today's words for the same judgement (a pure function)
        result.verdict = judge(result, target_au(result)) or result.verdict
    changes = sizing_changes(old, new)
    if not changes:
        return None
    version = f"feedbench {written_by}" if written_by else "a feedbench of unknown version"
    warning = (
        f"{path} was written by {version}; its sizing by today's rules (feedbench "
        f"{__version__}): " + "; ".join(changes)
    )
    result.warnings.insert(0, warning)
    return warning


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def sizing_changes(old: Sizing | None, new: Sizing) -> list[str]:
    """What today's sizing says that the stored one did not, in words ("fed 1.9 → 0.50",
    "now not valid: …"); [] when they agree."""
    if old is None:
        return [f"it stored no sizing; now {_fed_words(new)}, {new.label()}"]
    out = []
    if not _same(old.accelerators_fed, new.accelerators_fed):
        out.append(f"fed {fed_text(old.accelerators_fed)} → {fed_text(new.accelerators_fed)}")
    if old.at_consumers != new.at_consumers and new.accelerators_fed is not None:
        out.append(f"best at {old.at_consumers} → {new.at_consumers} consumers")
    added = [b for b in new.broken if b not in old.broken]
    if old.valid and not new.valid:
        out.append(f"now {NOT_VALID}: " + "; ".join(new.broken))
    elif new.valid and not old.valid:
        out.append("now valid for sizing (it said: " + "; ".join(old.broken) + ")")
    elif added:
        out.append(f"{NOT_VALID} now also because: " + "; ".join(added))
    return out


def _fed_words(z: Sizing) -> str:
    if z.accelerators_fed is None:
        return "no accelerators fed (no step)"
    return f"fed {fed_text(z.accelerators_fed)}"
