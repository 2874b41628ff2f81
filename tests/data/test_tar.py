import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from feedbench.core.errors import FeedbenchError
from feedbench.scan.sources import Source, detect
from loaders.data import FileReader, Layout
from loaders.data.readers import Buffers
from loaders.data.tar import header_sum


def ShardSource(root, paths, sizes):  # noqa: N802 - a source of the given shards
    return Source(Layout("shards", root, list(paths), list(sizes)))


def test_detects_tree_and_labels_from_class_folders(dataset):
    source, notes = detect(str(dataset / "images"))
    assert source.kind == "tree" and notes == []
    assert source.units() == 24 and source.samples_hint() == 24
    assert source.classes == [f"class_{c:03d}" for c in range(4)]
    for i in range(source.units()):
        path = str(source.files()[i])
        assert source.label(i) == int(os.path.basename(os.path.dirname(path)).split("_")[1])


def test_sample_root_prefers_images_and_says_so(dataset):
    source, notes = detect(str(dataset))
    assert source.kind == "tree"
    assert "format 'shards'" in notes[0]
    # labels still come from class folders, although PATH is one level up
    assert source.classes == [f"class_{c:03d}" for c in range(4)]
    shards, _ = detect(str(dataset), "shards")
    assert shards.kind == "shards" and shards.units() == 4


@pytest.mark.parametrize(
    "spec",
    ["shards", "shards/shard-{00000..00003}.tar", "shards/*.tar", "shards/shard-00002.tar"],
)
def test_detects_shards_by_dir_pattern_and_file(dataset, spec):
    source, _ = detect(str(dataset / spec))
    assert source.kind == "shards"
    assert source.units() == (1 if spec.endswith("00002.tar") else 4)


def test_shard_samples_carry_labels(dataset):
    source, _ = detect(str(dataset / "shards"))
    samples = list(source.iter_samples(range(source.units())))
    assert len(samples) == 24 and all(s.error is None for s in samples)
    tree, _ = detect(str(dataset / "images"))
    by_name = {os.path.basename(str(p))[:-4]: tree.label(i) for i, p in enumerate(tree.files())}
    for s in samples:
        assert s.label == by_name[s.key.rsplit(":", 1)[1]]
    # every byte of every shard is accounted to some sample
    assert sum(s.read_bytes for s in samples) == source.total_bytes()


def test_bad_paths(tmp_path):
    with pytest.raises(FeedbenchError, match="no such file or directory"):
        detect(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FeedbenchError, match="is empty"):
        detect(str(tmp_path / "empty"))
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "readme.txt").write_text("hi")
    with pytest.raises(FeedbenchError, match=r"no images .* \(1 other files, e.g. readme.txt\)"):
        detect(str(tmp_path / "docs"))
    with pytest.raises(FeedbenchError, match="is a file"):
        detect(str(tmp_path / "docs" / "readme.txt"))
    with pytest.raises(FeedbenchError, match="shard not found"):
        detect(str(tmp_path / "x-{0..3}.tar"))
    with pytest.raises(FeedbenchError, match="unsupported URL scheme gs://"):
        detect("gs://bucket/data")  # s3:// and http(s):// are read: tests/test_remote.py


def test_format_mismatch(dataset, tmp_path):
    only_images = tmp_path / "imgs"
    shutil.copytree(dataset / "images", only_images)
    with pytest.raises(FeedbenchError, match="no .tar shards"):
        detect(str(only_images), "shards")
    with pytest.raises(FeedbenchError, match="unknown format"):
        detect(str(only_images), "zip")


def test_truncated_shard_yields_good_samples_then_one_error(dataset_copy):
    shard = dataset_copy / "shards" / "shard-00001.tar"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    source, _ = detect(str(dataset_copy / "shards"))
    samples = list(source.iter_samples([1]))
    good = [s for s in samples if s.error is None]
    bad = [s for s in samples if s.error is not None]
    assert 1 <= len(good) < 6
    assert len(bad) == 1 and "truncated" in bad[0].error
    assert bad[0].key.endswith("shard-00001.tar")
    assert re.search(r"truncated member \d+\.jpg\)$", bad[0].error), bad[0].error  # as text


