"""Pure functions behind the loaders: padding plans, DCT factors, label parsing, the epoch rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from loaders import build_loader
from loaders.dali_feed import parse_labels
from loaders.decode import center_crop_box, dct_factor, random_resized_crop_box
from loaders.wds_backend import fixed_samples_per_rank, shard_order, worker_quotas
from tests.loaders.test_loaders import make_tiny


@pytest.mark.parametrize(
    ("sizes", "world", "expected"),
    [
        ([100] * 10 + [1], 2, 600),  # 11 shards over 2 ranks: 6 shards at most
        ([100] * 10 + [1], 3, 400),
        ([50] * 8, 4, 100),  # divisible: no padding
        ([10, 30, 20], 1, 60),
    ],
)
def test_wds_fixed_epoch_length_and_quotas(sizes, world, expected):
    per_shard = np.array(sizes)
    assert fixed_samples_per_rank(per_shard, world) == expected
    for epoch in range(3):
        order = shard_order(len(sizes), seed=1, epoch=epoch)
        dealt = []
        for rank in range(world):
            plan = worker_quotas(per_shard, order, rank, world, 2, expected)
            assert sum(q for _, q in plan) == expected  # every rank: the same sample count
            for shards, quota in plan:
                assert quota >= per_shard[list(shards)].sum()  # only padding is added
                dealt += list(shards)
        assert sorted(dealt) == list(range(len(sizes)))  # every shard to exactly one worker
    assert not np.array_equal(shard_order(11, 1, 0), shard_order(11, 1, 1))


@pytest.mark.parametrize(
    ("w", "h", "size", "k"), [(300, 300, 224, 1), (448, 500, 224, 2), (1000, 900, 224, 4),
                              (4000, 3000, 224, 8), (447, 2000, 224, 1)],
)  # fmt: skip
def test_dct_factor_keeps_the_crop_at_least_the_output_size(w, h, size, k):
    assert dct_factor(w, h, size) == k
    assert min(w, h) / k >= size or k == 1


def test_crop_boxes_stay_inside_the_image():
    rng = np.random.default_rng(0)
    for _ in range(200):
        w, h = int(rng.integers(1, 900)), int(rng.integers(1, 900))
        x, y, cw, ch = random_resized_crop_box(w, h, rng)
        assert x >= 0 and y >= 0 and x + cw <= w and y + ch <= h and cw > 0 and ch > 0
    assert center_crop_box(400, 300, 224) == (69, 19, 262, 262)


def test_parse_labels_reads_ascii_decimals():
    rows = [b"7", b"123", b"42\n", b"0"]
    digits = torch.zeros((len(rows), 12), dtype=torch.uint8)
    for i, r in enumerate(rows):
        digits[i, : len(r)] = torch.tensor(list(r), dtype=torch.uint8)
    assert parse_labels(digits).tolist() == [7, 123, 42, 0]


def test_set_epoch_and_the_automatic_next_epoch(tmp_path):
    tree = make_tiny(tmp_path, 40, 10)["tree"]
    kw = dict(image_size=8, workers=0, device="cpu", return_keys=True, seed=3)
    loader = build_loader(tree, "torch", 16, **kw)

    def order():
        return [k for _, _, keys in loader for k in keys.tolist()]

    e0, e1 = order(), order()
    assert loader.epoch == 1 and e0 != e1
    loader.set_epoch(0)
    assert order() == e0 and loader.epoch == 0
    assert len(build_loader(tree, "torch", 16, drop_last=True, **kw)) == 2  # 40 // 16
    assert len(loader) == 3


def _keys(loader, batches: int | None = None) -> list[int]:
    out: list[int] = []
    for i, (_, _, keys) in enumerate(loader):
        if batches is not None and i == batches:
            break
        out += keys.tolist()
    return out


def _fresh_keys(root, backend: str, epoch: int, **kw) -> list[int]:
    """Epoch ``epoch``'s keys from a new loader (batch 32) that starts there."""
    other = build_loader(root, backend, 32, **kw)
    other.set_epoch(epoch)
    keys = _keys(other)
    other.close()
    return keys


