"""What counts as an image and as a label, in a folder and inside a tar shard: one rule for all.

A tar shard groups members into samples the WebDataset way: the key is the member name up to the
first dot of its base name, the rest (lower-cased) is the extension; consecutive members with
the same key form one sample. A sample's image is its first image member, its label the ``cls``
member (a decimal integer).
"""

from __future__ import annotations

import os

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
LABEL_EXTENSION = "cls"
SHARD_EXTENSION = ".tar"
# the same, without the dot, as tar member extensions are compared (str and bytes)
IMAGE_MEMBER_EXTS = tuple(e[1:] for e in IMAGE_EXTENSIONS)
IMAGE_MEMBER_EXTS_B = frozenset(e.encode() for e in IMAGE_MEMBER_EXTS)
LABEL_EXT_B = LABEL_EXTENSION.encode()


def is_image(name: str) -> bool:
    """A file name with an image extension (any case)."""
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def is_shard(name: str) -> bool:
    return name.lower().endswith(SHARD_EXTENSION)


def split_member_name(name: str) -> tuple[str, str]:
    """WebDataset's rule: ``("dir/000123", "seg.png")`` for ``dir/000123.Seg.PNG``."""
    slash = name.rfind("/") + 1
    dot = name.find(".", slash)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1 :].lower()
