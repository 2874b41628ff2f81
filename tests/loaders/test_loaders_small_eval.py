"""Small data and evaluation with a collective per step, every backend.

Fewer samples than ranks × batch never hangs: world 8 over 5 samples ends, in a child process
with a time limit (a hang fails the test), with the counts docs/eval-and-small-data.md gives or
one clear error on every rank. Even evaluation (``even_batches=True``): every rank yields the same
batches of the same sizes, so an Accelerate-style per-step ``all_gather`` over 2 real gloo ranks
completes, and counting only ``valid`` samples gives the exact metric.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback

import pytest
import torch

from loaders import LoaderError, build_loader
from tests.conftest import ROOT
from tests.loaders.test_loaders import CLASSES, COMBOS, _free_port, make_tiny

IDS = [f"{b}-{k}" for b, k in COMBOS]
# world 8 over 5 samples: a backend's tree and shards run the same sampler or raise the same error
# (torch over shards too: its shards' samples go through torch-tree's sampler, by sample)
SMALL = [("torch", "tree"), ("torch", "shards"), ("wds", "shards"), ("dali", "tree")]
WORLD, N, BATCH = 8, 5, 2
# (train, even_batches) × drop_last: what each rank of 8 yields over 5 samples in batches of 2
MODES = [
    (train, even, drop)
    for train, even in ((True, False), (False, False), (False, True))
    for drop in (False, True)
]


def _needs(backend: str) -> None:
    if backend == "dali":
        pytest.importorskip("nvidia.dali", reason="needs NVIDIA DALI (the dali extra)")


def _small_child(roots: dict, combos: list) -> None:
    """In a child process: every mode on every rank of 8 (emulated by arguments), as JSON."""
    out = {}
    for backend, kind in combos:
        for train, even, drop in MODES:
            ranks = []
            for rank in range(WORLD):
                kw = dict(train=train, even_batches=even, drop_last=drop, rank=rank)
                kw.update(world_size=WORLD, image_size=8, device="cpu", return_keys=True)
                if backend != "dali":  # a worker process: where the torch backend hung
                    kw.update(workers=1, multiprocessing_context="fork")
                try:
                    loader = build_loader(roots[kind], backend, BATCH, **kw)
                    got = [[b[2].tolist(), b[3].tolist() if even else None] for b in loader]
                    ranks.append({"len": len(loader), "batches": got})
                    loader.close()
                except LoaderError as e:
                    ranks.append({"error": str(e)})
            out[f"{backend}-{kind}-{train}-{even}-{drop}"] = ranks
    print(json.dumps(out))


@pytest.fixture(scope="module")
def five(tmp_path_factory):
    """5 labelled images as a tree and as 5 shards of one."""
    return make_tiny(tmp_path_factory.mktemp("five"), n=N, per_shard=1)


@pytest.fixture(scope="module")
def small_runs(five) -> dict:
    """Every backend's modes, in one child process (one import of torch) with a time limit."""
    try:
        import nvidia.dali  # noqa: F401

        combos = SMALL
    except ImportError:
        combos = [c for c in SMALL if c[0] != "dali"]
    roots = {k: str(v) for k, v in five.items()}
    code = f"from {__name__} import _small_child; _small_child({roots!r}, {combos!r})"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"world {WORLD} over {N} samples did not end within 120 s: a hang")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# eval_indices(5, r, 8): ranks 0, 2 and 5 have no sample, the others one
OWN = [0, 1, 0, 1, 1, 0, 1, 1]


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "kind"), SMALL, ids=[f"{b}-{k}" for b, k in SMALL])
def test_world_8_over_5_samples_ends_with_the_documented_counts(small_runs, backend, kind):
    _needs(backend)
    got = {m: r for m, r in small_runs.items() if m.startswith(f"{backend}-{kind}-")}
    assert len(got) == len(MODES)
    if backend != "torch":  # one clear error, the same on every rank, in every mode
        want = {
            "wds": "5 shards cannot feed 8 ranks × 1 workers: every rank needs at least one "
            "whole shard (reshard into ≥ 8 shards, run ≤ 5 ranks, or use backend='torch'",
            "dali": "5 samples cannot be split over 8 ranks by DALI",
        }[backend]
        for ranks in got.values():
            assert all(r.get("error", "").startswith(want) for r in ranks), ranks
        return
    for mode, ranks in got.items():
        train, even, drop = (m == "True" for m in mode.split("-")[2:])
        lens = [r["len"] for r in ranks]
        sizes = [[len(k) for k, _ in r["batches"]] for r in ranks]
        assert lens == [len(s) for s in sizes], mode  # len() says what iterating yields
        if drop:  # one sample per rank at most, batches of 2: nothing on any rank
            assert sizes == [[]] * WORLD, mode
        elif train or even:  # every rank one batch of one (3 of them repeats)
            assert sizes == [[1]] * WORLD, mode
            keys = [k for r in ranks for k, _ in r["batches"] for k in k]
            assert set(keys) == set(range(N)), mode
        else:  # exact: a rank without samples yields no batch
            assert sizes == [[1] if n else [] for n in OWN], mode
        if even and not drop:  # the repeats are marked: each sample valid exactly once
            marks = [(k, v) for r in ranks for b in r["batches"] for k, v in zip(*b, strict=True)]
            assert sorted(k for k, ok in marks if ok) == list(range(N))
            assert [r["batches"][0][1] for r in ranks] == [[bool(n)] for n in OWN]


