import hashlib
import io
import json
import os
import re
import resource
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from feedbench.core.errors import FeedbenchError
from feedbench.sample import MANIFEST, SampleSpec, class_rgb, make_sample, nearest_class
from tests.conftest import ROOT


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_same_seed_is_byte_identical_whatever_the_jobs(tmp_path):
    spec = SampleSpec(images=10, seed=3, classes=3, per_shard=4, pool=3)
    make_sample(tmp_path / "a", spec, jobs=1)
    make_sample(tmp_path / "b", spec, jobs=2)
    make_sample(tmp_path / "c", SampleSpec(images=10, seed=4, classes=3, per_shard=4), jobs=1)
    a, b, c = (_digest(tmp_path / x) for x in "abc")
    assert a == b
    assert len(a) == 10 + 3 + 1  # images, shards (4+4+2), manifest
    assert not {v for k, v in a.items() if k.endswith(".jpg")} & {
        v for k, v in c.items() if k.endswith(".jpg")
    }


def _blocks(data: bytes, size: int = 4096) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data) - size + 1, size)]


def _members(shard: Path) -> dict[str, bytes]:
    with tarfile.open(shard) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.name.endswith(".jpg")}


@pytest.fixture(scope="module")
def copies(tmp_path_factory) -> Path:
    """48 images made from a pool of 4 (12 copies of each): the path every large dataset takes."""
    out = tmp_path_factory.mktemp("copies") / "s"
    make_sample(out, SampleSpec(images=48, seed=5, classes=2, per_shard=12, pool=4), jobs=1)
    return out


def test_copies_differ_in_every_4k_block(copies):
    """Every file is unique, and no 4 KiB-aligned block repeats among the tree's files nor among
    the shards' (what block-level deduplication would find); tar's zero padding aside."""
    tree = {p.name: p.read_bytes() for p in copies.glob("images/class_*/*.jpg")}
    assert len(tree) == 48 and len(set(tree.values())) == 48
    blocks = [b for data in tree.values() for b in _blocks(data)]
    assert len(blocks) > 48 * 15 and len(set(blocks)) == len(blocks)
    shards = sorted(copies.glob("shards/*.tar"))
    members = {k: v for s in shards for k, v in _members(s).items()}
    assert members == tree  # the shards hold the same images
    zero = bytes(4096)
    blocks = [b for s in shards for b in _blocks(s.read_bytes()) if b != zero]
    assert len(set(blocks)) == len(blocks)
    # 12 copies of each of 4 encodings: same length, same shape, different bytes
    assert len({len(v) for v in tree.values()}) == 4


def test_every_copy_decodes_to_its_pool_image(copies):
    by_size: dict[int, list[np.ndarray]] = {}
    for p in sorted(copies.glob("images/class_*/*.jpg")):
        with Image.open(p) as im:
            im.load()
            assert im.format == "JPEG" and im.mode == "RGB"
            px = np.asarray(im, dtype=np.float32)
        assert nearest_class(px.reshape(-1, 3).mean(axis=0), 2) == int(p.parent.name[-3:])
        by_size.setdefault(p.stat().st_size, []).append(px)
    for pixels in by_size.values():
        assert len({x.shape for x in pixels}) == 1
        # one coefficient bit in every ~16 bytes changed: pixels close, never identical
        assert 0.2 < np.abs(pixels[0] - pixels[1]).mean() < 4.0


def test_shards_are_what_tarfile_writes():
    """Members are written in one piece from a header template: byte for byte tarfile's."""
    from feedbench.sample import _tar_end, _tar_member

    members = [(f"{i * 7919:06d}.{ext}", bytes([i]) * (i * 97)) for i in range(40)
               for ext in ("jpg", "cls")]  # fmt: skip
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode, info.uname, info.gname = len(data), 0, 0o644, "", ""
            tar.addfile(info, io.BytesIO(data))
    ours = b"".join(_tar_member(name, data) for name, data in members)
    assert ours + _tar_end(len(ours)) == buf.getvalue()


def test_parts_make_the_single_run(tmp_path):
    spec = SampleSpec(images=30, seed=2, classes=3, per_shard=4, pool=3)
    make_sample(tmp_path / "one", spec, jobs=1)
    for k in range(3):  # three hosts sharing one folder, and three folders merged
        make_sample(tmp_path / "shared", spec, jobs=2, part=(k, 3))
        make_sample(tmp_path / f"host{k}", spec, jobs=1, part=(k, 3))
    one = _digest(tmp_path / "one")
    assert _digest(tmp_path / "shared") == one
    hosts = [_digest(tmp_path / f"host{k}") for k in range(3)]
    merged = {k: v for h in hosts for k, v in h.items()}
    assert merged == one
    assert sum(len(h) for h in hosts) == len(one)  # no file written twice
    assert MANIFEST in hosts[0] and MANIFEST not in hosts[1]


