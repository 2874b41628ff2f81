"""Credentials reach no output, however they are quoted: URL passwords with any character a
userinfo may hold, secret query values and secret environment values, through the redaction
functions (property-based) and through a real scan of a real password-guarded web server."""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import shutil
import string
from pathlib import Path
from urllib.parse import quote, unquote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedbench.core.redact import scrub_text, secret_values
from loaders.data.redaction import SECRET_QUERY_NAMES
from tests.conftest import loopback_http

MARK = "Zq7Kw"  # in every generated secret: were any of it shown, this would be
# what RFC 3986 lets a userinfo hold unencoded (quotes and parentheses among them), '@' (users
# write it, clients split at the last one), and percent-encoded bytes
USERINFO = string.ascii_letters + string.digits + "-._~!$&'()*+,;=:@"
QUERY_VALUE = string.ascii_letters + string.digits + "-._~!$'()*+,;:@/%"
pct = st.integers(0, 255).map(lambda b: f"%{b:02X}")
password = st.tuples(
    st.lists(st.one_of(st.sampled_from(USERINFO), pct), max_size=8).map("".join),
    st.lists(st.one_of(st.sampled_from(USERINFO), pct), max_size=8).map("".join),
).map(lambda t: t[0] + MARK + t[1])
user = st.text(string.ascii_letters + string.digits + "-._~!$&'()*+,;=", max_size=8)
value = st.text(QUERY_VALUE, max_size=10).map(lambda v: MARK + v)
secret_name = st.tuples(
    st.sampled_from(SECRET_QUERY_NAMES), st.sampled_from(["", "X-Amz-", "access_", "Shared"])
).map(lambda t: t[1] + t[0].upper() if len(t[0]) % 2 else t[1] + t[0])
host = st.sampled_from(["127.0.0.1:8080", "bucket.s3.example.com", "[::1]:9000", "h"])
# where a URL stands in a line: alone, quoted, in a repr, in parentheses, in a sentence
context = st.sampled_from(["{}", "'{}'", '"{}"', "({})", "error: {}: timed out", "x={},y"])


@settings(max_examples=300, deadline=None)
@given(user, password, host, st.lists(st.tuples(secret_name, value), min_size=1, max_size=3),
       context, st.sampled_from(["http", "https", "s3", "gs"]))  # fmt: skip
def test_no_url_credential_survives_redaction(name, pw, where, params, ctx, scheme):
    query = "&".join([f"{k}={v}" for k, v in params] + ["shard=00001"])
    url = f"{scheme}://{name}:{pw}@{where}/data/shard-{{0..3}}.tar?{query}"
    shown = scrub_text(ctx.format(url), [])
    assert MARK not in shown, shown
    assert f"{where}/data/shard-{{0..3}}.tar?" in shown  # the rest stays as written
    assert "shard=00001" in shown


@settings(max_examples=200, deadline=None)
@given(st.text(string.ascii_letters + string.digits + "/+=", min_size=0, max_size=30),
       st.sampled_from(["AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "HF_TOKEN",
                        "DB_PASSWORD", "AZURE_STORAGE_KEY", "GOOGLE_CREDENTIALS"]),
       st.sampled_from(["{}", "'{}'", "http://h/x?v={}", "--describe=NAS {}", "a{}b"]))  # fmt: skip
def test_no_environment_secret_survives_redaction(tail, var, ctx):
    secret = MARK + tail
    env = {var: secret, "HOME": "/home/me"}
    values = secret_values(env)
    for text in (ctx.format(secret), ctx.format(quote(secret, safe=""))):
        assert MARK not in scrub_text(text, values), text


class _Guarded(http.server.SimpleHTTPRequestHandler):
    """A folder over HTTP (index pages) for one user and password (basic auth)."""

    expected = ""

    def do_GET(self):
        if self.headers.get("Authorization") != self.expected:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="data"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_GET()

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def guarded_http(root: Path, name: str, pw: str):
    """``root`` served on loopback to ``name``/``pw`` only; yields the URL with them in it."""
    auth = base64.b64encode(f"{name}:{unquote(pw)}".encode()).decode()
    handler = type("Handler", (_Guarded,), {"expected": f"Basic {auth}"})
    with loopback_http(handler, root) as port:
        yield f"http://{name}:{pw}@127.0.0.1:{port}"


@pytest.mark.net
@pytest.mark.slow
def test_quoted_credentials_reach_no_output_of_a_real_scan(cli, dataset, tmp_path, monkeypatch):
    """A password with quotes, parentheses, an '@' and a percent-encoded byte, signed shard
    URLs, and an environment secret quoted in --describe: none in the terminal, the results
    JSON, the plots, HTML, Markdown, CSV or the comparison's JSON."""
    pw, env_secret = f"p'a\"s(s)@{MARK}w!%2F", f"{MARK}/env+secret"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", env_secret)
    shutil.copytree(dataset / "shards", tmp_path / "srv" / "shards")
    out, term = tmp_path / "out", []
    out.mkdir()
    with guarded_http(tmp_path / "srv", "alice", pw) as root:
        url = (f"{root}/shards/shard-{{00000..00003}}.tar?X-Amz-Signature={MARK}sig"
               f"&X-Amz-Credential=AKIA{MARK}&x-amz-security-token={MARK}tok")  # fmt: skip
        r = cli("scan", url, "--stages", "read", "-b", "4", "--json", str(out / "r.json"),
                "--describe", f"NAS at {root} key '{env_secret}'")  # fmt: skip
    term.append(r.out + r.err)
    assert r.code == 0, r.out + r.err
    assert json.loads((out / "r.json").read_text())["measurements"][0]["samples"] == 24
    r = cli("report", str(out / "r.json"), "--html", str(out / "r.html"), "--md",
            str(out / "r.md"), "--csv", str(out / "r.csv"))  # fmt: skip
    term.append(r.out + r.err)
    r = cli("compare", str(out / "r.json"), str(out / "r.json"), "-L", "a", "-L", "b",
            "--json", str(out / "c.json"))  # fmt: skip
    term.append(r.out + r.err)
    assert r.code == 0, r.out + r.err
    files = sorted(p.name for p in out.iterdir())
    assert {"r.json", "r.html", "r.md", "r.csv", "c.json"} <= set(files), files
    assert any(f.endswith(".png") for f in files), files
    outputs = {p.name: p.read_bytes().decode("latin-1") for p in out.iterdir()}
    outputs["terminal"] = "\n".join(term)
    for where, text in outputs.items():
        assert MARK not in text, f"a secret in {where}"
        assert quote(MARK) not in text and "AKIA" not in text, f"a secret in {where}"
    doc = json.loads(outputs["r.json"])
    assert doc["dataset"]["path"].startswith("http://alice:***@127.0.0.1:")
    assert "X-Amz-Signature=***&X-Amz-Credential=***" in doc["dataset"]["path"]
