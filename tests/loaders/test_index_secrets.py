"""A saved index keeps no credentials: a URL's password and secret query values are masked in
the file, and put back from the source its user names again (build_loader(url, index=PATH))."""

from __future__ import annotations

import base64
import http.server

import pytest

from loaders import build_loader
from loaders.data import SampleIndex, open_index, remote
from tests.conftest import loopback_http

PASSWORD, TOKEN = "s3cr'et\"pw", "T0KEN-4242"  # quotes: valid, unencoded, in a URL's userinfo
WANT = "Basic " + base64.b64encode(f"user:{PASSWORD}".encode()).decode()


class AuthHandler(http.server.SimpleHTTPRequestHandler):
    """Serves only a request with the password (basic auth) and the token (query)."""

    def _allowed(self) -> bool:
        if self.headers.get("Authorization") == WANT and f"token={TOKEN}" in self.path:
            return True
        self.send_error(401)
        return False

    def do_GET(self):
        if self._allowed():
            super().do_GET()

    def do_HEAD(self):
        if self._allowed():
            super().do_HEAD()

    def translate_path(self, path):
        return super().translate_path(path.split("?", 1)[0])

    def log_message(self, *args):
        pass


@pytest.mark.net
def test_a_saved_index_holds_no_secret_and_reads_with_them_given_again(dataset, tmp_path):
    saved = tmp_path / "index.npz"
    with loopback_http(AuthHandler, dataset / "shards") as port:
        url = f"http://user:{PASSWORD}@127.0.0.1:{port}/shard-0000{{0..3}}.tar?token={TOKEN}"
        listed = open_index(url)
        assert len(listed) == 24 and PASSWORD in listed.shards[0]
        listed.save(saved)
        raw = saved.read_bytes()
        assert PASSWORD.encode() not in raw and TOKEN.encode() not in raw
        assert b"user:***@127.0.0.1" in raw and b"token=***" in raw
        # named again, the source gives the secrets back: the same URLs, and they read
        again = SampleIndex.load(saved, url)
        assert again.shards == listed.shards and again.root == listed.root
        assert (
            remote.read_object(again.shards[1])
            == (dataset / "shards" / "shard-00001.tar").read_bytes()
        )
        with pytest.raises(OSError, match="401"):  # the file alone cannot
            remote.read_object(SampleIndex.load(saved).shards[1])
        loader = build_loader(url, "wds", 4, workers=0, index=saved, train=False)
        assert loader.index.shards == listed.shards
        assert sum(len(labels) for _, labels in loader) == 24
