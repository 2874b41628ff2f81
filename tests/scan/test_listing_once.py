"""A scan lists its data once: the consumers load the parent's listing (and, under --loader,
its sample index) instead of listing again."""

from __future__ import annotations

import os
import shutil

import pytest

from feedbench.scan.config import ScanConfig
from feedbench.scan.run import scan

pytestmark = pytest.mark.slow  # two counts of consumer processes


def _grow(tree):
    """6 more images in the tree: what a consumer listing for itself would also read."""

    def on_count(*_):
        for k, name in enumerate(sorted(os.listdir(tree / "class_000"))[:6]):
            shutil.copy(tree / "class_000" / name, tree / "class_000" / f"late_{k}.jpg")

    return on_count


@pytest.mark.parametrize("loader", [None, "torch"])
def test_consumers_read_the_parents_listing_not_their_own(dataset_copy, loader):
    tree = dataset_copy / "images"
    cfg = ScanConfig(str(tree), consumers=(2,), batch_size=4, workers=0, loader=loader,
                     step_s=0.001 if loader else None)  # fmt: skip
    r = scan(cfg, on_count=_grow(tree))  # called after the parent listed, before consumers start
    (m,) = r.measurements
    assert r.dataset.samples == 24 and m.errors == 0
    assert m.samples == 24  # a consumer listing again would have read the 6 late images too