def test_torch_workers_go_on_into_the_next_epoch_with_the_same_orders(tmp_path):
    """The torch backend's workers start epoch e + 1 before the training loop asks for it, and
    every epoch still has exactly the order a fresh loader gives it (also after an epoch left
    midway, or a jump with set_epoch)."""
    root = make_tiny(tmp_path, n=256, per_shard=32)["tree"]
    kw = dict(image_size=16, workers=2, seed=5, return_keys=True, multiprocessing_context="fork")

    def fresh(epoch: int) -> list[int]:
        return _fresh_keys(root, "torch", epoch, **kw)

    loader = build_loader(root, "torch", 32, **kw)
    assert len(loader) == 8
    first = _keys(loader)
    # the DataLoader iterator has already sent the workers batches of epoch 1 (private counter:
    # batches handed to workers so far; 8 would mean it stopped at the epoch's end)
    assert loader._iter._send_idx > len(loader)
    second = _keys(loader)
    assert first == fresh(0) and second == fresh(1) and first != second
    assert sorted(second) == list(range(256))
    _keys(loader, batches=3)  # epoch 2, left midway: the next pass starts it over
    assert _keys(loader) == fresh(2)
    loader.set_epoch(7)
    assert _keys(loader) == fresh(7)
    loader.close()


@pytest.mark.parametrize(("n", "workers"), [(256, 2), (250, 3)], ids=["equal", "unequal"])
def test_wds_workers_go_on_into_the_next_epoch_with_the_same_orders(tmp_path, n, workers):
    """The wds backend's workers start epoch e + 1 before the training loop asks for it, and every
    epoch is still exactly what a fresh loader gives it (also after an epoch left midway, or a
    jump with set_epoch). "unequal": 8 shards over 3 workers, one shard short, so the workers'
    shares differ and the smaller ones pad their turn with empty chunks."""
    root = make_tiny(tmp_path, n=n, per_shard=32)["shards"]
    kw = dict(
        image_size=16, workers=workers, seed=5, return_keys=True, multiprocessing_context="fork"
    )

    def fresh(epoch: int) -> list[int]:
        return _fresh_keys(root, "wds", epoch, **kw)

    loader = build_loader(root, "wds", 32, **kw)
    first = _keys(loader)
    per_epoch = loader.dataset.chunks_per_worker(0, workers) * workers
    # the DataLoader iterator has already asked the workers for chunks of epoch 1
    assert loader._iter._send_idx > per_epoch
    second = _keys(loader)
    assert first == fresh(0) and second == fresh(1) and first != second
    assert set(second) == set(range(n)) and len(second) == len(loader) * 32 - (
        0 if loader.samples_per_rank % 32 == 0 else 32 - loader.samples_per_rank % 32
    )
    _keys(loader, batches=3)  # epoch 2, left midway: the next pass starts it over
    assert _keys(loader) == fresh(2)
    loader.set_epoch(7)
    assert _keys(loader) == fresh(7)
    loader.close()


@pytest.mark.parametrize("pace", [-1, 1.5, "often"])
def test_dali_pace_takes_whole_steps(tmp_path, pace):
    pytest.importorskip("nvidia.dali", reason="needs NVIDIA DALI (the dali extra)")
    root = make_tiny(tmp_path, n=40, per_shard=10)["tree"]
    with pytest.raises(ValueError, match="pace takes 0"):
        build_loader(root, "dali", 8, image_size=16, workers=1, pace=pace)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"pace_lead_ms": -1}, "pace_lead_ms takes milliseconds"),
        ({"pace_lead_ms": "soon"}, "pace_lead_ms takes milliseconds"),
    ],
)
def test_dali_pace_lead_is_checked(tmp_path, options, match):
    pytest.importorskip("nvidia.dali", reason="needs NVIDIA DALI (the dali extra)")
    root = make_tiny(tmp_path, n=40, per_shard=10)["tree"]
    with pytest.raises(ValueError, match=match):
        build_loader(root, "dali", 8, image_size=16, workers=1, **options)