# --- even evaluation ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """23 labelled images as a tree and as 8 shards (7 of 3 samples and one of 2)."""
    return make_tiny(tmp_path_factory.mktemp("even"), n=23, per_shard=3)


def _loader(root, backend, rank, world, **kw):
    _needs(backend)
    kw.setdefault("workers", 1 if backend == "dali" else 0)
    return build_loader(
        root, backend, 4, train=False, image_size=8, device="cpu", rank=rank, world_size=world, **kw
    )


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize(("backend", "kind"), COMBOS, ids=IDS)
def test_even_eval_same_sizes_on_every_rank_and_each_sample_valid_once(tiny, backend, kind, world):
    workers = {"wds": 2 if world == 2 else 1}.get(backend)  # wds: repeats between its workers
    extra = {} if workers is None else {"workers": workers}
    valid_keys, sizes = [], []
    for rank in range(world):
        loader = _loader(tiny[kind], backend, rank, world, even_batches=True, return_keys=True,
                         **extra)  # fmt: skip
        got = [(len(k), k[v].tolist()) for _images, _labels, k, v in loader]
        sizes.append([n for n, _ in got])
        valid_keys += [k for _, keys in got for k in keys]
        assert len(loader) == len(got)
        assert loader.padding_per_epoch == world * loader.samples_per_rank - 23
    assert all(s == sizes[0] for s in sizes), sizes
    assert sorted(valid_keys) == list(range(23))


def test_even_batches_is_for_evaluation_only(tiny):
    with pytest.raises(ValueError, match="even_batches is for evaluation"):
        build_loader(tiny["tree"], "torch", 4, train=True, even_batches=True, device="cpu")


def test_exact_eval_is_unpadded_and_yields_no_mask(tiny):
    batch = next(iter(_loader(tiny["tree"], "torch", 0, 2)))
    assert len(batch) == 2  # (images, labels): the default is exact, with no valid element


# --- a per-step collective over 2 real gloo ranks -------------------------------------------------
def _gather(t: torch.Tensor) -> torch.Tensor:
    import torch.distributed as tdist

    parts = [torch.empty_like(t) for _ in range(tdist.get_world_size())]
    tdist.all_gather(parts, t)  # gloo aborts the job when the sizes differ between ranks
    return torch.cat(parts)


def _eval_rank(rank: int, port: int, roots: dict, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as tdist

    torch.set_num_threads(1)
    tdist.init_process_group("gloo", rank=rank, world_size=2)
    results = {}
    try:
        for backend, kind in GATHERED:
            try:
                loader = build_loader(
                    roots[kind], backend, 4, train=False, even_batches=True, image_size=8,
                    device="cpu", workers=2 if backend == "wds" else 1, return_keys=True,
                )  # fmt: skip
                keys, label_sum = [], 0
                for _images, labels, k, valid in loader:  # gather_for_metrics, by hand
                    labels, k, valid = _gather(labels), _gather(k), _gather(valid)
                    keys += k[valid].tolist()
                    label_sum += int(labels[valid].sum())  # the metric: exact or not
                results[backend] = {"keys": keys, "label_sum": label_sum}
                loader.close()
            except Exception:
                results[backend] = {"error": traceback.format_exc()}
        if rank == 0:
            queue.put(results)
    finally:
        tdist.destroy_process_group()


# the backends whose exact eval batches differ in size between 2 ranks over 23 samples (DALI's
# repeats are marked as the torch backend's: by position; the test above covers it)
GATHERED = [("torch", "tree"), ("wds", "shards")]


@pytest.mark.slow
def test_per_step_all_gather_of_even_eval_batches_over_2_gloo_ranks(tiny):
    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    queue = ctx.SimpleQueue()
    args = (_free_port(), {k: str(v) for k, v in tiny.items()}, queue)
    procs = [ctx.Process(target=_eval_rank, args=(r, *args)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, "a rank did not end: a per-step collective hung"
    assert [p.exitcode for p in procs] == [0, 0]  # gloo's size mismatch would abort (SIGABRT)
    results = queue.get()
    for name, res in results.items():
        assert "error" not in res, res.get("error")
        # each sample counted once, over both ranks: the metric is exact
        assert sorted(res["keys"]) == list(range(23)), name
        assert res["label_sum"] == sum(i % CLASSES for i in range(23)), name


def test_a_dali_pipeline_error_keeps_dalis_own_reason(five):
    """DALI's own words reach the user: here its refusal of 8 shards over 5 samples, made by
    asking a loader built for 1 rank for rank 1 of 8 (past the loader's own up-front check)."""
    from loaders.dist import DistInfo

    loader = _loader(five["tree"], "dali", 0, 1)
    loader.info = DistInfo(1, 8, 0, 1, "arguments")
    with pytest.raises(LoaderError) as e:
        next(iter(loader))
    assert str(e.value) == (
        "DALI pipeline failed on rank 1: The number of input samples: 5, needs to be at least "
        "equal to the requested number of shards: 8."
    )
