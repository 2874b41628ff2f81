"""Bad input, every backend: torch and wds skip and count; DALI stops with one line naming the file.

Listing-time problems (a non-image file in a tree, a sample missing its label, a truncated shard)
are skipped and counted the same way by every backend.
"""

from __future__ import annotations

import re
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from loaders import LoaderError, MissingDependencyError, build_loader
from tests.loaders.test_loaders import CLASSES, add_member, make_tiny, tiny_jpeg

N = 40
PER_SHARD = 10


def corrupt(data: bytes) -> bytes:
    d = bytearray(data)
    d[200:400] = b"\xff" * 200  # break the tables and the entropy-coded data
    return bytes(d)


BAD_FILES = {
    "corrupt.jpg": lambda: corrupt(tiny_jpeg(0, 0)),
    "zero.jpg": lambda: b"",
    "text.jpg": lambda: b"this is not an image\n",
}


def damaged_tree(root: Path, bad: list[str]) -> Path:
    tree = make_tiny(root, N, PER_SHARD)["tree"]
    for i, name in enumerate(bad):
        (tree / f"class_{i % CLASSES}" / name).write_bytes(BAD_FILES[name]())
    (tree / "class_2" / "notes.txt").write_text("not an image")
    return tree


def damaged_shards(root: Path, bad: list[str]) -> Path:
    shards = make_tiny(root, N, PER_SHARD)["shards"]
    with tarfile.open(shards / "shard-000.tar", "a") as tar:
        for name in bad:
            add_member(tar, name, BAD_FILES[name]())
            add_member(tar, name.replace(".jpg", ".cls"), b"1")
        add_member(tar, "nolabel.jpg", tiny_jpeg(1, 1))  # a sample missing its label
    last = shards / "shard-003.tar"
    data = last.read_bytes()
    cut = data.rfind(b"00039.jpg")  # truncate inside the last image's data
    last.write_bytes(data[: cut + 512 + 100])
    return shards


def run_epoch(loader) -> tuple[int, set[int]]:
    batches, keys = 0, set()
    for _images, _labels, k in loader:
        batches += 1
        keys |= set(k.tolist())
    return batches, keys


def reasons(loader) -> dict[str, str]:
    return {Path(s.path).name: s.reason for s in loader.skipped}


KW = dict(batch_size=8, image_size=16, device="cpu", return_keys=True, workers=0)


@pytest.mark.parametrize("backend", ["torch", "dali"])
def test_listing_counts_non_image_files_in_a_tree(tmp_path, backend):
    pytest.importorskip("nvidia.dali") if backend == "dali" else None
    loader = build_loader(damaged_tree(tmp_path, []), backend, **KW)
    assert reasons(loader) == {"notes.txt": "not an image file (extension)"}
    batches, keys = run_epoch(loader)
    assert batches == len(loader) and keys == set(range(N))


def test_torch_tree_skips_and_counts_undecodable_files(tmp_path):
    tree = damaged_tree(tmp_path, list(BAD_FILES))
    loader = build_loader(tree, "torch", **KW)
    batches, keys = run_epoch(loader)
    assert batches == len(loader)  # batch counts never change: a bad file shrinks its batch
    bad = {i for i in range(len(loader.index)) if Path(loader.index.describe(i)).name in BAD_FILES}
    assert keys == set(range(len(loader.index))) - bad
    got = reasons(loader)
    assert set(got) == {"notes.txt", *BAD_FILES}
    assert got["zero.jpg"] == "zero-byte file"


@pytest.mark.parametrize("workers", [0, 1])
def test_torch_stops_at_a_batch_of_which_no_file_decodes(tmp_path, workers):
    """A bad file shrinks its batch; a batch with none left would reach training empty (a NaN
    loss, all-reduced into every rank's model): a LoaderError in one line naming one file. An
    undecodable tree (every file text) stops at its first batch."""
    tree = make_tiny(tmp_path, N, PER_SHARD)["tree"]
    for path in tree.rglob("*.jpg"):
        path.write_bytes(BAD_FILES["text.jpg"]())
    loader = build_loader(tree, "torch", **{**KW, "workers": workers})
    with pytest.raises(LoaderError) as caught:
        next(iter(loader))
    line = str(caught.value)
    assert "\n" not in line and "Traceback" not in line, line
    assert line.startswith("rank 0: every sample of a batch failed (8 of 8), e.g. "), line
    assert line.endswith(".jpg: not an image format Pillow can identify (the torch backend "
                         "skips a bad file, not a whole batch)"), line  # fmt: skip
    assert len(loader.skipped) >= 8  # counted too


@pytest.mark.parametrize("backend", ["torch", "wds"])
def test_shards_skip_and_count_every_kind_of_bad_sample(tmp_path, backend):
    shards = damaged_shards(tmp_path, list(BAD_FILES))
    loader = build_loader(shards, backend, **KW)
    listed = {Path(s.path).name.split(":")[-1] for s in loader.index.skipped}
    assert "nolabel.jpg" in listed and any("truncated" in s.reason for s in loader.index.skipped)
    assert len(loader.index) == N - 1 + len(BAD_FILES)  # 00039 is cut off; bad ones are listed
    batches, keys = run_epoch(loader)
    assert batches == len(loader)
    names = {loader.index.describe(i).rsplit(":", 1)[1] for i in keys}
    assert names == {f"{i:05d}.jpg" for i in range(N - 1)}
    decode_skips = {Path(s.path).name.split(":")[-1] for s in loader.skipped} - listed
    assert decode_skips == set(BAD_FILES)


