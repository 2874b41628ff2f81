"""``feedbench report --csv``: the summary table as CSV (a scan: each repeat's own row, then
each consumer count and pass's mean row; a comparison: one row per system; a verify: one per
training run), units in the headers, numbers as the results file holds them (no rounding, no
thousands separators)."""

from __future__ import annotations

import csv
import io
import math
from typing import Any

from feedbench.report.doc import Document


def _value(x: Any) -> Any:
    """A cell: empty for no value (and for NaN), numbers as they are."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return ""
    return x


def to_csv(doc: Document) -> str:
    t = doc.summary
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([header for header, _ in t.csv])
    writer.writerows([_value(x) for x in row] for row in t.records())
    return out.getvalue()