def test_pacing_release_time_is_the_median_step_less_the_lead():
    """The host goes on ``lead`` before the running step is due: the end of the one before
    plus the median of the recent steps (one outlier, e.g. an epoch's first step, moves nothing)."""
    from loaders.pacing import release_time

    assert release_time(10.0, [0.050, 0.052, 0.900], 0.003) == pytest.approx(10.049)
    assert release_time(10.0, [0.050], 0.0) == pytest.approx(10.050)
    # a short step gets at most a tenth of itself as lead: the host stays nearly one step behind
    assert release_time(10.0, [0.010], 0.005) == pytest.approx(10.009)


def test_dali_decode_choices(tmp_path):
    """``decode``: auto, gpu or cpu; asking for GPU decode without a GPU is refused, not ignored."""
    pytest.importorskip("nvidia.dali", reason="needs NVIDIA DALI (the dali extra)")
    root = make_tiny(tmp_path, n=16, per_shard=8)["tree"]
    with pytest.raises(ValueError, match="decode takes auto, gpu or cpu"):
        build_loader(root, "dali", 8, image_size=16, workers=1, decode="nvjpeg")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a CUDA device"):
            build_loader(root, "dali", 8, image_size=16, workers=1, decode="gpu")
    loader = build_loader(root, "dali", 8, image_size=16, workers=1, decode="cpu")
    assert loader.decode == "cpu" and sum(len(b[0]) for b in loader) == 16
    loader.close()


@pytest.mark.parametrize(
    ("decode", "resize", "gpu", "batch", "threads", "augment", "where"),
    [
        # without a GPU everything is on the CPU
        ("auto", "auto", False, 256, 16, False, ("cpu", "cpu")),
        # small batches: the CPU decodes and resizes (SMALL BATCHES), or the GPU resizes if asked
        ("auto", "auto", True, 64, 16, False, ("cpu", "cpu")),
        ("auto", "auto", True, 64, 2, False, ("cpu", "cpu")),
        ("auto", "gpu", True, 64, 16, False, ("cpu", "gpu")),
        # larger: the CPU decodes, the GPU resizes, on enough threads; else the GPU does both
        ("auto", "auto", True, 65, 12, False, ("cpu", "gpu")),
        ("auto", "auto", True, 256, 16, False, ("cpu", "gpu")),
        ("auto", "auto", True, 256, 11, False, ("gpu", "gpu")),
        ("auto", "gpu", True, 256, 4, False, ("gpu", "gpu")),
        # your dali_augment gets GPU nodes at larger batches, as before
        ("auto", "auto", True, 256, 16, True, ("gpu", "gpu")),
        ("auto", "auto", True, 64, 16, True, ("cpu", "cpu")),
        # asked for: as asked, the resize where the decode ran unless asked for the GPU
        ("cpu", "auto", True, 256, 16, False, ("cpu", "cpu")),
        ("cpu", "gpu", True, 256, 2, False, ("cpu", "gpu")),
        ("gpu", "auto", True, 64, 16, False, ("gpu", "gpu")),
    ],
)
def test_dali_places_decode_and_resize(decode, resize, gpu, batch, threads, augment, where):
    """Where DALI decodes and resizes, from the asked options, the device, the batch, the
    threads and a dali_augment (loaders/dali_backend.py: SMALL BATCHES, LARGER BATCHES ON
    ENOUGH THREADS)."""
    pytest.importorskip("nvidia.dali", reason="needs NVIDIA DALI (the dali extra)")
    from loaders.dali_backend import CPU_DECODE_THREADS, SMALL_BATCH, placement

    assert (SMALL_BATCH, CPU_DECODE_THREADS) == (64, 12)  # the table's edges
    assert placement(decode, resize, gpu, batch, threads, augment) == where


