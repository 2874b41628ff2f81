"""The loaders' DDP guarantees, for every backend, with real gloo process groups.

ONE contract test (parametrized over backend × source × world size) checks, per epoch: equal batch
counts on every rank, coverage of every sample exactly once apart from the documented padding, a
new order each epoch and the same order for the same seed, labels attached to their pixels, and the
shard following the GLOBAL rank in a simulated 2-node layout (RANK ≠ LOCAL_RANK). Each world size
is spawned once (every backend runs inside the same ranks) and the results are shared.
"""

from __future__ import annotations

import collections
import io
import os
import socket
import tarfile
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch

from feedbench.sample import class_rgb, nearest_class

CLASSES = 5
N_SAMPLES = 1001  # divides by neither 2 nor 3
PER_SHARD = 91  # 11 shards: enough for 3 ranks × 2 workers
BATCH = 64
SIZE = 16
COMBOS = [
    ("torch", "tree"),
    ("torch", "shards"),
    ("wds", "shards"),
    ("dali", "tree"),
    ("dali", "shards"),
]
WORLDS = (1, 2, 3)


# --- data ---------------------------------------------------------------------------------------
def tiny_jpeg(index: int, label: int, side: int = 24) -> bytes:
    """A small JPEG tinted with its class colour (feedbench.sample.class_rgb), with some grain."""
    from PIL import Image

    rng = np.random.default_rng(index)
    w = side + int(rng.integers(0, side // 2))
    pixels = class_rgb(label, CLASSES)[None, None, :] + rng.normal(0, 6, (side, w, 3))
    buf = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def make_tiny(root: Path, n: int = N_SAMPLES, per_shard: int = PER_SHARD) -> dict[str, Path]:
    """``n`` labelled images as an ImageFolder tree and as WebDataset shards."""
    tree, shards = root / "tree", root / "shards"
    shards.mkdir(parents=True)
    tar = None
    for i in range(n):
        label = i % CLASSES
        data = tiny_jpeg(i, label)
        folder = tree / f"class_{label}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:05d}.jpg").write_bytes(data)
        if i % per_shard == 0:
            if tar is not None:
                tar.close()
            tar = tarfile.open(shards / f"shard-{i // per_shard:03d}.tar", "w")  # noqa: SIM115
        assert tar is not None
        add_member(tar, f"{i:05d}.jpg", data)
        add_member(tar, f"{i:05d}.cls", str(label).encode())
    assert tar is not None
    tar.close()
    return {"tree": tree, "shards": shards}


def label_mismatches(images: torch.Tensor, labels: torch.Tensor) -> int:
    """Images whose mean colour is not their label's tint (0 when labels stay with pixels)."""
    from loaders import denormalize

    rgb = denormalize(images.float().cpu()).mean(dim=(2, 3)).numpy()
    return sum(nearest_class(rgb[j], CLASSES) != int(labels[j]) for j in range(len(labels)))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    return make_tiny(tmp_path_factory.mktemp("loaders"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- one rank of the contract run -----------------------------------------------------------------
def _epochs(loader, epochs: int) -> list[dict]:
    out = []
    for _ in range(epochs):
        keys: list[int] = []
        batches = bad = 0
        sizes = []
        for images, labels, k in loader:
            assert images.shape[1:] == (3, SIZE, SIZE) and images.dtype == torch.float32
            assert len(labels) == len(k) == len(images)
            batches += 1
            sizes.append(len(k))
            keys += k.tolist()
            bad += label_mismatches(images, labels)
        out.append({"batches": batches, "keys": keys, "bad": bad, "last": sizes[-1]})
    return out


def _rank_main(local: int, world: int, port: int, roots: dict, queue) -> None:
    # torchrun's environment for a 2-node layout of 2 ranks per node: rank 2 is local rank 0
    rank = local
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank % 2),
        LOCAL_WORLD_SIZE=str(min(2, world - (rank // 2) * 2)),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    import torch.distributed as tdist

    from loaders import build_loader

    torch.set_num_threads(1)  # 2 cores here, up to 3 ranks plus their workers
    tdist.init_process_group("gloo")
    try:
        results = {}
        for backend, kind in COMBOS:  # DALI last: torch/wds fork workers, DALI starts threads
            try:
                kw = dict(
                    batch_size=BATCH, image_size=SIZE, seed=11, device="cpu", return_keys=True
                )
                if backend == "dali":
                    kw.update(workers=2)
                else:  # fork, as under torchrun (a spawned rank would spawn its workers: slow);
                    # batch slots, as on a GPU (tests/loaders/test_slots.py: the same batches)
                    kw.update(workers=1, multiprocessing_context="fork", slots=True)
                loader = build_loader(roots[kind], backend, **kw)
                epochs = _epochs(loader, 2)
                res = {
                    "len": len(loader),
                    "rank": loader.info.rank,
                    "local_rank": loader.info.local_rank,
                    "shard_id": getattr(loader, "shard_id", loader.info.rank),
                    "samples_per_rank": loader.samples_per_rank,
                    "padding": loader.padding_per_epoch,
                    "epochs": epochs,
                }
                loader.close()
                again = build_loader(roots[kind], backend, **kw)
                res["again"] = _epochs(again, 1)[0]["keys"]
                again.close()
                # the guarantee DDP needs, checked the way DDP would hit it: through the group
                counts = torch.tensor([e["batches"] for e in epochs])
                tdist.all_reduce(counts, op=tdist.ReduceOp.MAX)
                res["max_batches"] = counts.tolist()
            except Exception:
                res = {"error": traceback.format_exc()}
            gathered = [None] * world
            tdist.all_gather_object(gathered, res)
            results[f"{backend}-{kind}"] = gathered
        if rank == 0:
            queue.put(results)
    finally:
        tdist.destroy_process_group()


_RUNS: dict[int, dict] = {}


def contract_run(world: int, roots: dict) -> dict:
    if world not in _RUNS:
        import torch.multiprocessing as mp

        # forked from a server that imported torch and the loaders once (a fresh interpreter
        # per rank paid that import at every world size); none of them touched CUDA
        mp.set_forkserver_preload(["torch", "loaders", __name__])
        ctx = mp.get_context("forkserver")
        q = ctx.SimpleQueue()
        args = (world, _free_port(), {k: str(v) for k, v in roots.items()}, q)
        mp.start_processes(
            _rank_main, args=args, nprocs=world, join=True, start_method="forkserver"
        )
        _RUNS[world] = q.get()
    return _RUNS[world]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize(("backend", "kind"), COMBOS, ids=[f"{b}-{k}" for b, k in COMBOS])
def test_ddp_contract(tiny, backend, kind, world):
    ranks = contract_run(world, tiny)[f"{backend}-{kind}"]
    for r in ranks:
        assert "error" not in r, r.get("error")
    # shard follows the GLOBAL rank (RANK ≠ LOCAL_RANK on the second node), the GPU the local one
    assert [r["rank"] for r in ranks] == list(range(world))
    assert [r["shard_id"] for r in ranks] == list(range(world))
    assert [r["local_rank"] for r in ranks] == [g % 2 for g in range(world)]
    per_rank = ranks[0]["samples_per_rank"]
    expected_len = -(-per_rank // BATCH)
    for e in range(2):
        epoch = [r["epochs"][e] for r in ranks]
        # equal batch counts on every rank, every epoch, and equal to len()
        assert {x["batches"] for x in epoch} == {expected_len}
        assert {r["len"] for r in ranks} == {expected_len}
        assert ranks[0]["max_batches"][e] == expected_len
        assert len({x["last"] for x in epoch}) == 1  # the last batch has one size everywhere
        # every sample exactly once, apart from the documented padding (repeats)
        keys = [k for x in epoch for k in x["keys"]]
        assert set(keys) == set(range(N_SAMPLES))
        assert len(keys) == world * per_rank == N_SAMPLES + ranks[0]["padding"]
        counts = collections.Counter(keys)
        assert sum(c - 1 for c in counts.values()) == ranks[0]["padding"]
        # labels stay attached to their pixels
        assert sum(x["bad"] for x in epoch) == 0
    if backend != "wds":  # DistributedSampler's rule: at most world - 1 repeats
        assert ranks[0]["padding"] == world * -(-N_SAMPLES // world) - N_SAMPLES
    for r in ranks:
        first, second = r["epochs"][0]["keys"], r["epochs"][1]["keys"]
        assert first != second  # a new order every epoch
        assert r["again"] == first  # the same order for the same seed
    if world > 1:
        assert ranks[0]["epochs"][0]["keys"] != ranks[1]["epochs"][0]["keys"]


def test_dali_training_on_a_tree_without_keys_keeps_labels_with_pixels(tiny):
    """Without ``return_keys`` the dealt source makes no keys and the labels come out of the
    pipeline alone (issue 29): each label still matches its image's tint, over two epochs."""
    pytest.importorskip("nvidia.dali")
    from loaders import build_loader

    kw = dict(batch_size=BATCH, image_size=SIZE, seed=11, device="cpu", workers=2)
    with build_loader(tiny["tree"], "dali", **kw) as loader:
        seen = 0
        for _ in range(2):
            for batch in loader:
                assert len(batch) == 2  # (images, labels): no keys
                images, labels = batch
                assert labels.dtype == torch.int64 and labels.shape == (len(images),)
                assert label_mismatches(images, labels) == 0
                seen += len(labels)
        assert seen == 2 * loader.samples_per_rank