def test_cli_part_from_torchrun_env(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    r = cli("sample", str(tmp_path / "o"), "-n", "8", "--classes", "2", "--per-shard", "2",
            "--pool", "2", "--jobs", "1")  # fmt: skip
    assert r.code == 0, r.err
    assert r.out.startswith("part 1/2 of 8 images")
    assert sorted(p.name for p in (tmp_path / "o/shards").iterdir()) == [
        "shard-00002.tar",
        "shard-00003.tar",
    ]
    r = cli("sample", str(tmp_path / "p"), "-n", "8", "--classes", "2", "--part", "2/2")
    assert r.code == 2 and "--part 2/2: give K/M with 0 <= K < M" in r.err


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


@pytest.mark.parametrize("workload", ["unet3d", "cosmoflow"])
def test_workload_files_differ_in_every_4k_block(tmp_path, workload):
    """Payloads are windows of one random pool, stamped every 2 KiB: no block repeats even
    where two samples' windows overlap."""
    from feedbench.sample_workload import make_workload, payload

    make_workload(tmp_path / "w", workload, 0.004, seed=4)
    files = sorted((tmp_path / "w/data").iterdir())
    blocks = [b for p in files for b in _blocks(p.read_bytes())]
    assert len(blocks) > 500 and len(set(blocks)) == len(blocks)
    a, b = payload(4, 7, 300_000), payload(4, 7, 300_000)
    assert bytes(a) == bytes(b) and bytes(payload(4, 1, 300_000)) != bytes(a)
    stamps = a[: 300_000 // 2048 * 2048].reshape(-1, 2048)[:, :8].copy().view("<u8").ravel()
    assert stamps.tolist() == [(7 << 24) | k for k in range(300_000 // 2048)]


@pytest.mark.parametrize("workload", ["unet3d", "cosmoflow"])
def test_workload_files_are_the_same_whatever_the_jobs(tmp_path, workload):
    from feedbench.sample_workload import make_workload

    one = make_workload(tmp_path / "one", workload, 0.003, seed=2, jobs=1)
    two = make_workload(tmp_path / "two", workload, 0.003, seed=2, jobs=2)
    assert one.files == two.files > 1
    names = sorted(p.name for p in (tmp_path / "one/data").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "two/data").iterdir())
    for name in names:
        assert (tmp_path / "one/data" / name).read_bytes() == (
            tmp_path / "two/data" / name
        ).read_bytes()


def test_a_unit_failing_in_a_worker_is_one_line(tmp_path):
    (tmp_path / "shards/shard-00001.tar").mkdir(parents=True)  # parts may share a folder
    spec = SampleSpec(images=40, classes=2, per_shard=5, pool=2)
    with pytest.raises(FeedbenchError, match=r"cannot write the sample to .*shard-00001\.tar: "):
        make_sample(tmp_path, spec, jobs=2, part=(0, 2))


LIMIT = 64 << 10  # bytes a file of the child may grow to


def _small_files() -> None:
    """In the child (and its writer processes): files may not grow past :data:`LIMIT`, so a
    write past it fails for real, as on a full disk (EFBIG, "File too large": Python ignores
    SIGXFSZ), without filling the machine's disk or needing root to mount a small one."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, resource.RLIM_INFINITY))


NPZ, TFRECORD = r"data/unet3d-\d{6}-of-\d{6}\.npz", r"data/cosmoflow-\d{6}-of-\d{6}\.tfrecord"
SHARD, JPEG = r"shards/shard-\d{5}\.tar", r"images/class_\d{3}/\d{6}\.jpg"


@pytest.mark.parametrize(
    "args, written",
    [
        (["--workload", "unet3d", "--size", "0.004", "--jobs", "2"], NPZ),
        (["--workload", "unet3d", "--size", "0.004", "--jobs", "1"], NPZ),
        (["--workload", "cosmoflow", "--size", "0.004", "--jobs", "2"], TFRECORD),
        (["-n", "40", "--classes", "2", "--format", "shards", "--jobs", "2"], SHARD),
        (["-n", "40", "--classes", "2", "--format", "tree", "--jobs", "2"], JPEG),
        (["-n", "40", "--classes", "2", "--format", "tree", "--jobs", "1"], JPEG),
        (["-n", "400", "--classes", "2", "--format", "tree", "--jobs", "1"], JPEG),  # a bar
    ],
    ids=["npz", "npz-jobs-1", "tfrecord", "shards", "tree", "tree-jobs-1", "tree-400"],
)
def test_a_write_failing_in_a_writer_process_names_its_file(tmp_path, args, written):
    """A write that fails (a full disk) in a writer process (``--jobs 2``) or in the only one:
    one error line naming the file that could not be written, not the output folder, and
    nothing else; exit 2, no traceback."""
    out = tmp_path / "o"
    done = subprocess.run(
        [sys.executable, "-m", "feedbench", "sample", str(out), *args],
        capture_output=True, text=True, timeout=120, preexec_fn=_small_files,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    # the error line alone: no empty line before it (a progress bar's end, in a log)
    (line,) = done.stderr.splitlines()
    where = rf"({re.escape(str(out))}/{written})"
    said = re.fullmatch(rf"error: cannot write (?:the sample )?to {where}: File too large", line)
    assert said, line
    assert Path(said[1]).stat().st_size == LIMIT  # the file named is the one that hit it