@pytest.mark.parametrize("fmt", ["ustar", "gnu", "pax"])
def test_tar_walker_matches_tarfile(tmp_path, fmt):
    """The header walker reads what tarfile writes: long names, pax records, dirs, empty files."""
    import io
    import tarfile

    formats = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
    long_dir = "d" * 60 + "/" + "e" * 60  # > 100 characters: prefix (ustar) or long name records
    members = [
        ("a.jpg", os.urandom(3000)),
        ("a.cls", b"3"),
        (f"{long_dir}/b.jpg", os.urandom(1_500_000)),  # spans buffer refills
        (f"{long_dir}/b.cls", b"5"),
        ("empty.txt", b""),
        (("ü" * 40 if fmt == "pax" else "c") + ".jpg", os.urandom(10)),
    ]
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w", format=formats[fmt]) as tar:
        d = tarfile.TarInfo("somedir")
        d.type = tarfile.DIRTYPE
        tar.addfile(d)
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    src = ShardSource(str(tmp_path), [str(path)], [path.stat().st_size])
    for views in (False, True):  # views: each sample's bytes checked before the next is asked
        images = {}
        total = 0
        for x in src.iter_samples([0], views=views):
            total += x.read_bytes
            if x.data is not None:
                images[x.key.split(":", 1)[1]] = bytes(x.data)
        # labelled samples: their image bytes as tarfile wrote them (b spans 1 MiB refills
        # and has a long or prefixed name)
        assert images == {"a": members[0][1], f"{long_dir}/b": members[2][1]}
        assert total == path.stat().st_size  # every byte of the file, end padding too
    samples = list(src.iter_samples([0]))
    by_key = {x.key.split(":", 1)[1]: x for x in samples}
    assert by_key["a"].data == members[0][1] and by_key["a"].label == 3 and not by_key["a"].error
    assert by_key[f"{long_dir}/b"].label == 5 and not by_key[f"{long_dir}/b"].error
    # reported under its full name (non-ASCII for pax)
    assert by_key[members[5][0][:-4]].error == "missing or bad label (.cls)"
    assert by_key["empty"].error == "no image member"  # empty.txt: an empty label, no image
    assert len(samples) == 4


def test_tar_walker_rejects_a_corrupt_header(tmp_path, dataset):
    data = bytearray((dataset / "shards" / "shard-00000.tar").read_bytes())
    data[0:5] = b"XXXXX"  # the first member's name: the checksum no longer matches
    bad = tmp_path / "bad.tar"
    bad.write_bytes(bytes(data))
    (sample,) = list(ShardSource(str(tmp_path), [str(bad)], [len(data)]).iter_samples([0]))
    assert "checksum" in sample.error


def test_header_checksum_is_the_exact_byte_sum():
    """The Adler-32 shortcut equals the ustar rule (sum of bytes, checksum field as spaces)."""
    import random

    rng = random.Random(0)
    headers = [bytes(rng.getrandbits(8) for _ in range(512)) for _ in range(200)]
    headers += [b"\xff" * 512, b"\0" * 512, b"\x01" * 512]
    for h in headers:
        assert header_sum(h) == sum(h[:148]) + 8 * 32 + sum(h[156:])


