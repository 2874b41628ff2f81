"""A scan says it is listing while it lists: ``listing: N files…`` on stderr, at most every
LISTING_EVERY_S, so a tree of a million files does not pass in silence (issue 24)."""

from __future__ import annotations

import http.server
import io
import re
import shutil

from rich.console import Console

from feedbench.cli import scan as scan_cli
from loaders.data.layout import locate
from tests.conftest import loopback_http


def test_the_scan_shows_the_files_listed_so_far(cli, dataset, tmp_path, monkeypatch):
    tree = tmp_path / "images"
    shutil.copytree(dataset / "images", tree)
    monkeypatch.setattr(scan_cli, "LISTING_EVERY_S", 0.0)  # a line after every folder
    out = tmp_path / "r.json"
    r = cli("scan", str(tree), "--stages", "read", "-b", "4", "--no-plots", "--json", str(out))
    assert r.code == 0, r.out + r.err
    counts = [int(n.replace(",", "")) for n in re.findall(r"^listing: ([\d,]+) files…$", r.err,
                                                          flags=re.M)]  # fmt: skip
    # the root, then each of the 4 class folders of 6 images: the count grows to all 24
    assert counts == sorted(counts) and len(counts) == 5 and counts[-1] == 24, r.err
    assert "listing:" not in r.out  # stderr only: the tables stay clean


def test_a_listing_line_at_most_every_interval():
    text = io.StringIO()
    shown = scan_cli.Listing(Console(file=text, width=200))
    assert shown.every_s == scan_cli.LISTING_EVERY_S > 0
    shown(100)  # sooner than the interval: nothing
    shown.last -= shown.every_s
    shown(120_000)
    shown(130_000)  # again too soon
    assert text.getvalue() == "listing: 120,000 files…\n"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_a_brace_list_of_urls_tells_each_size_asked(dataset):
    """100 k shards over HTTP are a HEAD each: the listing says how many it has asked."""
    seen: list[int] = []
    with loopback_http(_Quiet, dataset / "shards") as port:
        layout = locate(f"http://127.0.0.1:{port}/shard-0000{{0..3}}.tar", progress=seen.append)
    assert len(layout.files) == 4 and all(layout.sizes)
    assert seen == [1, 2, 3, 4]