def test_dali_resize_choices(tmp_path):
    """``resize``: auto (where the decode ran) or gpu (a CPU decode's crops resized on the GPU);
    gpu without a GPU, or beside ``dali_augment`` (handed the images where the decode left
    them), is refused with the reason, not ignored."""
    pytest.importorskip("nvidia.dali", reason="needs NVIDIA DALI (the dali extra)")
    from loaders import check_options

    root = make_tiny(tmp_path, n=16, per_shard=8)["tree"]
    with pytest.raises(ValueError, match="resize takes auto or gpu"):
        check_options("dali", {"resize": "cpu"})
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="resize='gpu' needs a CUDA device"):
            build_loader(root, "dali", 8, image_size=16, workers=1, resize="gpu")
    with pytest.raises(ValueError, match="does not combine with dali_augment"):
        build_loader(root, "dali", 8, image_size=16, workers=1, resize="gpu",
                     dali_augment=lambda images: images)  # fmt: skip
    loader = build_loader(root, "dali", 8, image_size=16, workers=1)
    assert loader.resize == loader.decode == "cpu" and sum(len(b[0]) for b in loader) == 16
    loader.close()


@pytest.mark.parametrize("backend", ["torch", "wds"])
def test_close_stops_the_workers_that_ran_ahead(tmp_path, backend):
    """After a whole epoch the workers are already working on the next one; ``close()`` stops
    them (``feedbench scan --loader`` relies on it before each pass's cache eviction), and the
    loader starts again from the epoch asked for."""
    import multiprocessing

    root = make_tiny(tmp_path, n=128, per_shard=32)["tree" if backend == "torch" else "shards"]
    kw = dict(image_size=16, workers=2, seed=5, return_keys=True, multiprocessing_context="fork")
    loader = build_loader(root, backend, 32, **kw)
    before = set(multiprocessing.active_children())
    _keys(loader)
    assert set(multiprocessing.active_children()) - before  # its workers, running on
    loader.close()
    assert not set(multiprocessing.active_children()) - before
    loader.set_epoch(1)
    assert _keys(loader) == _fresh_keys(root, backend, 1, **kw)
    loader.close()


@pytest.mark.parametrize(("backend", "nice"), [("torch", None), ("wds", 3), ("torch", 0)])
def test_workers_run_below_the_training_process(tmp_path, backend, nice):
    """The workers run ``worker_nice`` steps (10 by default) below the process that iterates,
    whose own priority is untouched; spawned workers too (the setting travels with them)."""
    import multiprocessing

    import psutil

    from loaders.torch_backend import WORKER_NICE

    root = make_tiny(tmp_path, n=64, per_shard=16)["tree" if backend == "torch" else "shards"]
    options = {} if nice is None else {"worker_nice": nice}
    context = "spawn" if nice == 3 else "fork"
    mine = psutil.Process().nice()
    before = set(multiprocessing.active_children())
    loader = build_loader(root, backend, 16, image_size=16, workers=2, device="cpu",
                          multiprocessing_context=context, **options)  # fmt: skip
    batches = iter(loader)
    next(batches), next(batches)  # one from each worker (in turn): both have started
    workers = set(multiprocessing.active_children()) - before
    expected = min(19, mine + (WORKER_NICE if nice is None else nice))
    assert len(workers) == 2
    assert [psutil.Process(w.pid).nice() for w in workers] == [expected] * 2
    assert psutil.Process().nice() == mine
    loader.close()


