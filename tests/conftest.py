"""Shared fixtures: every test makes its own data with feedbench.sample (or uses sample_data/)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from feedbench.sample import SampleSpec, make_sample

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session", autouse=True)
def _output_as_a_log_gets_it():
    """The commands' output, in process or in a child, as a log file gets it: whole lines at any
    length of the test's paths, whatever COLUMNS the shell running pytest has."""
    columns = os.environ.pop("COLUMNS", None)
    yield
    if columns is not None:
        os.environ["COLUMNS"] = columns


@pytest.fixture(scope="session")
def dataset(tmp_path_factory) -> Path:
    """24 ImageNet-like JPEGs in 4 classes, as a tree and as 4 tar shards. Do not modify: copy."""
    out = tmp_path_factory.mktemp("ds") / "sample"
    make_sample(out, SampleSpec(images=24, seed=7, classes=4, per_shard=6), jobs=1)
    return out


@pytest.fixture
def dataset_copy(dataset: Path, tmp_path: Path) -> Path:
    """A private copy of the dataset that a test may damage."""
    dst = tmp_path / "copy"
    shutil.copytree(dataset, dst)
    return dst


@pytest.fixture
def torchrun_logs(tmp_path: Path, monkeypatch) -> Path:
    """torchrun's own folder (``--log-dir`` by its environment variable) under the test's: else
    every torchrun a test starts leaves a torchelastic_* in the temp folder."""
    monkeypatch.setenv("PET_LOG_DIR", str(tmp_path / "torchelastic"))
    return tmp_path / "torchelastic"


@dataclass
class CliRun:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run the real ``feedbench`` entry point in-process; return exit code and output."""
    from feedbench.cli import main

    def run(*args: str) -> CliRun:
        monkeypatch.setattr(sys, "argv", ["feedbench", *args])
        code = 0
        try:
            main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        captured = capsys.readouterr()
        return CliRun(code, captured.out, captured.err)

    return run


def interruptible() -> None:
    """``preexec_fn`` for a command a test will Ctrl-C: SIGINT at its default and unblocked, as a
    terminal gives it. A shell without job control starts background commands (``pytest &``)
    with SIGINT ignored; the tests inherit that, their children too, and a Python started so
    never raises KeyboardInterrupt (both Ctrl-C tests failed that way in a backgrounded run)."""
    import signal

    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    signal.signal(signal.SIGINT, signal.default_int_handler)


@contextlib.contextmanager
def loopback_http(handler: type[http.server.SimpleHTTPRequestHandler], root) -> Iterator[int]:
    """``root`` served on 127.0.0.1 by ``handler`` (a real threaded web server, stopped after
    the block); yields its port."""
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(handler, directory=str(root))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
