"""Shards cut short by the server (a full Content-Length, then the connection closed halfway):
the scan fails with exit 3, the results file says so, and each error names the bytes that
arrived (a real loopback web server, the real CLI)."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import loopback_http

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def cutting_http(
    root: Path,
    cut: threading.Event | None = None,
    keep: int | Callable[[Path], int] | None = None,
):
    """A real web server over ``root`` that announces each file's full length but sends only
    its first half (its first ``keep`` bytes, or ``keep(file)`` of each, if given), then closes
    the connection (once ``cut`` is set, if given)."""

    class Handler(http.server.SimpleHTTPRequestHandler):
        def copyfile(self, source, outputfile):
            if cut is not None and not cut.is_set():
                return super().copyfile(source, outputfile)
            data = source.read()
            n = keep(Path(self.translate_path(self.path))) if callable(keep) else keep
            outputfile.write(data[: len(data) // 2 if n is None else n])
            outputfile.flush()
            self.close_connection = True

        def log_message(self, *args):
            pass

    with loopback_http(Handler, root) as port:
        yield f"http://127.0.0.1:{port}"


def _keys(shard: Path) -> list[tuple[str, int, int]]:
    """Each member's webdataset key, header offset and data offset (``tarfile``'s reading)."""
    with tarfile.open(shard) as tar:
        return [(m.name.split(".", 1)[0], m.offset, m.offset_data) for m in tar.getmembers()]


def whole_samples(shard: Path, nbytes: int) -> int:
    """The samples of ``shard`` whole in its first ``nbytes``: a sample is known whole when the
    next key's header has arrived (another member of its key could follow until then)."""
    members = _keys(shard)
    return sum(
        1
        for (key, _, _), (after, _, data_at) in zip(members, members[1:], strict=False)
        if after != key and data_at <= nbytes
    )


def after_whole_samples(shard: Path, k: int) -> int:
    """A cut of ``shard`` that leaves exactly its first ``k`` samples whole: 100 bytes into the
    data of the next sample's first member."""
    first: dict[str, int] = {}  # each key's first member's data offset, in the tar's order
    for key, _, data_at in _keys(shard):
        first.setdefault(key, data_at)
    return list(first.values())[k] + 100


