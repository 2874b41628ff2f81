"""A file our training loader leaves out (it cannot decode it) reaches the scan as its own
errors do: counted in the measurement, named with why in the results and the console. Before,
``feedbench scan --loader torch`` delivered 23 of 24 samples and said "errors skipped: 0"."""

from __future__ import annotations

import json
import tarfile

import pytest

from feedbench.scan import results as scan_results


def _spoil_image(root) -> str:
    """Overwrite one JPEG of the tree with as many zero bytes (its size, so any index still
    holds); its path."""
    path = sorted((root / "images").rglob("*.jpg"))[5]
    path.write_bytes(b"\0" * path.stat().st_size)
    return str(path)


def _spoil_member(root) -> str:
    """Zero one JPEG member's bytes inside the first tar shard, in place (offsets unchanged);
    its member name."""
    shard = sorted((root / "shards").glob("*.tar"))[0]
    with tarfile.open(shard) as tf:
        member = next(m for m in tf.getmembers() if m.name.endswith(".jpg"))
    with open(shard, "r+b") as f:
        f.seek(member.offset_data)
        f.write(b"\0" * member.size)
    with tarfile.open(shard) as tf:  # still a tar, the member now zeros
        assert tf.extractfile(member.name).read() == b"\0" * member.size  # type: ignore[union-attr]
    return member.name


# torch leaves the file out of its batch (23 samples); wds reads one more in its place, so that
# every rank's count stays exact (24)
@pytest.mark.parametrize("loader,fmt,samples", [("torch", "tree", 23), ("wds", "shards", 24)])
def test_a_file_the_loader_skips_is_counted_and_named(
    cli, dataset_copy, tmp_path, loader, fmt, samples
):
    spoiled = (_spoil_image if fmt == "tree" else _spoil_member)(dataset_copy)
    data = dataset_copy / ("images" if fmt == "tree" else "shards")
    out = tmp_path / "r.json"
    r = cli("scan", str(data), "--loader", loader, "--consumers", "1", "--workers", "1",
            "--batch-size", "4", "--passes", "warm", "--repeat", "1", "--no-plots",
            "--json", str(out))  # fmt: skip
    assert r.code == 0, r.out + r.err
    result = scan_results.load(out)
    (m,) = result.measurements
    assert m.errors == 1 and m.samples == samples
    (e,) = result.errors
    assert e.stage == "loader" and spoiled.rsplit("/", 1)[-1] in e.key
    assert e.message  # the loader's reason
    console = " ".join(r.out.split())
    assert "errors skipped: 1" in console
    assert json.loads(out.read_text())["measurements"][0]["errors"] == 1


def test_a_clean_pass_counts_no_loader_errors(cli, dataset, tmp_path):
    out = tmp_path / "r.json"
    r = cli("scan", str(dataset / "images"), "--loader", "torch", "--consumers", "1",
            "--workers", "1", "--batch-size", "4", "--passes", "warm", "--repeat", "1",
            "--no-plots", "--json", str(out))  # fmt: skip
    assert r.code == 0, r.out + r.err
    result = scan_results.load(out)
    assert result.measurements[0].errors == 0 and result.errors == []
    assert result.measurements[0].samples == 24