def test_shard_views_give_the_same_bytes_as_copies(tmp_path):
    """views=True: every image's bytes, taken before the next sample, equal tarfile's, whether
    the image lies inside one read buffer (a view), straddles two (a copy), or is followed by a
    member that makes the reader refill before the sample is complete (the view is copied)."""
    import io
    import tarfile

    rng = np.random.default_rng(3)
    expected = {}
    path = tmp_path / "big.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(40):
            key = f"s{i:03d}"
            members = [(f"{key}.jpg", rng.bytes(int(rng.integers(1, 900_000))))]
            if i % 7 == 3:  # a large member between the image and the label: refills first
                members.append((f"{key}.json", rng.bytes(2_500_000)))
            members.append((f"{key}.cls", str(i % 5).encode()))
            expected[key] = (members[0][1], i % 5)
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    src = ShardSource(str(tmp_path), [str(path)], [path.stat().st_size])
    got, kinds = {}, set()
    for s in src.iter_samples([0], views=True):
        kinds.add(type(s.data).__name__)
        got[s.key.rpartition(":")[2]] = (bytes(s.data), s.label)  # used before the next one
    assert got == expected
    assert kinds == {"memoryview", "bytes"}  # both paths were taken
    copies = {s.key: (s.data, s.label) for s in src.iter_samples([0])}
    assert {k.rpartition(":")[2]: v for k, v in copies.items()} == expected


@pytest.mark.parametrize("thread", [False, True], ids=["in-series", "reading-thread"])
@pytest.mark.parametrize("chunk", [1000, 4096 + 100])
def test_shard_walk_with_refills_not_512_aligned(tmp_path, chunk, thread):
    """A reader whose refills end anywhere (as a remote stream's may): payloads that fit while
    their padding or the next header does not, headers split over two refills. Views and
    copies give tarfile's bytes, with the reads in series or from the reading thread (whose ring
    of buffers is reused while the walk still holds views into one of them)."""

    class OddReads(Source):
        def _open_reader(self, path):
            return FileReader(path, thread=thread, chunk=chunk)

    path = _big_shard(tmp_path / "odd.tar", 30, 700)  # 700-byte images: 324 bytes of padding
    rng = np.random.default_rng(0)
    want = {f"{i:06d}": (rng.bytes(700), i % 7) for i in range(30)}
    src = OddReads(Layout("shards", str(tmp_path), [str(path)], [path.stat().st_size]))
    for views in (True, False):
        got = {
            s.key.rpartition(":")[2]: (bytes(s.data), s.label)
            for s in src.iter_samples([0], views=views)
        }
        assert got == want


