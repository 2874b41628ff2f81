"""What scripts written for torch's DataLoader read from it, on every backend (docs/dropin.md):
``sampler`` (``set_epoch``, ``len()``), ``dataset`` (``len()``, ``classes``, ``class_to_idx``),
``batch_size``, ``num_workers``, ``drop_last``; a peek uses up no epoch; a kept
``train_sampler.set_epoch(k)`` on a fresh loader gives epoch k's order (``--start-epoch k``).

Two ranks in-process (rank and world given), as tests/loaders/test_loaders_eval_resume.py does;
the PyTorch ImageNet example under torchrun with gloo is in tests/examples/.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Subset

from loaders import build_loader
from loaders.dist import shard_indices
from tests.loaders.test_loaders import CLASSES, COMBOS, make_tiny

N = 50  # divides by neither the batch nor 3; 9 shards (8 of 6 samples, one of 2)
BATCH = 8
WORLD = 2
IDS = [f"{b}-{k}" for b, k in COMBOS]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("dropin"), n=N, per_shard=6)


def _loaders(tiny, backend, kind, world=WORLD, **kw) -> list:
    """One loader per rank, rank 0 first (it lists; the others load its index)."""
    if backend == "dali":
        pytest.importorskip("nvidia.dali", reason="needs NVIDIA DALI (the dali extra)")
    kw = dict(image_size=8, device="cpu", return_keys=True, seed=3, **kw)
    kw.setdefault("workers", 1 if backend == "dali" else 0)  # dali: CPU threads
    return [
        build_loader(tiny[kind], backend, BATCH, rank=r, world_size=world, **kw)
        for r in range(world)
    ]


def _keys(loader) -> list[int]:
    return [k for _, _, keys in loader for k in keys.tolist()]


def _close(loaders) -> None:
    for ld in loaders:
        ld.close()


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize(("backend", "kind"), COMBOS, ids=IDS)
def test_dataloader_attributes(tiny, backend, kind, train):
    loaders = _loaders(tiny, backend, kind, train=train, drop_last=train)
    for ld in loaders:
        assert (ld.batch_size, ld.drop_last) == (BATCH, train)
        assert ld.num_workers == ld.workers == 1 if backend == "dali" else ld.num_workers == 0
        assert len(ld.dataset) == N  # the whole source, not the rank's share
        names = [f"class_{c}" for c in range(CLASSES)] if kind == "tree" else list("01234")
        assert ld.dataset.classes == names
        assert ld.dataset.class_to_idx == {name: c for c, name in enumerate(names)}
        assert hasattr(ld.sampler, "set_epoch")  # timm's test for a distributed sampler
    lengths = [len(ld.sampler) for ld in loaders]
    if train:  # DistributedSampler's: every rank's share, padding included, the same everywhere
        assert lengths == [ld.samples_per_rank for ld in loaders]
        assert len(set(lengths)) == 1 and lengths[0] * WORLD >= N
        assert [len(ld) for ld in loaders] == [lengths[0] // BATCH] * WORLD  # drop_last
    else:  # the most a rank holds, on every rank: nothing is left beyond len × world
        biggest = max(ld.samples_per_rank for ld in loaders)
        assert lengths == [biggest] * WORLD
        assert biggest * WORLD >= N
    _close(loaders)


@pytest.mark.parametrize(("backend", "kind"), COMBOS, ids=IDS)
def test_imagenet_examples_remainder_is_empty(tiny, backend, kind):
    """PyTorch's ImageNet example evaluates ``Subset(val_loader.dataset, range(len(val_loader.
    sampler) * world_size, len(val_loader.dataset)))`` itself after its distributed loop: with
    the exact evaluation that range must be empty, or those samples count twice. Three ranks:
    50 samples are 17, 17 and 16 of them (wds: whole shards, 18, 18 and 14)."""
    loaders = _loaders(tiny, backend, kind, world=3, train=False)
    assert len({ld.samples_per_rank for ld in loaders}) == 2  # ranks hold different counts
    seen: list[int] = []
    for ld in loaders:
        rest = Subset(ld.dataset, range(len(ld.sampler) * 3, len(ld.dataset)))
        assert len(rest) == 0
        assert list(DataLoader(rest, batch_size=BATCH)) == []
        seen += _keys(ld)
    assert sorted(seen) == list(range(N))  # the distributed loop alone saw each sample once
    _close(loaders)


def _kept_sampler_order(tiny, backend, kind, epoch: int) -> list[list[int]]:
    """Each rank's order of ``epoch`` from a fresh loader, set as the ImageNet example does:
    ``train_sampler = loader.sampler`` kept, ``train_sampler.set_epoch(epoch)``."""
    loaders = _loaders(tiny, backend, kind)
    out = []
    for ld in loaders:
        train_sampler = ld.sampler
        train_sampler.set_epoch(epoch)
        assert train_sampler.epoch == epoch
        out.append(_keys(ld))
    _close(loaders)
    return out


@pytest.mark.parametrize(("backend", "kind"), COMBOS, ids=IDS)
def test_start_epoch_through_a_kept_sampler_gives_that_epochs_order(tiny, backend, kind):
    loaders = _loaders(tiny, backend, kind)
    fresh = [(_keys(ld), _keys(ld)) for ld in loaders]  # epochs 0 and 1 of an uninterrupted run
    _close(loaders)
    assert [e0 for e0, _ in fresh] != [e1 for _, e1 in fresh]  # the order changes per epoch
    assert _kept_sampler_order(tiny, backend, kind, 1) == [e1 for _, e1 in fresh]


def _batches(loader) -> list[tuple[torch.Tensor, list[int]]]:
    """One epoch: each batch's pixels (copied: DALI reuses its buffers) and keys."""
    return [(images.clone(), keys.tolist()) for images, _, keys in loader]