@pytest.mark.slow  # a real scan in a subprocess: ~10 s on 2 busy cores
def test_shards_cut_short_fail_the_scan_and_say_how_much_arrived(dataset, tmp_path):
    shards = sorted((dataset / "shards").glob("*.tar"))
    assert len(shards) == 4
    out = tmp_path / "r.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with cutting_http(dataset / "shards") as url:
        target = f"{url}/shard-0000{{0..3}}.tar"
        proc = subprocess.run(
            [sys.executable, "-m", "feedbench", "scan", target, "--stages", "read",
             "--batch-size", "2", "--json", str(out), "--no-plots"],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 3, proc.stdout + proc.stderr  # a failed measurement (README)
    result = json.loads(out.read_text())
    (m,) = result["measurements"]
    assert m["failed_files"] == 4
    # the samples whole in each half arrived (3, 2, 3, 2), whatever the reader's timing
    assert m["samples"] == sum(whole_samples(p, p.stat().st_size // 2) for p in shards) == 10
    assert m["failed"].startswith("4 of 4 shards failed (cut short or corrupt)")
    assert result["partial"] and "4 of 4 shards failed" in result["failure"]
    # every shard's error names the half that arrived, not what the parser had taken
    sent = {f"{url}/{p.name}": p.stat().st_size // 2 for p in shards}
    errors = {e["key"]: e["message"] for e in result["errors"]}
    assert set(errors) == set(sent)
    for key, message in errors.items():
        assert message.startswith(f"truncated or corrupt shard after {sent[key]} bytes ("), message
    # the failed shards are named in the terminal and the reports, not only counted
    assert sorted(m["failed_names"]) == sorted(sent)
    line = next(ln for ln in proc.stdout.splitlines() if "failed files:" in ln)
    assert "4 shards failed before the end (cut short or corrupt; 1 consumer, cold" in line
    assert all(name.rsplit("/", 1)[1] in proc.stdout for name in sent)
    _reports_name_them_escaped(result, tmp_path)


@pytest.mark.slow  # a real scan in a subprocess per case: ~10 s each on 2 busy cores
@pytest.mark.parametrize("keep", [100, 700], ids=["in-first-header", "in-first-member"])
def test_shards_cut_before_a_first_sample_is_whole_are_a_failed_measurement(
    dataset, tmp_path, keep
):
    """No sample arrives (the cut falls in the first 512-byte tar header, or in the first
    member's data): the storage failed the measurement (exit 3), not the data (exit 2)."""
    shards = sorted((dataset / "shards").glob("*.tar"))
    out = tmp_path / "r.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with cutting_http(dataset / "shards", keep=keep) as url:
        proc = subprocess.run(
            [sys.executable, "-m", "feedbench", "scan", f"{url}/shard-0000{{0..3}}.tar",
             "--stages", "read", "--batch-size", "2", "--json", str(out), "--no-plots"],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "nothing measured" not in proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    (m,) = result["measurements"]
    assert m["samples"] == 0 and m["failed_files"] == 4
    assert m["failed"].startswith("4 of 4 shards failed (cut short or corrupt)")
    names = [f"{url}/{p.name}" for p in shards]
    assert sorted(m["failed_names"]) == names
    for e in result["errors"]:
        assert e["message"].startswith(f"truncated or corrupt shard after {keep} bytes ("), e
    assert all(p.name in proc.stdout for p in shards)  # each failed shard named


FORGED = "x.tar\nverdict: forged <img src=x onerror=alert(1)>"


def _reports_name_them_escaped(result: dict, tmp_path: Path) -> None:
    """`feedbench report` of the same file shows the failed shards in the terminal, the HTML
    and the Markdown, a name from the data escaped as every other name is."""
    result["measurements"][0]["failed_names"][0] = FORGED
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(result))
    md, html = tmp_path / "r.md", tmp_path / "r.html"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "feedbench", "report", str(forged), "--md", str(md),
         "--html", str(html)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    others = result["measurements"][0]["failed_names"][1:]
    for where, text in (("terminal", proc.stdout), ("md", md.read_text()),
                        ("html", html.read_text())):  # fmt: skip
        assert "4 shards failed before the end (cut short or corrupt" in text, where
        assert all(name in text for name in others), where
        assert "\nverdict: forged" not in text, where  # no line of its own
        assert where == "terminal" or "<img src=x" not in text, where  # no HTML from a name
    assert "x.tar\\nverdict: forged <img src=x" in proc.stdout  # one line, shown as written
    assert "nverdict: forged &lt;img src=x" in md.read_text()  # (its backslash escaped too)


def test_the_samples_that_arrived_before_a_cut_are_read_even_after_the_close(dataset):
    """aiohttp raises a cut response's error ahead of the bytes it still holds: a reader that
    comes to them after the close was seen still gets the samples that arrived, then the error
    (which samples "arrived" must not hang on the reader's timing)."""
    from loaders.data.remote import StreamReader
    from loaders.data.tar import iter_shard

    shard = dataset / "shards" / "shard-00000.tar"
    keep = after_whole_samples(shard, 3)
    assert whole_samples(shard, keep) == 3 and whole_samples(shard, keep - 101) == 2
    with cutting_http(dataset / "shards", keep=keep) as url:
        reader = StreamReader(f"{url}/{shard.name}")
        content = reader._f.r.content  # the response's aiohttp stream: has the cut been seen?
        deadline = time.monotonic() + 30
        while content.exception() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert content.exception() is not None  # the close came first, nothing read yet
        samples = list(iter_shard(reader, f"{url}/{shard.name}"))
    assert [s.key for s in samples[:-1]] == [f"{shard.name}:00000{i}" for i in range(3)]
    assert all(s.error is None and s.data is not None for s in samples[:-1])
    assert samples[-1].error.startswith(f"truncated or corrupt shard after {keep} bytes (")


@pytest.mark.slow  # a real scan in a subprocess: ~10 s on 2 busy cores
def test_an_index_states_the_samples_expected_and_counts_those_lost(dataset, tmp_path):
    """With the shards' index (listed while they were served whole) the scan states the samples
    it expects up front, and counts what each cut shard lost after its error as failed: each
    shard is cut where exactly 2 of its 6 samples are whole, so 8 of 24 arrive (most failed:
    exit 3)."""
    from loaders import open_index

    index, out = tmp_path / "shards.npz", tmp_path / "r.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cut = threading.Event()
    keep = {p.name: after_whole_samples(p, 2) for p in (dataset / "shards").glob("*.tar")}
    assert len(keep) == 4
    with cutting_http(dataset / "shards", cut, keep=lambda p: keep[p.name]) as url:
        target = f"{url}/shard-0000{{0..3}}.tar"
        open_index(target).save(index)
        cut.set()
        proc = subprocess.run(
            [sys.executable, "-m", "feedbench", "scan", target, "--stages", "read",
             "--batch-size", "2", "--index", str(index), "--json", str(out), "--no-plots"],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 3, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["dataset"]["samples"] == 24  # 4 shards of 6, by the index
    (m,) = result["measurements"]
    assert (m["samples"], m["errors"], m["failed_files"]) == (8, 4, 4)
    assert m["lost_samples"] == 16
    said = "24 samples expected, 8 arrived: 16 lost in 4 shards cut short"
    assert m["failed"] == f"16 of 24 samples failed ({said} or corrupt)"
    assert said in proc.stdout.replace("\n", " ")
    assert len(result["errors"]) == 4
    for e in result["errors"]:  # each shard's error names the bytes it was cut at
        n = keep[e["key"].rsplit("/", 1)[1]]
        assert e["message"].startswith(f"truncated or corrupt shard after {n} bytes ("), e
