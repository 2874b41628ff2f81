"""The data layer's rules, the same for scan and the loaders: layouts, patterns, listing."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from feedbench.scan.sources import detect
from loaders.data import FileReader, expand, iter_shard, locate, open_index, redact_url
from loaders.errors import LoaderError


def _jpeg(path, data=b"\xff\xd8 not really a jpeg"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_scan_and_loaders_see_the_same_samples_bmp_included(tmp_path):
    for cls, names in {"cat": ["a.jpg", "b.BMP"], "dog": ["c.png", "d.txt"]}.items():
        for n in names:
            _jpeg(tmp_path / cls / n)
    source, _ = detect(str(tmp_path))
    index = open_index(str(tmp_path))
    assert source.units() == len(index) == 3
    assert sorted(os.path.basename(f) for f in source.files()) == ["a.jpg", "b.BMP", "c.png"]
    assert [os.path.basename(s.path) for s in index.skipped] == ["d.txt"]
    assert index.classes == source.classes == ["cat", "dog"]


def test_a_flat_folder_is_one_class_and_loose_files_beside_classes_are_skipped(tmp_path):
    flat = tmp_path / "flat"
    for n in ("a.jpg", "b.jpg"):
        _jpeg(flat / n)
    layout = locate(flat)
    assert layout.classes == ["flat"] and list(layout.labels) == [0, 0]
    mixed = tmp_path / "mixed"
    _jpeg(mixed / "loose.jpg")
    _jpeg(mixed / "cat" / "a.jpg")
    layout = locate(mixed)
    assert layout.classes == ["cat"] and [os.path.basename(f) for f in layout.files] == ["a.jpg"]
    assert [(os.path.basename(s.path), s.reason) for s in layout.skipped] == [
        ("loose.jpg", "not in a class folder")
    ]


def test_a_sample_root_is_read_as_its_tree_or_its_shards(dataset):
    tree = locate(dataset)
    assert tree.kind == "tree" and tree.root == os.path.join(dataset, "images")
    assert tree.classes == [f"class_{c:03d}" for c in range(4)] and tree.notes
    shards = locate(dataset, "shards")
    assert shards.kind == "shards" and shards.root == os.path.join(dataset, "shards")
    assert len(open_index(dataset)) == len(open_index(shards)) == 24


def test_listing_finds_each_member_where_tarfile_does(dataset):
    shard = str(dataset / "shards" / "shard-00001.tar")
    listed = list(iter_shard(FileReader(shard, sparse=True), shard, listing=True))
    with tarfile.open(shard) as tf:
        members = {m.name: (m.offset_data, m.size) for m in tf}
    assert len(listed) == 6 and all(s.error is None and s.data is None for s in listed)
    for s in listed:
        image_offset, image_size, name, label_offset, label_size = s.at
        assert members[name] == (image_offset, image_size)
        assert members[name.replace(".jpg", ".cls")] == (label_offset, label_size)
    # listing reads headers and labels, not the images
    reader = FileReader(shard, sparse=True, chunk=8192)
    list(iter_shard(reader, shard, listing=True))
    assert reader.bytes < os.path.getsize(shard) / 4


def test_patterns_for_paths_and_urls(dataset):
    shards = dataset / "shards"
    assert expand(str(shards / "shard-{00000..00001}.tar")) == [
        str(shards / "shard-00000.tar"),
        str(shards / "shard-00001.tar"),
    ]
    assert len(expand(str(shards / "*.tar"))) == 4
    # a URL's brace list is expanded without asking the server; its query is not a glob
    assert expand("http://h/s-{0..2}.tar?sig=a*b") == [
        f"http://h/s-{i}.tar?sig=a*b" for i in range(3)
    ]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://alice:S3cret@h:8/ds/", "http://alice:***@h:8/ds/"),
        (
            "https://h/a.tar?X-Amz-Signature=abc&part=1",
            "https://h/a.tar?X-Amz-Signature=***&part=1",
        ),
        ("s3://bucket/prefix", "s3://bucket/prefix"),
        ("/local/path", "/local/path"),
    ],
)
def test_credentials_are_redacted(url, shown):
    assert redact_url(url) == shown


def test_bad_places_are_one_line(tmp_path):
    with pytest.raises(LoaderError, match="no such file or directory"):
        locate(tmp_path / "nope")
    with pytest.raises(LoaderError, match="unknown format"):
        locate(tmp_path, "zip")
    bad = tmp_path / "x.tar"
    with tarfile.open(bad, "w") as tf:
        info = tarfile.TarInfo("a.jpg")
        info.size = 3
        tf.addfile(info, io.BytesIO(b"abc"))
    with pytest.raises(LoaderError, match=r"no usable samples in 1 shards .*missing or bad label"):
        open_index(bad)
