"""Remote sources over fsspec: object stores (``s3://``) and web servers (``http(s)://``).

The same two layouts as on a filesystem: an image tree (one object per JPEG, labels from the
first folder under the root) or tar shards. Reads are what a training loader over the network
does: a tree's image is one whole-object GET (``cat_file``); a shard is streamed front to back in
1 MiB reads (HTTP: one streamed GET; S3: 8 MiB ranged GETs, fsspec's read-ahead), its tar
headers walked as for local shards. Read time includes the request (connection, first byte).

S3 credentials and endpoint come from the usual places (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL`` for S3-compatible stores, ``~/.aws``). A web
server must list directories (an index page with links, as nginx ``autoindex``, ``rclone serve
http`` or ``python -m http.server`` give); only links below the given URL are followed.

Cache control does not reach a remote server: a "cold" pass means this machine holds no copy
(fsspec reads without a client cache), not that the server's own memory is empty.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urljoin, urlsplit

import numpy as np

from feedbench.errors import FeedbenchError
from feedbench.sources.base import RawSample, Source
from feedbench.sources.local import _READ_CHUNK, ShardSource, TreeSource, _TimedReader

PROTOCOLS = ("s3", "http", "https")
S3_BLOCK = 8 << 20  # S3 ranged GETs of 8 MiB (fsspec read-ahead), served to the parser in 1 MiB
INSTALL = "pip install fsspec[http] s3fs (feedbench's own dependencies: reinstall feedbench)"

_FS: dict[tuple[int, str], object] = {}


def protocol(url: str) -> str:
    return url.split("://", 1)[0].lower()


def filesystem(url: str):
    """This process's fsspec filesystem for ``url``'s protocol (a new one after a fork: the
    async clients behind s3fs and HTTP are not fork-safe)."""
    proto = protocol(url)
    if proto not in PROTOCOLS:
        raise FeedbenchError(f"unsupported URL scheme {proto}:// (use s3://, http:// or https://)")
    key = (os.getpid(), proto)
    fs = _FS.get(key)
    if fs is None:
        try:
            import fsspec

            fs = fsspec.filesystem(proto, skip_instance_cache=True)
        except ImportError as e:
            raise FeedbenchError(
                f"{proto}:// sources need {e.name or 'fsspec'}: {INSTALL}"
            ) from None
        _FS[key] = fs
    return fs


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:300]


def _as_oserror(e: Exception) -> OSError:
    """A store's own error (botocore, aiohttp) as the OSError the shard reader handles."""
    return e if isinstance(e, OSError) else OSError(_one_line(e))


class _StreamReader(_TimedReader):
    """The shard reader's interface over a remote file object: 1 MiB reads, each timed."""

    def __init__(self, fileobj, open_s: float) -> None:
        self._f = fileobj
        self._mv = memoryview(b"")
        self._start = self._end = 0
        self.eof = False
        self.bytes = 0
        self.seconds = open_s
        self.hold = [None]  # never copied: each chunk is its own bytes object, views stay valid

    def _fill(self) -> None:
        if self.eof:
            return
        t0 = time.perf_counter()
        try:
            chunk = self._f.read(_READ_CHUNK)
        except Exception as e:
            raise _as_oserror(e) from e
        self.seconds += time.perf_counter() - t0
        n = len(chunk)
        self.bytes += n
        self._mv = memoryview(chunk)
        self._start, self._end = 0, n
        if n == 0:
            self.eof = True

    def close(self) -> None:
        self._f.close()


class RemoteShardSource(ShardSource):
    remote = True

    def _open_reader(self, path: str) -> _TimedReader:
        fs = filesystem(path)
        t0 = time.perf_counter()
        try:
            if protocol(path) == "s3":
                f = fs.open(path, "rb", block_size=S3_BLOCK, cache_type="readahead")
            else:
                f = fs.open(path, "rb", block_size=0)  # one streamed GET
        except Exception as e:
            raise _as_oserror(e) from e
        return _StreamReader(f, time.perf_counter() - t0)


class RemoteTreeSource(TreeSource):
    """Image objects under a URL; the label is the index of the first folder below the root.

    A TreeSource whose paths are URLs: only the class rule (URL paths, not filesystem paths) and
    the reads differ."""

    remote = True

    def __init__(self, root: str, urls: Sequence[str], sizes: Sequence[int]) -> None:
        self.root = root.rstrip("/")
        order = np.argsort(np.asarray(urls, dtype=str), kind="stable")
        self._paths = np.asarray(urls, dtype=str)[order]
        self._sizes = np.asarray(sizes, dtype=np.int64)[order]
        rels = [u[len(self.root) :].lstrip("/") for u in self._paths]
        parents = sorted({posixpath.dirname(r) for r in rels})
        base = posixpath.commonpath(parents) if len(parents) > 1 else posixpath.dirname(parents[0])

        def cls(rel: str) -> str | None:
            parts = posixpath.relpath(rel, base or ".").split("/") if base else rel.split("/")
            return parts[0] if len(parts) > 1 else None

        names = [cls(r) for r in rels]
        self.classes = sorted({n for n in names if n is not None})
        index = {c: i for i, c in enumerate(self.classes)}
        self._labels = np.array([index.get(n, -1) if n else -1 for n in names], dtype=np.int64)

    def iter_samples(self, unit_indices: Sequence[int], views: bool = False) -> Iterator[RawSample]:
        for i in unit_indices:  # views: every object arrives as its own bytes anyway
            url = str(self._paths[i])
            label = int(self._labels[i])
            t0 = time.perf_counter()
            if self.latency_s > 0:
                time.sleep(self.latency_s)
            try:
                data = filesystem(url).cat_file(url)
            except Exception as e:  # any transport or server error: this sample is lost
                yield RawSample(url, None, label, 0, time.perf_counter() - t0, _one_line(e))
                continue
            read_s = time.perf_counter() - t0
            error = "zero-byte file" if not data else None
            yield RawSample(url, data if data else None, label, len(data), read_s, error)