def _big_shard(path, samples: int, size: int):
    import io
    import tarfile

    rng = np.random.default_rng(0)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(samples):
            for ext, data in (("jpg", rng.bytes(size)), ("cls", str(i % 7).encode())):
                info = tarfile.TarInfo(f"{i:06d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def test_read_ahead_window_reads_the_same_samples(tmp_path):
    """--read-ahead only hints the kernel: the same samples, bytes and byte counts."""
    path = _big_shard(tmp_path / "big.tar", 40, 150_000)
    size = path.stat().st_size

    def walk(window):
        src = ShardSource(str(tmp_path), [str(path)], [size])
        src.set_options(read_ahead=window)
        samples = src.iter_samples([0])
        return [(s.key, bytes(s.data), s.label, s.read_bytes, s.error) for s in samples]

    plain, ahead = walk(0), walk(1 << 20)
    assert ahead == plain and len(plain) == 40 and not any(s[4] for s in plain)
    assert sum(s[3] for s in ahead) == size


def test_read_ahead_hint_size_is_each_shards_own_device(tmp_path):
    """Shards on two devices (a disk and tmpfs here): each reader hints in its own device's
    piece size (the disk's read-ahead, or 128 KiB where there is no block device)."""
    from feedbench.scan.cache import device_read_ahead

    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs a second filesystem (/dev/shm) beside the test's temporary folder")
    other = Path(tempfile.mkdtemp(dir=shm))
    try:
        paths = [_big_shard(tmp_path / "a.tar", 2, 1000), _big_shard(other / "b.tar", 2, 1000)]
        src = ShardSource(str(tmp_path), [str(p) for p in paths], [p.stat().st_size for p in paths])
        src.set_options(read_ahead=1 << 20)
        got = [src._open_reader(str(p)) for p in paths]
        want = [max(device_read_ahead(str(p)) or (0,)) or 128 << 10 for p in paths]
        if want[0] == want[1]:
            pytest.skip(f"both filesystems here take the same hint size ({want[0]} bytes)")
        assert [r._piece for r in got] == [max(4096, w) for w in want]
        for r in got:
            r.close()
    finally:
        shutil.rmtree(other)


def _kernel_read_ahead(path) -> int | None:
    """The block device's own read-ahead in bytes (sysfs), or None where it cannot be told."""
    dev = os.stat(path).st_dev
    base = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    for q in (f"{base}/queue/read_ahead_kb", f"{base}/../queue/read_ahead_kb"):
        try:
            with open(q) as f:
                return int(f.read()) * 1024
        except (OSError, ValueError):
            continue
    return None


def test_read_ahead_window_fills_the_page_cache_ahead_of_the_reader(tmp_path):
    """After the first sample of a cold 40 MiB shard, a 32 MiB window has most of the file in the
    page cache; the kernel's own read-ahead alone (measured the same way) has much less."""
    import time

    from feedbench.scan import cache

    path = str(_big_shard(tmp_path / "big.tar", 40, 1 << 20))
    size = os.path.getsize(path)
    own = _kernel_read_ahead(path)
    if own is None or own >= 16 << 20:
        pytest.skip(f"the kernel's own read-ahead here ({own} bytes) is unknown or ≥ 16 MiB")
    src = ShardSource(str(tmp_path), [path], [size])

    def resident_after_first_sample(window: int) -> int:
        cache.evict([path])
        if cache.file_residency(path)[0] > 0:
            pytest.skip("the page cache cannot be emptied on this filesystem")
        src.set_options(read_ahead=window)
        walk = src.iter_samples([0], views=True)
        next(walk)
        deadline, best = time.monotonic() + 5, 0
        while time.monotonic() < deadline:  # the hint is asynchronous: wait for the disk
            best = max(best, cache.file_residency(path)[0])
            if best >= 30 << 20:
                break
            time.sleep(0.05)
        walk.close()
        return best

    without = resident_after_first_sample(0)
    with_window = resident_after_first_sample(32 << 20)
    assert with_window >= 30 << 20, (with_window, without)
    assert without < 20 << 20, (with_window, without)


def test_read_buffers_are_not_shared_with_forked_processes():
    """Read buffers made before a fork (O_DIRECT's, a reading thread's ring) are the child's own
    copies: loader workers forked from a process that has read fill them at the same time."""
    ring = Buffers.take_ring(3, 1 << 16)
    aligned = Buffers.get(True)
    ring[0][:4] = aligned[:4] = b"mine"
    pid = os.fork()
    if pid == 0:  # the child overwrites its copies and leaves at once
        ring[0][:4] = aligned[:4] = b"kid!"
        os._exit(0)
    os.waitpid(pid, 0)
    assert bytes(ring[0][:4]) == bytes(aligned[:4]) == b"mine"
    Buffers.give_back(ring)


@pytest.mark.parametrize("thread", [False, True], ids=["in-series", "reading-thread"])
def test_reader_reads_nothing_past_the_end_and_closes(tmp_path, thread):
    """Every byte once, in order; asking again after the end (a truncated tar does) gives b""
    at once instead of waiting for a reading thread that has finished; close() ends the thread
    also when the caller stops halfway."""
    import threading

    data = os.urandom(3 * 4096 + 123)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    reader = FileReader(str(path), thread=thread, chunk=4096)
    got = []

    def read_all():
        got.append(reader.read(5000) + reader.read(len(data)))
        got.append(reader.read(512))
        got.append(reader.skip(10))

    t = threading.Thread(target=read_all, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "a read past the end did not return"
    assert got == [data, b"", 0] and reader.eof and reader.bytes == len(data)
    reader.close()
    half = FileReader(str(path), thread=thread, chunk=4096)
    assert half.read(100) == data[:100]
    half.close()  # the thread may be blocked on a full ring: close() must still end it
    assert half._thread is None
    assert not any(t.name == "feedbench-read" for t in threading.enumerate())
