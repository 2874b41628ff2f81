"""Data files that are not images, read through the data layer as scan reads them: raw files,
npy/npz written by numpy, TFRecord framing written by our writer and checked against the spec.
Every test reads real files and counts exact samples and bytes."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from feedbench.core.errors import FeedbenchError
from feedbench.scan import stages as st
from feedbench.scan.consumer import consumer_units
from feedbench.scan.sources import Source, detect
from loaders.data import RawSample, records, tfrecord
from loaders.data.tfrecord import RecordFormatError


def _read_all(source: Source):
    return list(source.iter_samples(range(source.units())))


def _file_bytes(folder: Path, suffix: str = "") -> int:
    return sum(p.stat().st_size for p in folder.rglob(f"*{suffix}") if p.is_file())


def test_files_format_reads_every_file_whole_as_a_sample(tmp_path):
    blobs = {"a.bin": b"x" * 10, "sub/b.dat": bytes(range(256)) * 40, "sub/deeper/c": b"c"}
    for name, data in blobs.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    (tmp_path / ".hidden").write_bytes(b"never listed")
    source, _ = detect(str(tmp_path), "files")
    assert (source.kind, source.fmt, source.units()) == ("records", "files", 3)
    got = {Path(s.key).relative_to(tmp_path).as_posix(): bytes(s.data) for s in _read_all(source)}
    assert got == blobs
    assert sum(s.read_bytes for s in _read_all(source)) == source.total_bytes() == 10 + 10240 + 1


def test_npy_and_npz_files_decode_to_the_arrays_written(tmp_path):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((3, 5)).astype(np.float32), np.arange(7, dtype=np.int16)]
    (tmp_path / "npy").mkdir()
    for k, a in enumerate(arrays):
        np.save(tmp_path / "npy" / f"{k}.npy", a)
    np.savez(tmp_path / "one.npz", x=arrays[0], y=np.int64(3))
    np.savez_compressed(tmp_path / "two.npz", x=arrays[1])

    source, _ = detect(str(tmp_path / "npy"), "auto")
    assert (source.fmt, source.units()) == ("npy", 2)
    samples = _read_all(source)
    assert sum(s.read_bytes for s in samples) == _file_bytes(tmp_path / "npy")
    for s, a in zip(samples, arrays, strict=True):
        np.testing.assert_array_equal(source.decode(s), a)

    source, _ = detect(str(tmp_path), "npz")  # the npy folder beside is left out, counted
    assert (source.fmt, source.units()) == ("npz", 2)
    assert len(source.layout.skipped) == 2
    one, two = (source.decode(s) for s in _read_all(source))
    np.testing.assert_array_equal(one["x"], arrays[0])
    assert int(one["y"]) == 3
    np.testing.assert_array_equal(two["x"], arrays[1])
    with pytest.raises(st.DecodeError, match="bad.npz: not a readable .npz"):
        st.decode_record(source, RawSample("bad.npz", b"PK not a zip", 0, 12, 0.0))


def test_npz_decode_equals_numpy_load_and_checks_each_members_crc(tmp_path):
    """The zip64 npz files of `feedbench sample --workload unet3d`, decoded from the read
    buffer as numpy.load decodes the file; a flipped payload byte fails its CRC-32."""
    from feedbench.sample_workload import make_workload

    make_workload(tmp_path, "unet3d", 0.0003)
    path = sorted((tmp_path / "data").glob("*.npz"))[0]
    data = bytearray(path.read_bytes())
    got = records.decode("npz", data, path.name)
    with np.load(path) as want:
        assert sorted(got) == sorted(want.files) == ["x", "y"]
        for k in want.files:
            assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape
            np.testing.assert_array_equal(got[k], want[k])
    data[len(data) // 2] ^= 0xFF  # inside x's payload
    with pytest.raises(RecordFormatError, match="bad CRC-32"):
        records.decode("npz", data, path.name)


def test_tfrecord_framing_follows_the_spec():
    assert records.has_decode("tfrecord") and not records.has_decode("files")
    crc = tfrecord._crc32c()
    assert crc(b"123456789") == 0xE3069283  # CRC-32C (Castagnoli) check value
    c = crc(b"hello")
    assert tfrecord.masked_crc(b"hello") == ((((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF)
    framed = tfrecord.frame(b"hello")
    length, length_crc = struct.unpack_from("<QI", framed)
    assert length == 5 and len(framed) == 8 + 4 + 5 + 4
    assert length_crc == tfrecord.masked_crc(framed[:8])
    assert framed[12:17] == b"hello"
    assert struct.unpack_from("<I", framed, 17)[0] == tfrecord.masked_crc(b"hello")
    assert bytes(tfrecord.parse_record(framed)) == b"hello"
    bad = bytearray(framed)
    bad[13] ^= 1
    with pytest.raises(RecordFormatError, match="bad data checksum"):
        tfrecord.parse_record(bad)
    assert bytes(tfrecord.parse_record(bad, verify=False)) == bytes(bad[12:17])
    bad = bytearray(framed)
    bad[0] = 6
    with pytest.raises(RecordFormatError, match="bad length checksum"):
        tfrecord.parse_record(bad)


def _write_tfrecords(folder: Path, counts: list[int]) -> list[list[bytes]]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    written = []
    for k, n in enumerate(counts):
        payloads = [rng.bytes(int(rng.integers(0, 5000))) for _ in range(n)]
        with open(folder / f"part-{k}.tfrecord", "wb") as f:
            tfrecord.write_records(f, payloads)
        written.append(payloads)
    return written


def test_tfrecord_records_are_samples_indexed_by_offset(tmp_path):
    written = _write_tfrecords(tmp_path, [5, 3])
    source, _ = detect(str(tmp_path), "auto")
    assert (source.fmt, source.units(), source.samples_hint()) == ("tfrecord", 8, 8)
    assert not source.sample_is_file()
    sizes = [12 + len(p) + 4 for p in written[0]]
    assert source.table.offset[:5].tolist() == np.cumsum([0, *sizes[:-1]]).tolist()
    samples = _read_all(source)
    assert sum(s.read_bytes for s in samples) == _file_bytes(tmp_path)
    payloads = [bytes(source.decode(s)) for s in samples]
    assert payloads == written[0] + written[1]
    assert samples[1].key.endswith(f"part-0.tfrecord@{sizes[0]}")


def test_a_cut_off_tfrecord_keeps_the_records_before_it(tmp_path):
    written = _write_tfrecords(tmp_path, [4])
    path = tmp_path / "part-0.tfrecord"
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) - 3])  # the last record's data checksum cut
    source, _ = detect(str(tmp_path), "tfrecord")
    assert source.units() == 3
    assert "cut off inside the record" in source.layout.skipped[0].reason
    payloads = [bytes(source.decode(s)) for s in _read_all(source)]
    assert payloads == written[0][:3]
    path.write_bytes(whole[:5])
    with pytest.raises(FeedbenchError, match="no samples in 1 files"):
        detect(str(tmp_path), "tfrecord")


@pytest.mark.parametrize("world", [1, 2, 3])
def test_records_are_sharded_one_by_one_and_each_read_once(tmp_path, world):
    _write_tfrecords(tmp_path, [5, 2])  # 7 records in 2 files
    source, _ = detect(str(tmp_path), "tfrecord")
    shares = [consumer_units(source, r, world, seed=0, epoch=0) for r in range(world)]
    assert {len(s) for s in shares} == {-(-7 // world)}  # equal batches on every rank
    seen = np.concatenate(shares)
    assert sorted(set(seen.tolist())) == list(range(7))
    assert len(seen) - 7 == -(-7 // world) * world - 7  # only the padding repeats


def test_a_local_range_is_read_in_bounded_calls(tmp_path):
    data = np.random.default_rng(2).bytes(3 << 20)
    (tmp_path / "big.bin").write_bytes(data)
    got, calls = records.read_range(
        str(tmp_path / "big.bin"), 1000, len(data) - 1000, chunk=1 << 18
    )
    assert bytes(got) == data[1000:] and calls == 12


def test_hdf5_rows_are_samples_read_as_byte_ranges(tmp_path):
    h5py = pytest.importorskip("h5py", reason="HDF5 needs h5py: pip install 'feedbench[formats]'")
    parts = [np.arange(5 * 4 * 3, dtype=np.float32).reshape(5, 4, 3), np.ones((3, 4, 3), "<f4")]
    for k, rows in enumerate(parts):
        with h5py.File(tmp_path / f"{k}.h5", "w") as f:
            f.create_dataset("labels", data=np.arange(len(rows)))  # smaller: not the samples
            f.create_dataset("images", data=rows)
    with h5py.File(tmp_path / "chunked.hdf5", "w") as f:
        f.create_dataset("images", data=parts[0], chunks=(1, 4, 3), compression="gzip")
    source, _ = detect(str(tmp_path), "auto")
    assert (source.fmt, source.units()) == ("hdf5", 8)
    assert "chunked" in next(s.reason for s in source.layout.skipped if "chunked" in s.path)
    assert source.table.meta[0]["dataset"] == "/images"
    samples = _read_all(source)
    want = [row for rows in parts for row in rows]
    assert [bytes(s.data) for s in samples] == [w.tobytes() for w in want]
    assert sum(s.read_bytes for s in samples) == sum(p.nbytes for p in parts)
    for s, w in zip(samples, want, strict=True):
        np.testing.assert_array_equal(source.decode(s), w)

    named, _ = detect(str(tmp_path), "hdf5:/labels")  # a named dataset instead of the largest
    labels = [int(named.decode(s)) for s in _read_all(named)]
    assert labels == [0, 1, 2, 3, 4, 0, 1, 2]
    with pytest.raises(FeedbenchError, match="no dataset /nope with rows"):
        detect(str(tmp_path), "hdf5:/nope")
    with pytest.raises(FeedbenchError, match="unknown format 'npz:x'"):
        detect(str(tmp_path), "npz:x")


def test_parquet_row_groups_are_samples_decoded_from_their_bytes(tmp_path):
    pa = pytest.importorskip(
        "pyarrow", reason="Parquet needs pyarrow: pip install 'feedbench[formats]'"
    )
    import pyarrow.parquet as pq

    table = pa.table({"a": list(range(100)), "s": [f"row {i}" for i in range(100)]})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=30)
    source, _ = detect(str(tmp_path / "t.parquet"), "auto")
    assert (source.fmt, source.units()) == ("parquet", 4)
    samples = _read_all(source)
    md = pq.ParquetFile(tmp_path / "t.parquet").metadata
    column_bytes = sum(
        md.row_group(g).column(c).total_compressed_size for g in range(4) for c in range(2)
    )
    assert sum(s.read_bytes for s in samples) == column_bytes  # the row groups, not the footer
    for g, s in enumerate(samples):
        assert source.decode(s).equals(table.slice(30 * g, 30))
