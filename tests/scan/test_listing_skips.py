"""Files listing leaves out reach the scan's results and its console: counted, the first few named
with why, for Parquet files (a corrupt one beside a good one) and for an image tree (a loose
image beside class folders, a file that is not an image)."""

from __future__ import annotations

import json
import shutil

import pytest

from feedbench.core import envelope
from feedbench.core.listing import SKIPPED_NAMED
from feedbench.scan import results as scan_results
from feedbench.scan.config import ScanConfig
from feedbench.scan.run import new_result, validate

pa = pytest.importorskip(
    "pyarrow", reason="Parquet needs pyarrow: pip install 'feedbench[formats]'"
)
pq = pytest.importorskip("pyarrow.parquet")


def _parquet_folder(folder):
    """One good file (3 row groups), one corrupt file named .parquet, one text file."""
    folder.mkdir()
    table = pa.table({"i": list(range(300)), "s": [f"row {k}" for k in range(300)]})
    pq.write_table(table, folder / "good.parquet", row_group_size=100)
    (folder / "bad.parquet").write_bytes(b"this is not a Parquet file\n" * 40)
    (folder / "notes.txt").write_text("written by hand\n")
    return pq.ParquetFile(folder / "good.parquet").metadata.num_row_groups


def test_a_corrupt_parquet_file_is_counted_and_named_in_results_and_console(cli, tmp_path):
    groups = _parquet_folder(tmp_path / "d")
    out = tmp_path / "r.json"
    r = cli("scan", str(tmp_path / "d"), "--format", "parquet", "--consumers", "1",
            "--stages", "read,decode", "--batch-size", "1", "--workers", "0", "--no-plots",
            "--json", str(out))  # fmt: skip
    assert r.code == 0, r.out + r.err
    ds = json.loads(out.read_text())["dataset"]
    assert ds["files"] == 2 and ds["samples"] == groups  # the good file's row groups only
    assert ds["skipped_files"] == 2
    why = {e["path"].rsplit("/", 1)[-1]: e["reason"] for e in ds["skipped"]}
    assert why["bad.parquet"].startswith("unreadable: ") and "Parquet" in why["bad.parquet"]
    assert why["notes.txt"] == "not a parquet file (extension)"
    m = scan_results.load(out).measurements[0]
    assert m.errors == 0 and m.samples == groups
    console = " ".join(r.out.split())  # rich wraps long lines
    assert "2 files left out when listing" in console
    assert "bad.parquet: unreadable" in console and "notes.txt: not a parquet file" in console


def _tree_with_strays(dataset, folder, loose: int):
    """The sample tree, ``loose`` images laid beside its class folders and a text file."""
    shutil.copytree(dataset / "images", folder)
    image = next(folder.rglob("*.jpg"))
    for k in range(loose):
        shutil.copy(image, folder / f"loose-{k}.jpg")
    (folder / "README.txt").write_text("labels are the folder names\n")


@pytest.mark.parametrize("loose", [1, SKIPPED_NAMED + 2])
def test_an_image_tree_reports_what_listing_left_out(dataset, tmp_path, loose):
    _tree_with_strays(dataset, tmp_path / "t", loose)
    config = ScanConfig(str(tmp_path / "t"), stages=("read",))
    source, notes, p = validate(config)
    result = new_result(config, source, notes, p)
    ds = result.dataset
    assert ds.skipped_files == loose + 1
    assert ds.files == len(list((dataset / "images").rglob("*.jpg")))  # the strays not among them
    assert len(ds.skipped) == min(loose + 1, SKIPPED_NAMED)
    reasons = {s.path.rsplit("/", 1)[-1]: s.reason for s in ds.skipped}
    assert reasons.get("README.txt", "not an image file (extension)").startswith("not an image")
    assert reasons["loose-0.jpg"] == "not in a class folder"
    (line,) = [w for w in result.warnings if "left out when listing" in w]
    assert line.startswith(f"{loose + 1} files left out")
    assert all(s.path in line for s in ds.skipped[:3])  # the first three named, the rest counted
    assert all(s.path not in line for s in ds.skipped[3:])
    assert ("more" in line) == (loose + 1 > 3)
    envelope.save(result, tmp_path / "r.json")
    assert scan_results.load(tmp_path / "r.json").dataset == ds  # round trip


def test_results_written_before_the_count_still_load(dataset, tmp_path):
    config = ScanConfig(str(dataset / "images"), stages=("read",))
    result = new_result(config, *validate(config))
    envelope.save(result, tmp_path / "r.json")
    doc = json.loads((tmp_path / "r.json").read_text())
    for key in ("skipped_files", "skipped"):
        del doc["dataset"][key]
    (tmp_path / "r.json").write_text(json.dumps(doc))
    ds = scan_results.load(tmp_path / "r.json").dataset
    assert ds.skipped_files == 0 and ds.skipped == []