def undecodable_shards(root: Path) -> Path:
    """Shards whose every image is text: listed (names and labels are fine), none decodes."""
    shards = root / "shards"
    shards.mkdir(parents=True)
    for s in range(2):
        with tarfile.open(shards / f"shard-{s}.tar", "w") as tar:
            for i in range(PER_SHARD):
                add_member(tar, f"{s}{i:04d}.jpg", BAD_FILES["text.jpg"]())
                add_member(tar, f"{s}{i:04d}.cls", b"1")
    return shards


@pytest.mark.parametrize("workers", [0, 1])
def test_wds_stops_when_no_sample_decodes_rather_than_replacing_forever(tmp_path, workers):
    """Training replaces an undecodable sample with the next: with none decodable that never
    ended (a worker looping, the run waiting on it). Twice the worker's samples failing in a row
    is a LoaderError in one line, also from a DataLoader worker (re-raised in this process)."""
    loader = build_loader(undecodable_shards(tmp_path), "wds", **{**KW, "workers": workers})
    with pytest.raises(LoaderError) as caught:
        next(iter(loader))
    line = str(caught.value)
    assert "\n" not in line and "Traceback" not in line, line
    held = 2 * PER_SHARD // max(1, workers)
    assert line.startswith(f"{2 * held} samples in a row could not be decoded (this worker's "
                           f"shards hold {held}), e.g. "), line  # fmt: skip
    assert re.search(r"shard-\d\.tar:\d{5}\.jpg: not an image format Pillow can identify$", line)
    if workers:  # the worker's own traceback is kept beside the line
        assert "Traceback" in (caught.value.worker_traceback or "")


class _Raises(torch.utils.data.Dataset):
    def __init__(self, error: Exception) -> None:
        self.error = error

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int):
        raise self.error


@pytest.mark.parametrize(
    "error",
    [LoaderError("shard-3.tar: cut off"), MissingDependencyError("simplejpeg", "torch")],
    ids=["LoaderError", "MissingDependencyError"],
)
def test_our_errors_keep_their_type_and_line_from_a_dataloader_worker(error):
    """DataLoader re-raises a worker's exception as ``type(message=TRACEBACK)`` for types with
    a ``message``: ours come back as themselves, their one line intact (a MissingDependencyError
    used to become a TypeError there), the worker's traceback kept beside it."""
    loader = torch.utils.data.DataLoader(_Raises(error), num_workers=1)
    with pytest.raises(type(error)) as caught:
        next(iter(loader))
    assert str(caught.value) == str(error)
    assert "Traceback" in (caught.value.worker_traceback or "")


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_dali_stops_with_one_line_naming_the_file_in_a_tree(tmp_path, name):
    pytest.importorskip("nvidia.dali")
    loader = build_loader(damaged_tree(tmp_path, [name]), "dali", **KW)
    with pytest.raises(LoaderError) as err:
        run_epoch(loader)
    message = str(err.value)
    assert "\n" not in message and f"class_0/{name}" in message, message


def test_dali_shards_skip_listing_problems_and_stop_on_a_corrupt_member(tmp_path):
    pytest.importorskip("nvidia.dali")
    good = build_loader(damaged_shards(tmp_path / "a", []), "dali", **KW)
    batches, keys = run_epoch(good)
    assert batches == len(good) and len(keys) == N - 1
    assert len(good.skipped) == 2  # no label, truncated
    bad = build_loader(damaged_shards(tmp_path / "b", ["corrupt.jpg"]), "dali", **KW)
    with pytest.raises(LoaderError) as err:
        run_epoch(bad)
    assert "\n" not in str(err.value) and "shard-000.tar:corrupt.jpg" in str(err.value)


def test_too_few_shards_for_ranks_times_workers_is_a_clear_error(tmp_path):
    shards = make_tiny(tmp_path, 30, 10)["shards"]  # 3 shards
    with pytest.raises(LoaderError, match=r"3 shards cannot feed 2 ranks × 2 workers"):
        build_loader(shards, "wds", 4, rank=0, world_size=2, workers=2, device="cpu")
    with pytest.raises(LoaderError, match="wds backend reads WebDataset shards"):
        build_loader(tmp_path / "tree", "wds", 4, workers=0, device="cpu")


def test_missing_dali_says_what_to_install(tmp_path, monkeypatch):
    tree = make_tiny(tmp_path, 10, 10)["tree"]
    for mod in [m for m in sys.modules if m.startswith("nvidia.dali")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    with pytest.raises(ImportError, match=r"pip install 'feedbench\[dali\]'") as err:
        build_loader(tree, "dali", 4, device="cpu")
    assert isinstance(err.value, MissingDependencyError)


def test_bad_arguments(tmp_path):
    tree = make_tiny(tmp_path, 10, 10)["tree"]
    with pytest.raises(ValueError, match="unknown backend"):
        build_loader(tree, "ffcv", 4)
    with pytest.raises(LoaderError, match="no such file"):
        build_loader(tmp_path / "nope", "torch", 4)
    with pytest.raises(ValueError, match="unsupported dtype"):
        build_loader(tree, "torch", 4, dtype="int8")
