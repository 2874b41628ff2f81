"""Exact evaluation and mid-epoch resumption, for every backend, one loader per rank in-process.

Evaluation (``train=False``): every sample exactly once over the ranks, no padding, the same
order every epoch. Resumption: a new loader given ``state_dict()`` after k batches yields what the
uninterrupted loader went on to yield (the same batches, in order, with the same pixels), then the
next epoch as it did; the torch backend also deals the rest of an epoch to another world size.
"""

from __future__ import annotations

import collections
import io

import pytest
import torch

from loaders import build_loader
from loaders.dist import eval_indices
from tests.loaders.test_loaders import COMBOS, make_tiny  # every backend, every source

N = 50  # divides by neither 3 nor the batch
BATCH = 8
IDS = [f"{b}-{k}" for b, k in COMBOS]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """50 labelled images as a tree and as 9 shards (8 of 6 samples and one of 2)."""
    return make_tiny(tmp_path_factory.mktemp("evalresume"), n=N, per_shard=6)


def _loader(tiny, backend, kind, rank, world, **kw):
    if backend == "dali":
        pytest.importorskip("nvidia.dali", reason="needs NVIDIA DALI (the dali extra)")
    kw = dict(image_size=8, device="cpu", seed=3, **kw)
    kw.setdefault("return_keys", True)
    kw.setdefault("workers", 0)
    if backend == "dali":
        kw["workers"] = 1  # DALI CPU threads
    return build_loader(tiny[kind], backend, BATCH, rank=rank, world_size=world, **kw)


def _summary(batch) -> tuple[list[int], float]:
    """A batch as its keys and a pixel checksum (DALI reuses its buffers: summarise at once)."""
    images, _, keys = batch
    return keys.tolist(), float(images.double().sum())


def _epoch(loader) -> list[tuple[list[int], float]]:
    return [_summary(b) for b in loader]


# --- exact evaluation ---------------------------------------------------------------------------
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize(("backend", "kind"), COMBOS, ids=IDS)
def test_eval_sees_every_sample_exactly_once(tiny, backend, kind, world):
    seen: list[int] = []
    for rank in range(world):
        loader = _loader(tiny, backend, kind, rank, world, train=False)
        first, second = _epoch(loader), _epoch(loader)
        assert first == second  # no shuffling and no random transform: the same every epoch
        keys = [k for batch, _ in first for k in batch]
        assert len(first) == len(loader)  # the length is exact on every rank
        assert len(keys) == loader.samples_per_rank and loader.padding_per_epoch == 0
        assert all(len(batch) == BATCH for batch, _ in first[:-1])
        if backend != "wds":  # a contiguous range: ranks differ by at most one sample
            assert sorted(keys) == eval_indices(N, rank, world).tolist()
        seen += keys
        loader.close()
    assert sorted(seen) == list(range(N))  # exactly once over all ranks, nothing repeated


def test_wds_eval_splits_by_whole_shards(tiny):
    """9 shards over 2 ranks: rank 0 takes shards 0, 2, 4, 6, 8 (26 samples), rank 1 the other
    four (24): more than one sample apart, as whole shards must be."""
    lengths = [_loader(tiny, "wds", "shards", r, 2, train=False).samples_per_rank for r in (0, 1)]
    assert lengths == [4 * 6 + 2, 4 * 6]


# --- resumption ---------------------------------------------------------------------------------
def _interrupted(loader, k: int):
    """The state after ``k`` batches of epoch 0, and what the same loader then went on to yield:
    the rest of epoch 0 and epoch 1 (the uninterrupted run)."""
    it = iter(loader)
    for _ in range(k):
        next(it)
    state = loader.state_dict()
    rest = [_summary(b) for b in it]
    return state, rest, _epoch(loader)


