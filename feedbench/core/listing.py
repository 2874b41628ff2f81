"""Files that listing the data left out (the loaders' ``Skipped`` list): what a results file keeps
of them and the one warning that names them, the same for ``scan`` and ``verify``."""

from __future__ import annotations

from collections.abc import Sequence

from feedbench.core.envelope import DatasetInfo, SkippedFile
from loaders.data.layout import Skipped
from loaders.data.remote import redact_url

SKIPPED_NAMED = 5  # files listing left out that the results name (the rest are counted)
WARNING_NAMED = 3  # of those, named in the warning: it stays one readable line


def skipped_files(found: Sequence[Skipped]) -> tuple[int, list[SkippedFile]]:
    """How many files listing left out, and the first few with why (URLs without credentials:
    results files and consoles get shared)."""
    named = found[:SKIPPED_NAMED]
    return len(found), [SkippedFile(redact_url(s.path), s.reason) for s in named]


def skipped_warning(dataset: DatasetInfo, named: int = WARNING_NAMED) -> list[str]:
    """One warning on the files listing left out, naming the first ``named``; none if none."""
    n = dataset.skipped_files
    if not n:
        return []
    which = "; ".join(f"{s.path}: {s.reason}" for s in dataset.skipped[:named])
    more = f"; and {n - named} more" if n > named else ""
    files = "1 file" if n == 1 else f"{n} files"
    return [f"{files} left out when listing: {which}{more}"]
