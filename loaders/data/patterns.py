"""Brace lists and globs, as WebDataset users write them, for paths and URLs alike:
``shards/shard-{00000..00015}.tar``, ``s3://bucket/train/*.tar``,
``https://host/ds/shard-{000..099}.tar`` (the only way to name shards on a server that does not
list its folders)."""

from __future__ import annotations

import glob as _glob
from urllib.parse import urlsplit

from loaders.data import remote


def _magic(item: str) -> bool:
    """Glob characters in a path, or in a URL's path (a URL's ``?`` starts its query)."""
    return _glob.has_magic(urlsplit(item).path if remote.is_url(item) else item)


def has_pattern(text: str) -> bool:
    return "{" in text or _magic(text)


def expand(pattern: str) -> list[str]:
    """Every path or URL ``pattern`` names, in order: brace items in their order, each glob's
    matches sorted. A brace item without glob characters is kept whether or not it exists (its
    reader says so), as WebDataset does."""
    import braceexpand  # ships with webdataset

    out: list[str] = []
    for item in braceexpand.braceexpand(pattern):
        if not _magic(item):
            out.append(item)
        elif remote.is_url(item):
            out.extend(remote.glob(item))
        else:
            out.extend(sorted(_glob.glob(item)))
    return out