RESUME_CASES = [(b, k, w, True, 2, 0) for b, k in COMBOS for w in (1, 2, 3)] + [
    ("torch", "tree", 2, False, 1, 0),
    ("wds", "shards", 2, False, 1, 0),
    ("dali", "shards", 3, False, None, 0),  # at an eval epoch's end, DALI's padding batch left
    ("dali", "tree", 2, True, None, 0),  # at the epoch's end: the dealt source runs on
    ("dali", "shards", 2, True, None, 0),  # at the epoch's end: the next epoch, a new pipeline
    ("torch", "shards", 1, True, None, 0),  # at the epoch's end: the state points at the next
    ("torch", "tree", 1, True, 3, 2),  # worker processes that prefetched beyond the state
    ("wds", "shards", 1, True, 3, 2),  # two workers' chunks interleaved, one with fewer
]


@pytest.mark.parametrize(("backend", "kind", "world", "train", "k", "workers"), RESUME_CASES)
def test_resume_yields_the_uninterrupted_rest(tiny, backend, kind, world, train, k, workers):
    kw = dict(train=train)
    if workers:
        kw.update(workers=workers, multiprocessing_context="fork")
    for rank in range(world):
        loader = _loader(tiny, backend, kind, rank, world, **kw)
        k_rank = len(loader) if k is None else k
        state, rest, next_epoch = _interrupted(loader, k_rank)
        loader.close()
        buf = io.BytesIO()
        torch.save(state, buf)  # a plain dict: loads without unpickling code
        buf.seek(0)
        state = torch.load(buf, weights_only=True)
        resumed = _loader(tiny, backend, kind, rank, world, **kw)
        resumed.load_state_dict(state)
        if k is None:  # the epoch was done: the state is the next epoch's start
            assert (state["epoch"], state["batches"], rest) == (1, 0, [])
            assert _epoch(resumed) == next_epoch
        else:
            assert (state["epoch"], state["batches"]) == (0, k)
            assert _epoch(resumed) == rest and rest
            assert _epoch(resumed) == next_epoch
        resumed.close()


def _keys_per_rank(loaders) -> list[list[int]]:
    return [[key for batch, _ in _epoch(ld) for key in batch] for ld in loaders]


@pytest.mark.parametrize(
    ("train", "worlds"), [(True, (2, 3)), (True, (3, 2, 1)), (False, (3, 2))], ids=str
)
def test_torch_resumes_an_epoch_on_other_world_sizes(tiny, train, worlds):
    """Each world size takes one batch per rank, the next gets the state: over the epoch every
    sample is seen exactly once (training: apart from padding at the end), ranks stay equal in
    training, and the next epoch is the new world's own."""
    seen: list[int] = []
    state = None
    for step, world in enumerate(worlds):
        loaders = [_loader(tiny, "torch", "tree", r, world, train=train) for r in range(world)]
        for ld in loaders:
            if state is not None:
                ld.load_state_dict(state)
        if step < len(worlds) - 1:
            for ld in loaders:
                batch = next(iter(ld))
                seen += batch[2].tolist()
            state = loaders[0].state_dict()
            assert state["world_size"] == world
            continue
        rest = _keys_per_rank(loaders)
        seen += [k for keys in rest for k in keys]
        if train:
            assert len({len(keys) for keys in rest}) == 1  # equal lengths for DDP
            repeats = sum(c - 1 for c in collections.Counter(seen).values())
            assert repeats < world  # only the padding of the last part
        else:
            assert len(seen) == N
        assert set(seen) == set(range(N))
        fresh = [_loader(tiny, "torch", "tree", r, world, train=train) for r in range(world)]
        for ld in fresh:
            ld.set_epoch(1)
        assert _keys_per_rank(loaders) == _keys_per_rank(fresh)