def _norm(url: str) -> str:
    """``url`` with its path's dot segments resolved (``a/b/../../`` → ``/``), trailing / kept."""
    parts = urlsplit(url)
    path = posixpath.normpath(parts.path or "/")
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    if parts.path.endswith("/") and not path.endswith("/"):
        path += "/"
    return parts._replace(path=path).geturl()


def _http_walk(fs, url: str, depth: int = 0) -> list[str]:
    """Files below ``url`` on a listing web server: only links that stay below it."""
    if depth > 32:
        return []
    base = _norm(url if url.endswith("/") else url + "/")
    out: list[str] = []
    for link in fs.ls(base, detail=False):
        full = _norm(urljoin(base, link))
        parts = urlsplit(full)
        if parts.query or parts.fragment or not full.startswith(base) or full == base:
            continue
        if full.endswith("/"):
            out += _http_walk(fs, full, depth + 1)
        else:
            out.append(full)
    return sorted(set(out))


def _sizes(fs, urls: list[str]) -> list[int]:
    def size(u: str) -> int:
        try:
            return int(fs.size(u) or 0)
        except Exception:
            return 0

    with ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(size, urls))


LISTING_ENV = "FEEDBENCH_REMOTE_LISTING"


@contextlib.contextmanager
def shared_listing(source: Source, url: str, fmt: str):
    """Hand this listing to the consumer processes started meanwhile (they inherit the
    environment), so that N consumers do not list the bucket N more times (and, over HTTP, ask
    every object's size again)."""
    folder = tempfile.mkdtemp(prefix="feedbench-listing-")
    path = os.path.join(folder, "listing.npz")
    np.savez(
        path,
        url=np.array(url),
        fmt=np.array(fmt),
        kind=np.array(source.kind),
        root=np.array(getattr(source, "root", url)),
        files=np.asarray(source.files(), dtype=str),
        sizes=np.asarray(getattr(source, "_sizes", []), dtype=np.int64),
    )
    before = os.environ.get(LISTING_ENV)
    os.environ[LISTING_ENV] = path
    try:
        yield path
    finally:
        if before is None:
            os.environ.pop(LISTING_ENV, None)
        else:
            os.environ[LISTING_ENV] = before
        shutil.rmtree(folder, ignore_errors=True)


def _shared(url: str, fmt: str) -> Source | None:
    path = os.environ.get(LISTING_ENV)
    if not path or not os.path.isfile(path):
        return None
    with np.load(path) as z:
        if str(z["url"]) != url or str(z["fmt"]) != fmt:
            return None
        files, sizes = [str(f) for f in z["files"]], [int(x) for x in z["sizes"]]
        kind, root = str(z["kind"]), str(z["root"])
    if kind == "tree":
        return RemoteTreeSource(root, files, sizes)
    return RemoteShardSource(root, files, sizes)


def detect_remote(url: str, fmt: str) -> tuple[Source, list[str]]:
    """The source at a URL: one .tar object, or a prefix / folder holding images or shards."""
    from feedbench.sources.detect import IMAGE_EXTENSIONS, choose_layout

    shared = _shared(url, fmt)
    if shared is not None:
        return shared, []
    fs = filesystem(url)
    proto = protocol(url)
    try:
        if not url.endswith("/") and url.lower().endswith(".tar") and fs.isfile(url):
            return RemoteShardSource(url.rsplit("/", 1)[0], [url], [int(fs.size(url) or 0)]), []
        if proto == "s3":
            found = fs.find(url.rstrip("/"), detail=True)
            listing = {fs.unstrip_protocol(k): int(v.get("size") or 0) for k, v in found.items()}
        else:
            urls = _http_walk(fs, url)
            listing = dict.fromkeys(urls, 0)
    except FileNotFoundError:
        raise FeedbenchError(f"no such file or directory: {url}") from None
    except PermissionError as e:
        raise FeedbenchError(f"permission denied: {url} ({_one_line(e)})") from None
    except Exception as e:
        raise FeedbenchError(f"cannot list {url}: {_one_line(e)}") from None
    visible = {
        k: v
        for k, v in listing.items()
        if not any(p.startswith(".") for p in k[len(url) :].strip("/").split("/") if p)
    }
    images = sorted(k for k in visible if os.path.splitext(k)[1].lower() in IMAGE_EXTENSIONS)
    tars = sorted(k for k in visible if k.lower().endswith(".tar"))
    if not images and not tars:
        if not visible:
            raise FeedbenchError(f"no such file or directory, or nothing in it: {url}")
        raise FeedbenchError(
            f"no images ({', '.join(IMAGE_EXTENSIONS)}) or .tar shards under {url} "
            f"({len(visible)} other objects)"
        )
    use, notes = choose_layout(fmt, f"under {url}", url, len(images), len(tars))
    chosen = images if use == "tree" else tars
    sizes = [visible[k] for k in chosen]
    if proto != "s3":  # index pages carry no sizes: ask the server (HEAD), in parallel
        sizes = _sizes(fs, chosen)
    root = url.rstrip("/")
    if use == "tree":
        return RemoteTreeSource(root, chosen, sizes), notes
    return RemoteShardSource(root, chosen, sizes), notes
