"""A sample index saved once and reused (``build_loader(..., index=PATH)``), and one listing per
machine when several ranks build loaders (torchrun)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch.multiprocessing as mp

from loaders import LoaderError, build_loader
from loaders.data import SampleIndex, open_index
from loaders.data.layout import locate
from loaders.data.saved import save_layout
from loaders.index_once import ANNOUNCE_S


def _samples(index: SampleIndex) -> list[tuple[str, int, bytes]]:
    return [(index.describe(i), int(index.labels[i]), index.read(i)) for i in range(len(index))]


@pytest.mark.parametrize("layout", ["images", "shards"])
def test_a_saved_index_gives_the_same_samples(dataset, tmp_path, layout):
    listed = open_index(dataset / layout)
    listed.save(tmp_path / "index.npz")
    loaded = SampleIndex.load(tmp_path / "index.npz")
    assert isinstance(loaded.labels, np.memmap)  # mapped from the file, not read into memory
    assert loaded.kind == listed.kind and loaded.classes == listed.classes
    assert loaded.shards == listed.shards and loaded.skipped == listed.skipped
    assert _samples(loaded) == _samples(listed) and len(loaded) == 24


def test_build_loader_writes_the_index_then_uses_it_instead_of_listing(dataset_copy, tmp_path):
    tree, saved = dataset_copy / "images", tmp_path / "tree.npz"
    first = build_loader(tree, "torch", 4, workers=0, index=saved, train=False)
    assert saved.is_file() and len(first.index) == 24
    # the tree changes: a listing would see 2 more images, the saved index does not
    for k, name in enumerate(sorted(os.listdir(tree / "class_000"))[:2]):
        shutil.copy(tree / "class_000" / name, tree / "class_000" / f"added_{k}.jpg")
    again = build_loader(tree, "torch", 4, workers=0, index=saved, train=False)
    assert _samples(again.index) == _samples(first.index)
    assert len(open_index(tree)) == 26
    third = build_loader(tree, "torch", 4, workers=0, index=saved, train=False, return_keys=True)
    keys = [int(k) for _, _, ks in third for k in ks]
    assert sorted(keys) == list(range(24))


def test_an_index_file_that_is_not_this_sources_is_one_clear_error(dataset, tmp_path):
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(LoaderError, match=r"garbage.npz is not a feedbench index file \("):
        build_loader(dataset / "images", "torch", 4, workers=0, index=garbage)
    plain = tmp_path / "plain.npz"
    np.savez(plain, labels=np.arange(3))
    with pytest.raises(LoaderError, match="plain.npz is not a feedbench index file"):
        build_loader(dataset / "images", "torch", 4, workers=0, index=plain)
    other = tmp_path / "shards.npz"
    open_index(dataset / "shards").save(other)
    with pytest.raises(LoaderError, match=r"shards.npz is the index of .*shards \(auto\), not of"):
        build_loader(dataset / "images", "torch", 4, workers=0, index=other)
    cut = tmp_path / "cut.npz"
    cut.write_bytes(other.read_bytes()[:-100])
    with pytest.raises(LoaderError, match="cut.npz is not a feedbench index file"):
        SampleIndex.load(cut)
    scans = tmp_path / "layout.npz"
    save_layout(locate(dataset / "images"), scans, "x")
    with pytest.raises(LoaderError, match="not a loader's index"):
        SampleIndex.load(scans)


def _rank(rank: int, world: int, tree: str, out: str) -> None:
    """One torchrun-like rank: environment as torchrun sets it, a gloo group, a loader."""
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world))  # fmt: skip
    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank,
                            world_size=world)  # fmt: skip
    try:
        import loaders.data.index as index_module

        calls = []
        real = index_module.locate
        index_module.locate = lambda *a, **k: calls.append(a) or real(*a, **k)
        # twice, as a script that builds its loader again to resume: each call has its own
        # file, which the last rank to map it removes, so no call finds another's half-gone
        for _ in range(2):
            loader = build_loader(tree, "torch", 4, workers=0, train=False, return_keys=True)
        if rank == 0:
            from loaders.data.index import listed_as
            from loaders.index_once import job_index_path

            (Path(out) / "job").write_text(job_index_path(listed_as(tree, "auto"), "2:0"))
        keys = [int(k) for _, _, ks in loader for k in ks]
        with open(f"{out}/rank{rank}", "w") as f:
            f.write(f"{len(calls)} {' '.join(map(str, keys))}")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ranks_of_one_machine_list_once(dataset_copy, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    mp.start_processes(_rank, args=(2, str(dataset_copy / "images"), str(out)), nprocs=2,
                       start_method="forkserver")  # fmt: skip
    listings, keys = [], []
    for r in range(2):
        calls, *ks = (out / f"rank{r}").read_text().split()
        listings.append(int(calls))
        keys += [int(k) for k in ks]
    assert listings == [2, 0]  # local rank 0 listed for each call, rank 1 loaded its index
    assert sorted(keys) == list(range(24))  # DDP's split unchanged: every sample once


_LONE_RANK = """
import sys, time
from loaders import build_loader
start = time.monotonic()
loader = build_loader(sys.argv[1], "torch", 4, workers=0, rank=1, world_size=2, train=False,
                      return_keys=True)
took = time.monotonic() - start
print(took, *[int(k) for _, _, ks in loader for k in ks])
"""


def test_a_rank_alone_lists_at_once(dataset):
    """Rank 1 of 2 built by its arguments in a process no other shares a parent with: no
    process could be its machine's local rank 0, so it lists for itself at once rather than
    wait a minute for an announcement (the shell keeps it from being pytest's child, which
    may have other children)."""
    script = f'"{sys.executable}" -c "$0" "$1"; exit $?'
    done = subprocess.run(["sh", "-c", script, _LONE_RANK, str(dataset / "images")],
                          capture_output=True, text=True, timeout=2 * ANNOUNCE_S)  # fmt: skip
    assert done.returncode == 0, done.stderr
    took, *keys = done.stdout.split()
    assert float(took) < ANNOUNCE_S / 4  # waiting for an announcement takes ANNOUNCE_S
    assert [int(k) for k in keys] == list(range(12, 24))  # rank 1's half, as DDP's split