def test_states_from_other_arguments_are_refused(tiny):
    torch_state = _loader(tiny, "torch", "tree", 0, 2).state_dict()
    with pytest.raises(ValueError, match="saved with batch_size=8"):
        build_loader(tiny["tree"], "torch", 16, rank=0, world_size=2).load_state_dict(torch_state)
    other = build_loader(tiny["tree"], "torch", BATCH, seed=4, rank=0, world_size=2)
    with pytest.raises(ValueError, match="saved with seed=3"):
        other.load_state_dict(torch_state)
    with pytest.raises(ValueError, match="not a loader state"):
        _loader(tiny, "torch", "tree", 0, 2).load_state_dict({"epoch": 1})
    wds = _loader(tiny, "wds", "shards", 0, 2)
    state, _, _ = _interrupted(wds, 1)
    with pytest.raises(ValueError, match="cannot resume an epoch on another world size"):
        _loader(tiny, "wds", "shards", 0, 3).load_state_dict(state)
    with pytest.raises(ValueError, match="saved with workers=1"):
        _loader(tiny, "wds", "shards", 0, 2, workers=2).load_state_dict(state)
    _loader(tiny, "wds", "shards", 0, 3).load_state_dict(state | {"batches": 0})  # a new epoch


def test_dali_state_is_per_rank(tiny):
    loader = _loader(tiny, "dali", "tree", 0, 2)
    state, _, _ = _interrupted(loader, 1)
    with pytest.raises(ValueError, match="the dali backend's state is per rank"):
        _loader(tiny, "dali", "tree", 1, 2).load_state_dict(state)
    with pytest.raises(ValueError, match="cannot resume an epoch on another world size"):
        _loader(tiny, "dali", "tree", 0, 3).load_state_dict(state)


def test_dali_refuses_a_shard_state_from_a_pipeline_that_ran_on(tiny):
    """A mid-epoch state saved before shards had a pipeline per epoch (its reader's order ran on
    across epochs) cannot be restored into this epoch's pipeline: a clear error, not an order
    that is neither run's."""
    state, _, _ = _interrupted(_loader(tiny, "dali", "shards", 0, 2), 1)
    assert state["dali"]["per_epoch"] and state["dali"]["checkpoint"]
    _loader(tiny, "dali", "shards", 0, 2).load_state_dict(state)
    old = state | {"dali": {k: v for k, v in state["dali"].items() if k != "per_epoch"}}
    with pytest.raises(ValueError, match="saved by another version of loaders"):
        _loader(tiny, "dali", "shards", 0, 2).load_state_dict(old)


def test_dali_tree_state_restores_only_into_a_pipeline_with_its_outputs(tiny):
    """Training on a tree, DALI's checkpoint restores only into a pipeline with the same
    outputs (keys are one only with ``return_keys``; labels one since DEALT_OUTPUTS 2): another
    pipeline is a clear error when the state is loaded, not DALI's "the checkpoint might come
    from another pipeline" at the next batch."""
    state, rest, _ = _interrupted(_loader(tiny, "dali", "tree", 0, 2), 1)
    assert state["dali"]["dealt_outputs"] == [2, True]
    same = _loader(tiny, "dali", "tree", 0, 2)
    same.load_state_dict(state)
    assert _summary(next(iter(same))) == rest[0]
    no_keys = _loader(tiny, "dali", "tree", 0, 2, return_keys=False)
    with pytest.raises(ValueError, match="saved with return_keys=True, this loader has retu"):
        no_keys.load_state_dict(state)
    old = state | {"dali": {k: v for k, v in state["dali"].items() if k != "dealt_outputs"}}
    with pytest.raises(ValueError, match="saved by another version of loaders"):
        _loader(tiny, "dali", "tree", 0, 2).load_state_dict(old)


def test_a_dali_epoch_left_midway_at_exit_prints_no_error(tiny, tmp_path):
    """An iterator left mid-epoch is closed at the interpreter's exit, where DALI's Python is
    half torn down: taking a checkpoint there printed "Exception ignored in ..."."""
    import subprocess
    import sys

    code = (
        "from loaders import build_loader\n"
        f"L = build_loader({str(tiny['tree'])!r}, 'dali', 8, image_size=8, device='cpu',"
        " workers=1, seed=3)\n"
        "it = iter(L); next(it); print('left midway')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "left midway" in r.stdout, r.stderr
    assert "Exception ignored" not in r.stderr and "Traceback" not in r.stderr, r.stderr
