"""URLs as users write them: brace lists and globs of shards, and credentials that must never
reach any output (terminal, results JSON, HTML, PNG)."""

from __future__ import annotations

import json
import re

import pytest

from tests.scan.conftest import SECRET, rclone_serve

pytestmark = pytest.mark.net


def _samples(doc: dict) -> tuple[int, int]:
    m = doc["measurements"][0]
    return m["samples"], m["read_bytes"]


@pytest.fixture(scope="module")
def local_scan(dataset, tmp_path_factory) -> dict:
    """A read scan of the local copy of the shards, to compare remote ones with."""
    from feedbench.core.envelope import to_dict
    from feedbench.scan.config import ScanConfig
    from feedbench.scan.run import scan

    config = ScanConfig(str(dataset / "shards"), stages=("read",), batch_size=4)
    return to_dict(scan(config))


@pytest.mark.parametrize(
    "pattern", ["{http}/shards/shard-{{00000..00003}}.tar", "{s3}/shards/shard-0000[0-3].tar"]
)
def test_brace_lists_and_globs_on_urls_scan_the_same_samples_as_the_local_copy(
    cli, s3_env, local_scan, tmp_path, pattern
):
    url = pattern.format(http=s3_env["http"], s3=s3_env["s3"])
    out = tmp_path / "r.json"
    r = cli("scan", url, "--stages", "read", "-b", "4", "--no-plots", "--json", str(out))
    assert r.code == 0, r.out + r.err
    remote = json.loads(out.read_text())
    assert remote["dataset"]["files"] == local_scan["dataset"]["files"] == 4
    assert _samples(remote) == _samples(local_scan)  # the same samples, every byte of the shards
    assert remote["dataset"]["path"] == url  # recorded as given, not as a local path


@pytest.fixture
def guarded(tmp_path, dataset):
    """A web server that wants a user and password (basic auth) over the dataset."""
    import shutil

    root = tmp_path / "guarded"
    shutil.copytree(dataset, root / "ds")
    with rclone_serve(root, "http", "--user", "alice", "--pass", "S3cretPass") as url:
        yield url.replace("http://", "http://alice:S3cretPass@") + "/ds"


def test_credentials_reach_no_output(cli, guarded, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)  # a secret in the environment too
    out = tmp_path / "r.json"
    # signed shard URLs (as an object store hands out), named by a brace list
    url = guarded + "/shards/shard-{00000..00003}.tar?X-Amz-Signature=sig0123456789"
    r = cli("scan", url, "--stages", "read", "-b", "4", "--json", str(out))
    assert r.code == 0, r.out + r.err
    html = tmp_path / "r.html"
    rep = cli("report", str(out), "--html", str(html))
    assert rep.code == 0, rep.err
    pngs = sorted(tmp_path.glob("r-*.png"))
    assert pngs, "no plots written"
    outputs = {"terminal": r.out + r.err + rep.out + rep.err, "json": out.read_text(),
               "html": html.read_text()}  # fmt: skip
    outputs |= {p.name: p.read_bytes().decode("latin-1") for p in pngs}
    for where, text in outputs.items():
        for secret in ("S3cretPass", SECRET, "sig0123456789"):
            assert secret not in text, f"{secret} in the {where} output"
    doc = json.loads(outputs["json"])
    assert re.search(r"^http://alice:\*\*\*@127\.0\.0\.1:\d+/ds/shards/", doc["dataset"]["path"])
    assert doc["system"]["credentials"] is True and "alice" not in doc["system"]["endpoint"]
    assert doc["measurements"][0]["samples"] == 24
