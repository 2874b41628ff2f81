"""The torch backend's decode on the device (loaders.gpu_decode), checked on the CPU.

On the CPU, torchvision's decode_jpeg and roi_align run the same code path as on a GPU but for
nvJPEG itself: the workers' bytes and crops, the grouping, the crop and flip, the fallbacks and
the skips. tests/loaders/test_loaders_gpu.py runs the loader with nvJPEG on a real GPU.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from loaders.decode import CpuDecoder, DecodeError
from loaders.gpu_decode import EncodedBatchMaker, GpuJpegDecoder, decode_where, size_groups
from tests.loaders.test_loaders import label_mismatches, make_tiny

CPU = torch.device("cpu")


def _new(shape):
    return torch.empty(shape, dtype=torch.uint8)


def _jpeg(seed: int, w: int = 90, h: int = 70, mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 255, (h // 10 + 1, w // 10 + 1, 3), dtype=np.uint8)
    pixels = np.kron(base, np.ones((10, 10, 1), np.uint8))[:h, :w]  # blocks: resizes compare
    im = Image.fromarray(pixels)
    buf = io.BytesIO()
    (im.convert(mode) if mode != "RGB" else im).save(buf, "JPEG", quality=95)
    return buf.getvalue()


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((40, 50, 3), seed * 20 % 255, np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _cpu_decoded(samples: list[bytes], train: bool, seed: int, size: int = 32) -> np.ndarray:
    cpu = CpuDecoder(size, train)
    # a full decode, as nvJPEG's: DCT-scaled decodes of these sharp blocks differ by up to 13
    cpu.dct_scaling = False
    rng = np.random.default_rng(seed)
    out = np.empty((len(samples), size, size, 3), np.uint8)
    for i, data in enumerate(samples):
        cpu.decode_into(data, out[i], rng)
    return out


def _gpu_decoded(samples: list[bytes], train: bool, seed: int, size: int = 32):
    cpu = CpuDecoder(size, train)
    maker = EncodedBatchMaker(cpu)
    rng = np.random.default_rng(seed)
    for data in samples:
        maker.add(data, rng)
    batch = maker.batch(_new)
    return batch, GpuJpegDecoder(cpu, CPU)(batch)


@pytest.mark.parametrize("train", [True, False])
def test_the_same_crops_and_flips_as_the_cpu_decode(train):
    samples = [_jpeg(i, 60 + 13 * i, 50 + 7 * (i % 5)) for i in range(24)]
    _, (images, failed, _) = _gpu_decoded(samples, train, seed=3)
    want = _cpu_decoded(samples, train, seed=3)
    assert failed == [] and images.shape == want.shape and images.dtype == torch.uint8
    diff = np.abs(images.numpy().astype(np.int16) - want).mean(axis=(1, 2, 3))
    # the same box and flip: only the two resizes differ (a wrong flip or box is ~40 apart)
    assert diff.max() < 5, diff


def test_what_nvjpeg_does_not_take_is_decoded_by_the_worker():
    samples = [_jpeg(0), _png(1), _jpeg(2, mode="CMYK"), _jpeg(3, mode="L"), _jpeg(4)]
    batch, (images, failed, _) = _gpu_decoded(samples, train=True, seed=0)
    assert batch.jpeg_at.tolist() == [0, 3, 4] and batch.ready_at.tolist() == [1, 2]
    want = _cpu_decoded(samples, True, seed=0)
    assert failed == []
    # the worker decoded the PNG and the CMYK JPEG exactly as the CPU path does
    assert torch.equal(images[1], torch.from_numpy(want[1]))
    assert torch.equal(images[2], torch.from_numpy(want[2]))
    assert np.abs(images.numpy().astype(np.int16) - want).mean() < 5


def test_a_bad_header_is_skipped_by_the_worker_and_a_bad_body_by_the_decoder():
    good = _jpeg(0)
    sos = good.find(b"\xff\xda")
    maker = EncodedBatchMaker(CpuDecoder(32, True))
    rng = np.random.default_rng(0)
    with pytest.raises(DecodeError):
        maker.add(b"", rng)
    with pytest.raises(DecodeError):
        maker.add(b"\xff\xd8\xff" + b"\x00" * 20, rng)  # JPEG magic, no header
    for data in (good, good[: sos + 40], good):  # the middle one ends inside its scan
        maker.add(data, rng)
    batch = maker.batch(_new)
    images, failed, why = GpuJpegDecoder(CpuDecoder(32, True), CPU)(batch)
    assert failed == [1] and len(images) == 2
    assert "JPEG" in why[0]  # the CPU library's own words, as the CPU path would give


def test_groups_bound_the_padded_canvas():
    heights = np.array([375, 500, 3000, 375, 333, 2000, 500])
    widths = np.array([500, 375, 4000, 500, 500, 3000, 333])
    groups = size_groups(heights, widths)
    assert sorted(i for g in groups for i in g) == list(range(7))
    big = next(g for g in groups if 2 in g)
    assert 0 not in big and 1 not in big  # the 12-megapixel image pads none of the small ones


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4000), st.integers(1, 4000)), min_size=1, max_size=80))
def test_every_image_in_one_group_and_each_canvas_within_the_waste(sizes):
    heights = np.array([h for h, _ in sizes])
    widths = np.array([w for _, w in sizes])
    groups = size_groups(heights, widths, waste=2.0)
    assert sorted(i for g in groups for i in g) == list(range(len(sizes)))
    for g in groups:
        canvas = heights[g].max() * widths[g].max() * len(g)
        assert len(g) == 1 or canvas <= 2.0 * (heights[g] * widths[g]).sum()


def test_auto_decodes_on_the_cpu_and_gpu_needs_cuda():
    gpu = torch.device("cuda", 0)
    assert decode_where("auto", gpu) == "cpu"  # measured faster at 256 on 16 cores (run 14)
    assert decode_where("gpu", gpu) == "gpu"
    assert decode_where("auto", CPU) == "cpu"
    with pytest.raises(ValueError, match="needs a CUDA device"):
        decode_where("gpu", CPU)


@pytest.fixture(scope="module")
def tiny_tree(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("gpudec"), n=90, per_shard=30)["tree"]


def test_the_torch_loader_with_workers_sending_bytes(tiny_tree, tmp_path, monkeypatch):
    """The whole torch loader in decode="gpu" mode, its decode on the CPU: real workers send
    EncodedBatches through shared memory, the prefetcher decodes them, a corrupt file is skipped
    and counted, every other sample arrives once with its label."""
    import loaders.torch_backend
    from loaders import build_loader

    bad = next(iter(sorted(tiny_tree.rglob("*.jpg"))))
    data = bad.read_bytes()
    bad.write_bytes(data[: data.find(b"\xff\xda") + 30])  # header intact, scan cut short
    monkeypatch.setattr(loaders.torch_backend, "decode_where", lambda *a: "gpu")
    loader = build_loader(tiny_tree, "torch", 16, image_size=32, workers=2, return_keys=True)
    assert loader.decode == "gpu" and loader.slots is None
    seen = []
    for images, labels, keys in loader:
        assert images.shape[1:] == (3, 32, 32) and images.dtype == torch.float32
        assert len(images) == len(labels) == len(keys)
        assert label_mismatches(images, labels) == 0
        seen += keys.tolist()
    loader.close()
    assert len(seen) == 89 and len(set(seen)) == 89
    assert len(loader.skipped) == 1 and bad.name in loader.skipped[0].path


def _cut_scan(data: bytes) -> bytes:
    return data[: data.find(b"\xff\xda") + 30]  # header intact, scan cut short


def _trees_and_shards_with_cut_scans(root: Path, backend: str) -> Path:
    """make_tiny's tree or shards, every JPEG's scan cut short: the worker reads each header,
    and every decode fails after it."""
    made = make_tiny(root, n=32, per_shard=16)
    if backend == "torch":
        for path in made["tree"].rglob("*.jpg"):
            path.write_bytes(_cut_scan(path.read_bytes()))
        return made["tree"]
    for shard in made["shards"].glob("*.tar"):
        with tarfile.open(shard) as tar:
            members = [(m, tar.extractfile(m).read()) for m in tar.getmembers() if m.isfile()]
        with tarfile.open(shard, "w") as tar:
            for m, data in members:
                data = _cut_scan(data) if m.name.endswith(".jpg") else data
                m.size = len(data)
                tar.addfile(m, io.BytesIO(data))
    return made["shards"]


@pytest.mark.parametrize("backend", ["torch", "wds"])
def test_a_batch_the_decoder_leaves_empty_stops_the_loader(tmp_path, monkeypatch, backend):
    """decode="gpu": files whose headers read but whose data does not decode fail in the
    decoder, after the worker; a full batch of them would reach training empty: a LoaderError
    naming one, as on the CPU path."""
    import loaders.torch_backend
    import loaders.wds_backend
    from loaders import LoaderError, build_loader

    source = _trees_and_shards_with_cut_scans(tmp_path, backend)
    monkeypatch.setattr(loaders.torch_backend, "decode_where", lambda *a: "gpu")
    monkeypatch.setattr(loaders.wds_backend, "decode_where", lambda *a: "gpu")
    loader = build_loader(source, backend, 16, image_size=32, workers=1)
    assert loader.decode == "gpu"
    with pytest.raises(LoaderError) as caught:
        next(iter(loader))
    loader.close()
    line = str(caught.value)
    assert line.startswith("rank 0: every sample of a batch failed (16 of 16), e.g. "), line
    assert line.endswith(f"(the {backend} backend skips a bad file, not a whole batch)"), line


def test_slices_and_joins_of_a_batch_decode_as_the_whole():
    """The wds backend re-batches workers' chunks: any cut and re-join of an EncodedBatch
    decodes to the same pixels as the batch it came from."""
    samples = [_jpeg(i, 50 + 9 * i, 60) if i % 3 else _png(i) for i in range(12)]
    batch, (whole, _, _) = _gpu_decoded(samples, train=True, seed=1)
    decode = GpuJpegDecoder(CpuDecoder(32, True), CPU)
    for cuts in ([0, 12], [0, 5, 12], [0, 1, 2, 7, 11, 12], [0, 3, 3, 12]):
        parts = [batch[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]
        assert [len(p) for p in parts] == np.diff(cuts).tolist()
        joined, failed, _ = decode(type(batch).cat(parts))
        assert failed == [] and torch.equal(joined, whole)
    assert len(batch[4:4]) == 0


def test_the_wds_loader_with_workers_sending_bytes(tmp_path, monkeypatch):
    """The wds loader in decode="gpu" mode, its decode on the CPU: chunks re-batched as bytes,
    each sample once with its label, and a resumed epoch yields the uninterrupted batches."""
    import loaders.wds_backend
    from loaders import build_loader

    shards = make_tiny(tmp_path, n=90, per_shard=15)["shards"]
    monkeypatch.setattr(loaders.wds_backend, "decode_where", lambda *a: "gpu")
    kw = dict(image_size=32, workers=2, return_keys=True, seed=3)
    loader = build_loader(shards, "wds", 16, **kw)
    assert loader.decode == "gpu" and loader.slots is None
    loader.set_epoch(1)
    batches = []
    for images, labels, keys in loader:
        assert label_mismatches(images, labels) == 0 and len(images) == len(keys)
        batches.append((keys.clone(), images.clone()))
        if len(batches) == 2:
            state = loader.state_dict()
    loader.close()
    assert sorted(k for b, _ in batches for k in b.tolist()) == list(range(90))
    resumed = build_loader(shards, "wds", 16, **kw)
    resumed.load_state_dict(state)
    rest = [(k.clone(), im.clone()) for im, _, k in resumed]
    resumed.close()
    assert len(rest) == len(batches) - 2
    for (k, im), (k2, im2) in zip(batches[2:], rest, strict=True):
        assert torch.equal(k, k2) and torch.equal(im, im2)


def test_bytes_no_decoder_knows_are_named_in_words_not_by_a_buffer_address():
    """Pillow's own text names an in-memory buffer ("<_io.BytesIO object at 0x…>"), which
    would reach the user's one-line error next to the file's path."""
    rng = np.random.default_rng(0)
    with pytest.raises(DecodeError) as caught:
        CpuDecoder(8, False).decode_into(rng.bytes(4096), np.empty((8, 8, 3), np.uint8), rng)
    assert str(caught.value) == "not an image format Pillow can identify"