def test_two_wds_loaders_in_one_process_do_not_share_a_read_buffer(tmp_path):
    """Validation between two batches of training, both without workers: the paused training
    stream's shard reader must not see what validation read (one reused buffer per process
    would hand it validation's bytes: a sample lost as "zero-byte", the order shifted)."""
    shards = make_tiny(tmp_path, n=40, per_shard=10)["shards"]
    kw = dict(image_size=16, device="cpu", return_keys=True, workers=0, train=False)

    def keys(loader, between=None) -> list[int]:
        out = []
        for i, (_, _, k) in enumerate(loader):
            out += k.tolist()
            if i == 0 and between is not None:
                between()
        return out

    alone = keys(build_loader(shards, "wds", 4, **kw))
    first = build_loader(shards, "wds", 4, **kw)
    second = build_loader(shards, "wds", 4, **kw)
    assert keys(first, between=lambda: keys(second)) == alone == list(range(40))
    assert not first.skipped


def test_auto_picks_the_cpu_loader_where_cores_suffice_and_dali_where_they_do_not(tmp_path):
    from loaders import AUTO_CPU_CORES, choose_backend, open_index

    root = make_tiny(tmp_path, n=8)
    tree, shards = open_index(root["tree"]), open_index(root["shards"])
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)  # no CUDA needed to name a device
    assert choose_backend(tree, cpu, 1)[0] == "torch"
    assert choose_backend(shards, cpu, 1)[0] == "wds"
    assert choose_backend(tree, gpu, AUTO_CPU_CORES)[0] == "torch"
    assert choose_backend(shards, gpu, AUTO_CPU_CORES)[0] == "wds"
    few = choose_backend(tree, gpu, AUTO_CPU_CORES - 1)
    assert few[0] == ("dali" if _has_dali() else "torch") and "cores for this rank" in few[1]


def test_auto_builds_the_loader_it_chose_and_says_why(tmp_path):
    root = make_tiny(tmp_path, n=8)
    loader = build_loader(root["tree"], "auto", 4, rank=0, world_size=1, workers=0,
                          device="cpu")  # fmt: skip
    assert type(loader).__name__ == "TorchLoader"
    assert loader.chosen_by == "torch: no GPU to decode on"
    assert sum(len(b[0]) for b in loader) == 8
    with pytest.raises(ValueError, match="the torch backend takes no option 'pace'"):
        build_loader(root["tree"], "auto", 4, rank=0, world_size=1, device="cpu", pace=1)


def _has_dali() -> bool:
    import importlib.util

    return importlib.util.find_spec("nvidia.dali") is not None


@pytest.mark.parametrize(
    ("backend", "options", "match"),
    [
        ("dali", {"pace_lead_ms": -1}, "pace_lead_ms takes milliseconds ≥ 0, not -1"),
        ("dali", {"pace": 1.5}, "pace takes 0 \\(off\\), 1 or more steps"),
        ("dali", {"decode": "tpu"}, "decode takes auto, gpu or cpu, not 'tpu'"),
        ("dali", {"hw_decoder_load": 1.2}, "hw_decoder_load takes a fraction from 0 to 1"),
        ("torch", {"prefetch": 0}, "prefetch takes a whole number ≥ 1, not 0"),
        ("torch", {"prefetch": True}, "prefetch takes a whole number ≥ 1, not True"),
        (
            "wds",
            {"decoder": "gpu"},
            "decoder takes auto, simplejpeg, simplejpeg-fast, pil or opencv, not 'gpu'",
        ),
        ("wds", {"shuffle_buffer": -1}, "shuffle_buffer takes a whole number ≥ 0"),
        ("torch", {"worker_nice": 20}, "worker_nice takes a niceness from 0 to 19, not 20"),
        ("torch", {"reserve_cores": "x"}, "reserve_cores takes a whole number ≥ 0, not 'x'"),
        ("wds", {"reserve_cores": -1}, "reserve_cores takes a whole number ≥ 0, not -1"),
        ("wds", {"normalize": "no"}, "normalize takes true or false, not 'no'"),
        ("dali", {"dont_use_mmap": 2}, "dont_use_mmap takes true or false, not 2"),
        (
            "torch",
            {"multiprocessing_context": "bogus"},
            "multiprocessing_context takes fork, spawn or forkserver, not 'bogus'",
        ),  # fmt: skip
    ],
)
def test_option_values_are_checked_without_building(backend, options, match):
    """check_options refuses a value the backend would refuse, with nothing built or listed (a
    command line checks its --loader-option values with it); good values pass."""
    from loaders import check_options

    with pytest.raises(ValueError, match=match):
        check_options(backend, options)
    good = {"dali": {"pace": True, "pace_lead_ms": 2.5, "decode": "cpu", "hw_decoder_load": 0,
                     "dont_use_mmap": None, "reserve_cores": 0},
            "torch": {"prefetch": 1, "decoder": "pil", "worker_nice": 0, "reserve_cores": 4,
                      "multiprocessing_context": "spawn"},
            "wds": {"shuffle_buffer": 0, "prefetch": 8, "decoder": "simplejpeg-fast",
                    "normalize": False}}  # fmt: skip
    check_options(backend, good[backend])


