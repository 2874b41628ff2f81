"""A 100k-file tree of tiny files, and the same samples as 100 tar shards (issue 24): scanned
by two consumers and loaded through the torch, wds and DALI (CPU) backends without a stall and
with every sample counted.

Cheap by construction: the 100,000 files are hard links of 16 flat grey 16×16 JPEGs (one
inode each), so the tree costs directory entries, not bytes; the shards are written with the
sample writer's own tar members. A loader's rank of 10 reads a tenth of the samples: the
listing is of all 100,000, and the 10 ranks' loaders are built in one process in rank order
(local rank 0 lists, the others load its index, as torchrun's ranks of one machine do).
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from feedbench.sample import _tar_end, _tar_member

pytestmark = pytest.mark.slow

CLASSES, PER_CLASS = 100, 1000
N = CLASSES * PER_CLASS
POOL = 16  # distinct JPEGs: file i is a link of pool image i % POOL
WORLD, BATCH, SIZE = 10, 256, 16  # 10 whole shards a rank: wds pads none


def grey(k: int) -> int:
    """Pool image ``k``'s one grey level: 16 levels 13 apart, told apart after a crop."""
    return 24 + 13 * k


def _pool() -> list[bytes]:
    from PIL import Image

    out = []
    for k in range(POOL):
        buf = io.BytesIO()
        Image.new("RGB", (SIZE, SIZE), (grey(k),) * 3).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def _tree(root: Path, pool: list[bytes]) -> None:
    """``n00000/000000.jpg`` … ``n00099/099999.jpg``: file i is sample i, of label i // 1000."""
    for k, data in enumerate(pool):
        (root / "pool" / f"{k}.jpg").write_bytes(data)
    for c in range(CLASSES):
        folder = f"{root}/tree/n{c:05d}"
        os.makedirs(folder)
        for i in range(c * PER_CLASS, (c + 1) * PER_CLASS):
            os.link(f"{root}/pool/{i % POOL}.jpg", f"{folder}/{i:06d}.jpg")


def _shards(root: Path, pool: list[bytes]) -> None:
    """A shard per class, its samples in order: shard c holds samples c·1000 … c·1000 + 999."""
    for c in range(CLASSES):
        members = [
            _tar_member(f"{i:06d}.jpg", pool[i % POOL]) + _tar_member(f"{i:06d}.cls", b"%d" % c)
            for i in range(c * PER_CLASS, (c + 1) * PER_CLASS)
        ]
        body = b"".join(members)
        (root / "shards" / f"shard-{c:05d}.tar").write_bytes(body + _tar_end(len(body)))


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    root = tmp_path_factory.mktemp("big")
    for part in ("pool", "tree", "shards"):
        (root / part).mkdir()
    pool = _pool()
    _tree(root, pool)
    _shards(root, pool)
    yield {"tree": root / "tree", "shards": root / "shards", "pool": pool}
    shutil.rmtree(root)  # 100k entries and 200 MB of shards: not left for pytest's clean-up


def test_a_100k_file_tree_is_scanned_whole_by_two_consumers(big, cli, tmp_path):
    out = tmp_path / "r.json"
    r = cli("scan", str(big["tree"]), "--stages", "read", "--consumers", "2", "--workers", "1",
            "--passes", "warm", "-b", str(BATCH), "--stall-timeout", "30", "--json", str(out),
            "--no-plots")  # fmt: skip
    assert r.code == 0, r.err
    raw = json.loads(out.read_text())
    tree_bytes = sum(len(big["pool"][i % POOL]) for i in range(N))
    dataset = raw["dataset"]
    assert (dataset["format"], dataset["files"], dataset["samples"]) == ("tree", N, N)
    assert dataset["bytes"] == tree_bytes and dataset["skipped_files"] == 0
    assert raw["stopped_by"] is None and raw["failure"] is None and not raw["partial"]
    (m,) = raw["measurements"]
    assert (m["consumers"], m["pass_name"], m["failed"], m["partial"]) == (2, "warm", None, False)
    assert (m["samples"], m["files"], m["errors"], m["read_bytes"]) == (N, N, 0, tree_bytes)
    assert m["batches"] == 2 * -(-N // 2 // BATCH)  # each consumer's 50,000 in batches of 256


@pytest.fixture
def one_thread():
    """One torch thread in this process while its loader runs: 2 cores, and 2 workers."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _spy_on_listing(monkeypatch) -> list:
    import loaders.data.index as index_module

    calls: list = []
    real = index_module.locate
    monkeypatch.setattr(index_module, "locate", lambda *a, **k: calls.append(a) or real(*a, **k))
    return calls


def _epoch(loader) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(batches, keys, labels, each image's mean grey level) of one epoch."""
    from loaders import denormalize

    batches, keys, labels, levels = 0, [], [], []
    for images, lab, k in loader:
        assert images.shape[1:] == (3, SIZE, SIZE) and len(lab) == len(k) == len(images)
        batches += 1
        keys.append(k.cpu())
        labels.append(lab.cpu())
        levels.append(denormalize(images.float().cpu()).mean(dim=(1, 2, 3)))
    return batches, torch.cat(keys), torch.cat(labels), torch.cat(levels)


# DALI last: torch and wds fork their workers from this process, DALI starts threads in it
@pytest.mark.parametrize(("backend", "kind"), [("torch", "tree"), ("wds", "shards"),
                                               ("dali", "tree")])  # fmt: skip
@pytest.mark.usefixtures("one_thread")
def test_each_backend_loads_the_100k_samples_listed_once(big, monkeypatch, backend, kind):
    from loaders import build_loader

    calls = _spy_on_listing(monkeypatch)
    kw = {"workers": 2} if backend == "dali" else {"workers": 2, "multiprocessing_context": "fork"}
    ranks = [build_loader(big[kind], backend, BATCH, image_size=SIZE, device="cpu", seed=3,
                          rank=r, world_size=WORLD, return_keys=True, **kw)
             for r in range(WORLD)]  # fmt: skip
    try:
        assert len(calls) == 1  # local rank 0 listed; ranks 1-9 loaded its index
        assert all(len(loader.index) == N for loader in ranks)
        assert {len(loader) for loader in ranks} == {-(-N // WORLD // BATCH)}  # even batches
        last = ranks[-1]
        batches, keys, labels, levels = _epoch(last)
    finally:
        for loader in ranks:
            loader.close()
    assert batches == len(last) and len(keys) == N // WORLD  # 10,000: no padding, none lost
    assert len(torch.unique(keys)) == N // WORLD and 0 <= int(keys.min()) <= int(keys.max()) < N
    assert torch.equal(labels, keys // PER_CLASS)  # each sample's label is its folder's / .cls
    expected = torch.tensor([grey(k) for k in (keys % POOL).tolist()], dtype=levels.dtype)
    assert float((levels - expected).abs().max()) < 4  # each sample's pixels are its file's
    assert np.unique((keys % POOL).numpy()).tolist() == list(range(POOL))
