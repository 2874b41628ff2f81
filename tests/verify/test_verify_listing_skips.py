"""Files that listing the data leaves out reach verify's results and console as they reach
scan's: counted, the first few named with why, one warning. A file that is listed but cannot be
decoded is not among them: the loader skips it while training."""

from __future__ import annotations

import json
import shutil

import pytest

from feedbench.core.listing import skipped_warning
from feedbench.verify import results as verify_results
from feedbench.verify.config import VerifyConfig
from feedbench.verify.plan import plan
from tests.verify.test_verify import FAST

NOT_AN_IMAGE = "not an image file (extension)"


def _tree_with_strays(dataset, root):
    """A copy of the sample data with a text file and a corrupt ``.jpg`` in one class folder."""
    shutil.copytree(dataset, root)
    folder = next(p for p in sorted((root / "images").iterdir()) if p.is_dir())
    stray = folder / "notes.txt"
    stray.write_text("written by hand\n")
    broken = folder / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 cut off: not a JPEG past its first bytes\n" * 8)
    return stray, broken


@pytest.mark.slow  # one torchrun job: its start-up is most of it
def test_verify_counts_and_names_what_listing_left_out(cli, dataset, tmp_path):
    stray, broken = _tree_with_strays(dataset, tmp_path / "data")
    images = len(list((tmp_path / "data" / "images").rglob("*.jpg")))
    out = tmp_path / "v.json"
    # the torch loader: it skips an image it cannot decode (the stock DataLoader stops)
    r = cli("verify", str(tmp_path / "data"), "-c", "1", "-l", "torch", "--no-synthetic", *FAST,
            "--no-plots", "--json", str(out))  # fmt: skip
    assert r.code == 0, r.out + r.err
    doc = json.loads(out.read_text())
    ds = doc["dataset"]
    assert ds["skipped_files"] == 1
    assert ds["skipped"] == [{"path": str(stray), "reason": NOT_AN_IMAGE}]
    assert ds["samples"] == images  # the corrupt .jpg is listed: only decoding finds it out
    (line,) = [w for w in doc["warnings"] if "left out when listing" in w]
    assert line == f"1 file left out when listing: {stray}: {NOT_AN_IMAGE}"
    assert broken.name not in line
    console = " ".join(r.out.split())  # rich wraps long lines
    assert f"warning: 1 file left out when listing: {stray}: {NOT_AN_IMAGE}" in console
    assert verify_results.load(out).dataset.skipped_files == 1  # round trip
    (run,) = verify_results.load(out).runs
    assert run.status == "ok"


def test_the_shards_wds_reads_are_warned_of_beside_the_tree_described(dataset, tmp_path):
    """A sample root: the results describe the tree (torch's), yet the wds loader reads the
    shards, so a cut-off shard is named in a warning of its own."""
    pytest.importorskip("webdataset")
    shutil.copytree(dataset, tmp_path / "data")
    shard = sorted((tmp_path / "data" / "shards").glob("*.tar"))[-1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    config = VerifyConfig(
        str(tmp_path / "data"), gpus=(1,), loaders=("torch", "wds"), device="cpu", batch_size=4
    )
    p = plan(config)
    assert p.dataset is not None and p.dataset.format == "tree" and p.dataset.skipped_files == 0
    (line,) = [w for w in p.warnings if "left out when listing" in w]
    assert str(shard) in line and "truncated" in line
    assert not skipped_warning(p.dataset)  # the tree's own listing left nothing out