def test_a_decoder_whose_module_is_missing_is_refused_before_any_decode(monkeypatch):
    """Without its module every decode would fail and every sample be skipped: the option rule
    (command lines) and CpuDecoder (Python callers) refuse it up front, saying what to install."""
    from loaders import check_options, decode

    # the real lookup (importlib's find_spec), on a module no machine has
    monkeypatch.setitem(decode._NEEDS, "opencv", ("feedbench_no_such_module", "some-package"))
    why = "decoder opencv needs some-package .*No module named 'feedbench_no_such_module'"
    with pytest.raises(ValueError, match=why):
        check_options("torch", {"decoder": "opencv"})
    with pytest.raises(ValueError, match=why):
        decode.CpuDecoder(decoder="opencv")
    assert decode.decoder_missing("pil") is None and decode.decoder_missing("simplejpeg") is None
    decode.CpuDecoder(decoder="simplejpeg")  # installed with the loaders


def test_every_name_the_package_lists_loads_from_the_api():
    import loaders
    import loaders.api

    # the package lists the names without importing the API (torch), so the list is written twice
    assert sorted(loaders.__all__) == sorted(loaders.api.__all__)
    for name in loaders.__all__:
        assert getattr(loaders, name) is getattr(loaders.api, name), name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        loaders.nope  # noqa: B018


