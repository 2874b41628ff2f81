import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from feedbench.core.errors import FeedbenchError
from feedbench.sample import MANIFEST, SampleSpec, class_rgb, make_sample, nearest_class


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_same_seed_is_byte_identical_whatever_the_jobs(tmp_path):
    spec = SampleSpec(images=10, seed=3, classes=3, per_shard=4)
    make_sample(tmp_path / "a", spec, jobs=1)
    make_sample(tmp_path / "b", spec, jobs=2)
    make_sample(tmp_path / "c", SampleSpec(images=10, seed=4, classes=3, per_shard=4), jobs=1)
    a, b, c = (_digest(tmp_path / x) for x in "abc")
    assert a == b
    assert len(a) == 10 + 3 + 1  # images, shards (4+4+2), manifest
    assert not {v for k, v in a.items() if k.endswith(".jpg")} & {
        v for k, v in c.items() if k.endswith(".jpg")
    }


def test_layout_tree_and_shards(dataset):
    images = sorted(dataset.glob("images/class_*/*.jpg"))
    assert len(images) == 24
    assert sorted(p.name for p in dataset.glob("images/*")) == [f"class_{c:03d}" for c in range(4)]
    shards = sorted(dataset.glob("shards/*.tar"))
    assert [p.name for p in shards] == [f"shard-{i:05d}.tar" for i in range(4)]
    with tarfile.open(shards[1]) as tar:
        names = tar.getnames()
        assert names[:2] == ["000006.jpg", "000006.cls"]
        assert len(names) == 12
        label = int(tar.extractfile("000006.cls").read())
        jpeg = tar.extractfile("000006.jpg").read()
    tree_copy = dataset / "images" / f"class_{label:03d}" / "000006.jpg"
    assert tree_copy.read_bytes() == jpeg
    manifest = json.loads((dataset / MANIFEST).read_text())
    assert manifest["spec"]["seed"] == 7
    assert manifest["summary"]["shards"] == 4


@pytest.mark.parametrize(("tree", "shards"), [("tree", "shards"), ("jpeg", "wds")])
def test_format_choice(tmp_path, tree, shards):  # jpeg and wds: the names before 0.2
    make_sample(tmp_path / "j", SampleSpec(images=3, classes=3, fmt=tree), jobs=1)
    make_sample(tmp_path / "w", SampleSpec(images=3, classes=3, fmt=shards), jobs=1)
    assert (tmp_path / "j/images").is_dir() and not (tmp_path / "j/shards").exists()
    assert (tmp_path / "w/shards").is_dir() and not (tmp_path / "w/images").exists()


def test_sizes_and_texture_resemble_imagenet(tmp_path):
    s = make_sample(tmp_path / "s", SampleSpec(images=40, seed=11, fmt="jpeg"), jobs=2)
    assert s.min_side_px >= 300 and s.max_side_px <= 600
    assert 75_000 <= s.mean_jpeg_bytes <= 125_000, s.mean_jpeg_bytes
    orientations = set()
    for p in sorted((tmp_path / "s/images").rglob("*.jpg"))[:12]:
        with Image.open(p) as im:
            assert im.format == "JPEG" and im.mode == "RGB"
            px = np.asarray(im, dtype=np.float32)
        orientations.add(px.shape[1] > px.shape[0])
        # photographic-like: local detail everywhere, not flat colour
        assert px.std() > 15
        assert np.abs(np.diff(px, axis=1)).mean() > 4
    assert orientations == {True, False}


def test_class_tint_survives_decoding(dataset):
    for p in sorted(dataset.glob("images/class_*/*.jpg")):
        label = int(p.parent.name.split("_")[1])
        with Image.open(p) as im:
            mean = np.asarray(im, dtype=np.float64).reshape(-1, 3).mean(axis=0)
        assert nearest_class(mean, 4) == label
    assert nearest_class(class_rgb(2, 5), 5) == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"images": 0}, "--images must be at least 1"),
        ({"images": 2, "fmt": "png"}, "unknown format"),
        ({"images": 2, "quality": 0}, "--quality"),
        ({"images": 5, "classes": 10}, "--images 5 cannot fill --classes 10"),
        ({"images": 5, "classes": 5, "jobs": 0}, "--jobs must be at least 1"),
    ],
)
def test_bad_spec(tmp_path, kwargs, message):
    jobs = kwargs.pop("jobs", 1)
    with pytest.raises(FeedbenchError, match=message):
        make_sample(tmp_path / "x", SampleSpec(**kwargs), jobs=jobs)
    assert not (tmp_path / "x").exists()


def test_a_place_it_cannot_write_is_one_line(cli, tmp_path):
    r = cli("sample", "/proc/self/feedbench-sample", "--images", "2", "--classes", "2")
    assert r.code == 2 and r.err.startswith("error: cannot write the sample to /proc/self/")
    assert "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a mode-0555 folder")
def test_a_read_only_folder_is_one_line(cli, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    r = cli("sample", str(locked), "--images", "2", "--classes", "2")
    assert r.code == 2 and r.err.startswith(f"error: cannot write the sample to {locked}")


def test_refuses_non_empty_directory(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(FeedbenchError, match="not empty"):
        make_sample(tmp_path, SampleSpec(images=2, classes=2), jobs=1)
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_cli_sample(cli, tmp_path):
    r = cli("sample", str(tmp_path / "o"), "-n", "5", "--classes", "5", "--format", "shards",
            "--jobs", "1")  # fmt: skip
    assert r.code == 0, r.err
    assert "5 images" in r.out
    data = (tmp_path / "o/shards/shard-00000.tar").read_bytes()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert "000000.cls" in tar.getnames()
