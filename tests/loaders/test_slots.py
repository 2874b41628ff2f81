"""Batch slots (loaders.slots): workers decode into one shared buffer, the training process takes
views of it and hands each slot back once its batch is copied. On the CPU the torch backend copies
each batch out of its slot (``slots=True``), so the whole path runs here; the GPU's page-locked
copies are tests/loaders/test_loaders_gpu.py's."""

from __future__ import annotations

import pytest
import torch

import loaders.slots as slots_mod
from loaders import build_loader
from loaders.slots import BatchSlots, SlotBatch
from tests.loaders.test_loaders import label_mismatches, make_tiny


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("slots"), n=150, per_shard=30)


def _epochs(loader, epochs: int) -> list[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        out.append([(x.clone(), y.clone(), k.clone()) for x, y, k in loader])
    return out


@pytest.mark.parametrize(
    ("backend", "kind", "train"),
    [("torch", "tree", True), ("torch", "shards", True), ("wds", "shards", True),
     ("wds", "shards", False)],
)  # fmt: skip
@pytest.mark.parametrize("like_a_gpu", [False, True], ids=["cpu", "gpu-like"])
def test_slots_give_the_batches_of_the_plain_path(tiny, backend, kind, train, like_a_gpu, request):
    """Two workers, one batch prefetched each (3 slots per worker, taken round and round over
    two epochs): every batch equal, pixel for pixel, to the same loader's without slots, and its
    labels those of its pixels. wds: each worker's last chunk of an epoch is short and waits to
    be joined with the other's (copied out of its slot). ``gpu-like``: whole batches stay in
    their slots until copied, as on a GPU (the plain path then also runs that way)."""
    if like_a_gpu:
        request.getfixturevalue("gpu_like")
    common = dict(workers=2, device="cpu", image_size=16, return_keys=True,
                  prefetch=1, seed=3, train=train)  # fmt: skip
    runs = {}
    for use in (True, False):
        loader = build_loader(tiny[kind], backend, 16, slots=use, **common)
        try:
            assert (loader.slots is not None) == use
            runs[use] = _epochs(loader, 2)
        finally:
            loader.close()
    with_slots, plain = runs[True], runs[False]
    assert [len(e) for e in with_slots] == [len(e) for e in plain] == [10, 10]
    assert {len(x) for x, _, _ in sum(with_slots, [])} == {16, 150 % 16}
    for a, b in zip(sum(with_slots, []), sum(plain, []), strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
        assert label_mismatches(a[0], a[1]) == 0
    keys = torch.cat([k for _, _, k in with_slots[0]])
    assert sorted(keys.tolist()) == list(range(150))


def test_a_skipped_file_shortens_the_batch_in_its_slot(tmp_path):
    data = make_tiny(tmp_path / "d", n=40, per_shard=10)
    bad = sorted((data["tree"] / "class_1").iterdir())[0]
    bad.write_bytes(b"not a jpeg")
    loader = build_loader(data["tree"], "torch", 8, workers=2, device="cpu", image_size=16,
                          slots=True, return_keys=True, prefetch=1)  # fmt: skip
    try:
        batches = [(x.clone(), y.clone(), k.clone()) for x, y, k in loader]
        skipped = list(loader.skipped)
    finally:
        loader.close()
    assert sorted(len(x) for x, _, _ in batches) == [7, 8, 8, 8, 8]
    assert all(len(x) == len(y) == len(k) for x, y, k in batches)
    assert sum(label_mismatches(x, y) for x, y, _ in batches) == 0
    assert len(skipped) == 1 and bad.name in str(skipped[0])


def test_spawned_workers_map_the_same_slots(tiny):
    """A spawned worker gets the buffer by pickling (its file descriptor), not a copy."""
    common = dict(workers=1, device="cpu", image_size=16, return_keys=True, prefetch=1)  # fmt: skip
    out = {}
    for ctx in ("spawn", None):
        loader = build_loader(tiny["tree"], "torch", 32, slots=True, multiprocessing_context=ctx,
                              **common)  # fmt: skip
        try:
            out[ctx] = [(x.clone(), k.clone()) for x, _, k in loader]
        finally:
            loader.close()
    assert len(out["spawn"]) == len(out[None]) == 5
    for (a, ka), (b, kb) in zip(out["spawn"], out[None], strict=True):
        assert torch.equal(a, b) and torch.equal(ka, kb)


def test_a_worker_waits_for_its_slot_and_fails_when_it_never_comes_back(monkeypatch):
    slots = BatchSlots(workers=1, per_worker=2, batch_size=4, image_size=8)
    first, images, labels = slots.claim()
    assert (first, images.shape, labels.shape) == (0, (4, 8, 8, 3), (4,))
    images.fill_(7)
    labels[:] = torch.arange(4)
    got, got_labels = slots.take(SlotBatch(first, 3, None, []))
    assert got.shape == (3, 8, 8, 3) and int(got.sum()) == 7 * 3 * 8 * 8 * 3
    assert got_labels.tolist() == [0, 1, 2]
    slots.copied(None)  # a copy with nothing to wait for (the CPU)
    assert slots.claim()[0] == 1  # the other slot, free
    monkeypatch.setattr(slots_mod, "WAIT_S", 0.2)
    with pytest.raises(RuntimeError, match="slot 0 not handed back"):
        slots.claim()  # slot 0 again: still the training process's
    slots.hand_back()
    assert slots.claim()[0] == 1 and slots.claim()[0] == 0


def test_wds_resumes_midway_with_slots(tiny):
    """A wds loader stopped after 4 batches and resumed from its state gives the batches the
    uninterrupted one gave (the resumed epoch's first chunks are read undecoded, in no slot)."""
    common = dict(workers=2, device="cpu", image_size=16, return_keys=True, prefetch=1,
                  slots=True)  # fmt: skip
    whole = build_loader(tiny["shards"], "wds", 16, **common)
    part = build_loader(tiny["shards"], "wds", 16, **common)
    again = build_loader(tiny["shards"], "wds", 16, **common)
    try:
        expect = [(x.clone(), k.clone()) for x, _, k in whole]
        it = iter(part)
        for _ in range(4):
            next(it)
        again.load_state_dict(part.state_dict())
        got = [(x.clone(), k.clone()) for x, _, k in again]
    finally:
        for loader in (whole, part, again):
            loader.close()
    assert len(got) == len(expect) - 4
    for (a, ka), (b, kb) in zip(got, expect[4:], strict=True):
        assert torch.equal(a, b) and torch.equal(ka, kb)


def test_too_little_shared_memory_falls_back_to_the_pin_thread_path(tiny, monkeypatch):
    """A full /dev/shm is a bus error when a page is first touched, not an exception: slots that
    would take more than half of what is free are not made (and the loader says so)."""
    import loaders.torch_backend as tb

    need = slots_mod.nbytes(2, 3, 16, 16)
    made = BatchSlots(2, 3, 16, 16)
    assert made.buffer.untyped_storage().nbytes() == need
    monkeypatch.setattr(tb, "shm_free", lambda: 2 * need - 1)
    with pytest.warns(UserWarning, match="batch slots need .* of shared memory"):
        loader = build_loader(tiny["tree"], "torch", 16, workers=2, prefetch=1, device="cpu",
                              image_size=16, slots=True)  # fmt: skip
    try:
        assert loader.slots is None and len(list(loader)) == 10
    finally:
        loader.close()
    monkeypatch.setattr(tb, "shm_free", lambda: 2 * need)
    loader = build_loader(tiny["tree"], "torch", 16, workers=2, prefetch=1, device="cpu",
                          image_size=16, slots=True)  # fmt: skip
    assert loader.slots is not None
    loader.close()


@pytest.fixture
def gpu_like(monkeypatch):
    """A GPU's slot semantics on the CPU: whole batches stay views of their slots until
    "copied" (normalised), then reported copied; the slots go back at the next hand-back."""
    import loaders.torch_backend as tb
    import loaders.wds_backend as wb

    monkeypatch.setattr(tb.WorkersAcrossEpochs, "_copied_out", lambda self, batch: False)
    for module in (tb, wb):
        monkeypatch.setattr(module, "DevicePrefetcher", _CopiesLikeAGpu)
    monkeypatch.setattr(slots_mod, "WAIT_S", 3.0)  # forked workers inherit it


class _CopiesLikeAGpu:
    """DevicePrefetcher's CPU path with a GPU's slot semantics: a whole batch stays a view of
    its slot until it is "copied" (here: normalised), then is reported as copied."""

    def __init__(self, batches, device, normalize, slots=None, decode=None) -> None:
        self.batches, self.normalize, self.slots = batches, normalize, slots

    def __iter__(self):
        for images, labels, keys in self.batches:
            out = self.normalize(images), labels.clone(), keys
            if self.slots is not None:
                self.slots.copied(None)
            yield out


def test_a_resumed_wds_epoch_hands_back_the_slots_of_batches_it_skips(tiny_uneven, gpu_like):
    """Resuming at batch 1 where a worker's short chunk comes first (seed 0 here): the first
    whole chunk is decoded into a slot, then skipped, never copied. Its slot must go back, or
    the worker waits for it when its turn comes round (in the next epoch) and the loader fails."""
    common = dict(workers=2, device="cpu", image_size=16, return_keys=True, prefetch=1,
                  slots=True, seed=0, multiprocessing_context="fork")  # fmt: skip
    loaders = [build_loader(tiny_uneven, "wds", 16, **common) for _ in range(3)]
    whole, part, again = loaders
    try:
        assert again._resume_skip(0, 1) == 0  # the layout this test needs: nothing left undecoded
        expect = [k.clone() for e in range(2) for _, _, k in _set_epoch(whole, e)]
        next(iter(part))
        again.load_state_dict(part.state_dict())
        got = [k.clone() for e in range(2) for _, _, k in _set_epoch(again, e)]
    finally:
        for loader in loaders:
            loader.close()
    assert len(got) == len(expect) - 1
    assert all(torch.equal(a, b) for a, b in zip(got, expect[1:], strict=True))


def _set_epoch(loader, epoch: int):
    loader.set_epoch(epoch)
    return loader


@pytest.fixture(scope="module")
def tiny_uneven(tmp_path_factory):
    """Two shards of 36 and 4 samples: one worker's only chunk is short."""
    return make_tiny(tmp_path_factory.mktemp("uneven"), n=40, per_shard=36)["shards"]


def test_a_slots_value_that_is_not_a_switch_is_one_line_before_anything_starts(tiny):
    from loaders import check_options

    with pytest.raises(ValueError, match="^slots takes true or false, not 'maybe'$"):
        check_options("torch", {"slots": "maybe"})
    for ok in (True, False, 0, 1, None):
        check_options("wds", {"slots": ok})