def test_dealt_paths_are_one_nul_padded_array_of_the_rows_files():
    """DALI's dealt source hands a batch's paths over as one array (issue 29: a third of the
    training thread's time a list of arrays took); each row is its file's path, then NULs."""
    from loaders import open_index
    from loaders.dali_feed import DealtFiles

    index = open_index(str(Path(__file__).parents[2] / "sample_data" / "images"))
    n = len(index)
    dealt = DealtFiles(index.paths, n, 0, 1, 0, 8, n // 8, (0, 0))
    rows = np.array([n - 1, 0, 5, 3])
    got = dealt.paths(rows)
    assert got.dtype == np.uint8 and got.shape[0] == 4
    for row, i in zip(got, rows, strict=True):
        text = row.tobytes()
        assert text.rstrip(b"\0").decode() == index.paths[int(i)]
        assert b"\0" not in text.rstrip(b"\0")
    lengths = [len(r.tobytes().rstrip(b"\0")) for r in got]
    assert max(lengths) == got.shape[1]  # padded to the longest, no further


def test_dealt_batches_made_a_block_at_a_time_are_each_batchs_own():
    """DealtFiles makes its arrays BLOCK batches at a time (issue 29: one call a step on the
    training thread): every batch, across blocks, epochs and a short last batch, is the one made
    from its own rows: paths, keys and labels, and without keys when not asked for."""
    from types import SimpleNamespace

    from loaders import open_index
    from loaders.dali_feed import DealtFiles

    index = open_index(str(Path(__file__).parents[2] / "sample_data" / "images"))
    n, batch = len(index), 5
    batches = -(-n // batch)
    assert n % batch and batches > 4  # a short last batch; blocks of 4 batches: several
    labels = np.arange(n) * 7 % 5
    dealt = DealtFiles(index.paths, n, 0, 1, 0, batch, batches, (1, 2), labels=labels)
    dealt.BLOCK = 4  # several blocks in an epoch of this sample
    bare = DealtFiles(index.paths, n, 0, 1, 0, batch, batches, (1, 2), keys=False)
    for it in [0, 1, 5, 2, *range(3 * batches)]:  # out of order too (a restored checkpoint)
        at = 2 + it
        epoch, b = 1 + at // batches, at % batches
        rows = dealt.order(epoch)[b * batch : (b + 1) * batch]
        rows = np.concatenate([rows, np.full(batch - len(rows), rows[-1])])
        paths, keys, got_labels = dealt(SimpleNamespace(iteration=it))
        assert np.array_equal(keys.reshape(-1), rows)
        assert np.array_equal(got_labels.reshape(-1), labels[rows])
        for row, i in zip(paths, rows, strict=True):
            assert row.tobytes().rstrip(b"\0").decode() == index.paths[int(i)]
        (only,) = bare(SimpleNamespace(iteration=it))
        assert np.array_equal(only[:, : paths.shape[1]], paths[:, : only.shape[1]])


def test_the_fast_simplejpeg_decode_is_close_to_the_exact_one(dataset):
    """simplejpeg-fast (fast IDCT and chroma upsampling): the same crops, pixels a level or two
    apart, not the same decode; a loader built with it yields its batches."""
    from loaders.decode import CpuDecoder

    paths = sorted((dataset / "images").rglob("*.jpg"))[:4]
    for path in paths:  # at 224 the crop decodes at full size (DCT scaling has no fast mode)
        data = path.read_bytes()
        exact, fast = (np.zeros((224, 224, 3), np.uint8) for _ in range(2))
        CpuDecoder(224, False, "simplejpeg").decode_into(data, exact, np.random.default_rng(0))
        CpuDecoder(224, False, "simplejpeg-fast").decode_into(data, fast, np.random.default_rng(0))
        diff = np.abs(exact.astype(int) - fast.astype(int)).mean()
        assert 0 < diff < 4, (path, diff)
    loader = build_loader(str(dataset / "images"), backend="torch", batch_size=4, workers=0,
                          device="cpu", image_size=64, decoder="simplejpeg-fast")  # fmt: skip
    images, labels = next(iter(loader))
    assert images.shape == (4, 3, 64, 64) and len(labels) == 4


@pytest.mark.parametrize("backend", ["torch", "wds", "dali"])
@pytest.mark.parametrize("reserve", [0, 1])
def test_settings_say_where_the_loader_decodes_and_on_which_cores(tmp_path, backend, reserve):
    """``settings()``, which verify records for each run: where the defaults put the decode
    (DALI: and the resize; torch and wds: the decoding library "auto" chose), the workers or
    threads, and the cores they may use, read from the loader itself (here: no GPU, so the
    CPU)."""
    if backend == "dali":
        pytest.importorskip("nvidia.dali", reason="needs NVIDIA DALI (the dali extra)")
    if backend == "wds":
        pytest.importorskip("webdataset", reason="needs webdataset (the wds extra)")
    from loaders.affinity import cpu_list, loader_cores

    tiny = make_tiny(tmp_path, n=16, per_shard=8)
    loader = build_loader(tiny["shards" if backend == "wds" else "tree"], backend, 8,
                          image_size=16, workers=1, reserve_cores=reserve)  # fmt: skip
    cores = loader_cores(reserve, 0, 1)  # None: every core (nothing kept, or too few to keep)
    where = f"on cores {cpu_list(cores)}" if cores else "on every core"
    one = "1 thread" if backend == "dali" else "1 worker"
    resize = ["resize on the CPU"] if backend == "dali" else []
    decode = "decode on the CPU" if backend == "dali" else "decode on the CPU (simplejpeg)"
    assert loader.settings() == ", ".join([decode, *resize, one, where])
    loader.close()