def test_dali_shards_start_epoch_gives_that_epochs_batches_pixels_too(tiny):
    """DALI over shards builds a pipeline per epoch, its shards in that epoch's order and seeded
    by (seed, epoch, rank): a fresh loader at epoch 2 gives the uninterrupted run's epoch 2,
    keys and pixels (the random crops and flips too); every epoch covers the data."""
    run = _loaders(tiny, "dali", "shards")
    epochs = [[_batches(ld) for ld in run] for _ in range(3)]
    _close(run)
    keys = [[[k for _, ks in rank for k in ks] for rank in epoch] for epoch in epochs]
    for epoch in keys:
        assert sorted(set(k for rank in epoch for k in rank)) == list(range(N))
    assert keys[0] != keys[1] != keys[2] != keys[0]
    fresh = _loaders(tiny, "dali", "shards")
    for ld, uninterrupted in zip(fresh, epochs[2], strict=True):
        ld.sampler.set_epoch(2)
        again = _batches(ld)
        assert [ks for _, ks in again] == [ks for _, ks in uninterrupted]
        for (pixels, _), (want, _) in zip(again, uninterrupted, strict=True):
            assert torch.equal(pixels, want)
    _close(fresh)


@pytest.mark.parametrize("drop_last", [False, True], ids=["pad", "drop_last"])
def test_dali_trains_a_tree_in_torchs_order(tiny, drop_last):
    """On a tree, DALI's training order is the torch backend's: each rank's batches of epoch e
    are DistributedSampler's indices for (seed, e) on the global rank, padding included (the
    last batch dropped with ``drop_last``), epoch after epoch on one pipeline."""
    for backend in ("torch", "dali"):
        loaders = _loaders(tiny, backend, "tree", world=3, drop_last=drop_last)
        got = [[_keys(ld) for _ in range(3)] for ld in loaders]
        _close(loaders)
        if backend == "torch":
            want = got
            continue
        assert got == want
    for r, epochs in enumerate(want):
        for e, keys in enumerate(epochs):
            dealt = shard_indices(N, r, 3, seed=3, epoch=e).tolist()
            assert keys == (dealt[: len(dealt) // BATCH * BATCH] if drop_last else dealt)


@pytest.mark.parametrize(("backend", "kind"), COMBOS, ids=IDS)
def test_a_peek_uses_up_no_epoch(tiny, backend, kind):
    """``next(iter(loader))`` (a shape check, say) then full passes: epoch 0's order, then
    epoch 1's, as a loader nobody peeked at gives them; the same after a ``break``. An epoch is
    used up when its last batch is handed out."""
    plain = _loaders(tiny, backend, kind)
    want = [(_keys(ld), _keys(ld)) for ld in plain]
    _close(plain)
    peeked = _loaders(tiny, backend, kind)
    for ld, (e0, e1) in zip(peeked, want, strict=True):
        images, labels, keys = next(iter(ld))
        assert keys.tolist() == e0[:BATCH] and len(labels) == BATCH
        assert ld.sampler.epoch == 0
        assert _keys(ld) == e0
        for i, _ in enumerate(ld):  # epoch 1, left after two batches
            if i == 1:
                break
        it = iter(ld)  # a loop that takes len() batches and never asks for the end
        assert [k for _ in range(len(ld)) for k in next(it)[2].tolist()] == e1
        assert ld.sampler.epoch == 2  # its last batch handed out: epoch 1 is used up
    _close(peeked)
    assert torch.is_tensor(images)
