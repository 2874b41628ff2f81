"""Object stores (``s3://``) and web servers (``http(s)://``) through fsspec, with timeouts.

Reads are what a training loader over the network does: an image object is one whole-object GET
(``cat_file``); a shard is streamed front to back in 1 MiB reads (HTTP: one streamed GET; S3:
8 MiB ranged GETs, fsspec's read-ahead). Every request has a connect and a read timeout, and a
store's own retries are few, so a server that dies or stalls surfaces as an error within seconds
instead of a hang.

S3 credentials and endpoint come from the usual places (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL`` for S3-compatible stores, ``~/.aws``). A web
server must list directories (an index page with links, as nginx ``autoindex``, ``rclone serve
http`` or ``python -m http.server`` give) unless the shards are named by a brace list.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import re
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from loaders.data.readers import READ_CHUNK, StreamBase
from loaders.data.redaction import redact_text, redact_url  # noqa: F401 (callers use remote's)
from loaders.errors import LoaderError

PROTOCOLS = ("s3", "http", "https")
S3_BLOCK = 8 << 20  # S3 ranged GETs of 8 MiB (fsspec read-ahead), served to the parser in 1 MiB
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


@dataclass(frozen=True)
class Timeouts:
    """Seconds to wait for a connection, and for the next bytes of a response."""

    connect_s: float = 10.0
    read_s: float = 30.0
    retries: int = 2  # attempts an S3 request gets in all (s3fs's own default: 5, with backoff)


TIMEOUTS = Timeouts()
_FS: dict[tuple, object] = {}  # (pid, protocol, timeouts, S3 environment) → filesystem


def is_url(path: str) -> bool:
    return bool(_URL.match(str(path)))


def protocol(url: str) -> str:
    return url.split("://", 1)[0].lower()


def check_protocol(url: str) -> str:
    proto = protocol(url)
    if proto not in PROTOCOLS:
        raise LoaderError(
            f"unsupported URL scheme {proto}:// (s3://, http:// and https:// are read; mount "
            "other stores and read the mount)"
        )
    return proto


_S3_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_PROFILE",
           "AWS_DEFAULT_REGION", "AWS_REGION")  # fmt: skip


def filesystem(url: str, timeouts: Timeouts | None = None):
    """This process's fsspec filesystem for ``url``'s protocol (a new one after a fork: the
    async clients behind s3fs and HTTP are not fork-safe)."""
    proto = check_protocol(url)
    t = timeouts or TIMEOUTS
    # the environment an S3 client is configured from is part of the key: a process that
    # changes the endpoint or the credentials (a notebook, a test) gets a client for them
    env = tuple(os.environ.get(k) for k in _S3_ENV) if proto == "s3" else ()
    key = (os.getpid(), proto, t, env)
    fs = _FS.get(key)
    if fs is None:
        try:
            fs = _new_filesystem(proto, t)
        except ImportError as e:
            raise LoaderError(
                f"{proto}:// needs {e.name or 'fsspec'}: pip install 'fsspec[http]' s3fs"
            ) from None
        _FS[key] = fs
    return fs


def _new_filesystem(proto: str, t: Timeouts):
    import fsspec

    if proto == "s3":
        fs = fsspec.filesystem(
            "s3",
            skip_instance_cache=True,
            config_kwargs={
                "connect_timeout": t.connect_s,
                "read_timeout": t.read_s,
                "retries": {"max_attempts": t.retries, "mode": "standard"},
            },
        )
        fs.retries = t.retries  # s3fs's own loop around botocore's
        return fs
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=None, sock_connect=t.connect_s, sock_read=t.read_s)
    return fsspec.filesystem(proto, skip_instance_cache=True, client_kwargs={"timeout": timeout})


def endpoint(url: str) -> str:
    """Where a URL's bytes come from, without credentials: the host (S3: the endpoint's)."""
    if protocol(url) == "s3":
        given = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return redact_url(given) if given else "AWS S3 (default endpoint)"
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


# --- reading ------------------------------------------------------------------------------------


def one_line(e: BaseException) -> str:
    """An error as one line to show: credentials of any URL in it redacted, at most 300
    characters."""
    text = " ".join(str(e).split()) or type(e).__name__
    return redact_text(text)[:300]


def reason(e: OSError) -> str:
    """Why a read failed, to show: the transport's reason (:func:`transport_reason`), else the
    OS's, else the error's text, as :func:`one_line`."""
    return transport_reason(e) or (redact_text(e.strerror) if e.strerror else one_line(e))


# the connection never carried a request: what the OS said is the whole story
_CONNECTION_ERRNOS = {errno.ECONNREFUSED, errno.ECONNRESET, errno.EHOSTUNREACH,
                      errno.ENETUNREACH, errno.ECONNABORTED, errno.ETIMEDOUT}  # fmt: skip


def transport_reason(e: BaseException) -> str | None:
    """Why a request got no usable answer, in a few words: the connection (``connection
    refused``), the host's name, a timeout, or an HTTP error status; None for anything else (a
    missing object, bad bytes). fsspec wraps some of these (a failed HEAD becomes
    FileNotFoundError, botocore's an OSError), so the causes are searched too."""
    seen: set[int] = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        why = _transport_reason_of(x)
        if why:
            return why
        x = x.__cause__ or x.__context__
    return None


def _transport_reason_of(x: BaseException) -> str | None:
    status = getattr(x, "status", None)
    if isinstance(status, int) and hasattr(x, "request_info"):  # aiohttp.ClientResponseError
        # 404 is an answer ("not there"), which callers already say as such
        return None if status == 404 else f"HTTP {status} {getattr(x, 'message', '')}".rstrip()
    if isinstance(x, socket.gaierror):
        return f"cannot resolve the host name ({x.strerror})"
    if isinstance(x, OSError) and x.errno in _CONNECTION_ERRNOS:
        return os.strerror(x.errno).lower()
    if isinstance(x, TimeoutError) or "timeout" in type(x).__name__.lower():
        return f"timed out ({type(x).__name__})"
    return None


def transport_error(url: str, e: BaseException) -> LoaderError | None:
    """``url: connection refused`` (:func:`transport_reason`) as the one line to raise; None
    when ``e`` is no transport error."""
    why = transport_reason(e)
    return LoaderError(f"{redact_url(url)}: {why}") if why else None


def as_oserror(e: Exception) -> OSError:
    """A store's own error (botocore, aiohttp, a timeout) as the OSError readers handle."""
    if isinstance(e, OSError):
        return e
    if isinstance(e, TimeoutError) or "timeout" in type(e).__name__.lower():
        return TimeoutError(f"timed out ({type(e).__name__})")
    return OSError(one_line(e))


def read_object(url: str) -> bytes:
    """One whole-object GET."""
    try:
        return filesystem(url).cat_file(url)
    except Exception as e:  # any transport or server error: an OSError for the caller
        raise as_oserror(e) from e


def read_range(url: str, offset: int, size: int, *, chunk: int = S3_BLOCK) -> tuple[bytes, int]:
    """``size`` bytes of an object from ``offset``, in ranged GETs of at most ``chunk`` bytes
    (a large object never arrives in one response); returns the bytes and the GETs made."""
    fs = filesystem(url)
    buf = bytearray(size)
    done = calls = 0
    try:
        while done < size:
            n = min(chunk, size - done)
            part = fs.cat_file(url, start=offset + done, end=offset + done + n)
            calls += 1
            if not part:
                raise OSError(f"object ended after {done} of the {size} bytes listed")
            if len(part) > n:  # a server that ignored the Range header sent the whole object
                raise OSError(f"asked for {n} bytes, the server sent {len(part)}")
            buf[done : done + len(part)] = part
            done += len(part)
    except OSError:
        raise  # already what readers handle
    except Exception as e:  # any transport or server error: an OSError for the caller
        raise as_oserror(e) from e
    return buf, calls


class StreamReader(StreamBase):
    """The reader interface (:mod:`loaders.data.readers`) over a remote object: 1 MiB reads,
    each timed; opening it counts as reading (connection, first byte)."""

    def __init__(self, url: str) -> None:
        self._init_stream()
        self._cut: Exception | None = None  # a cut met while bytes before it were handed over
        fs = filesystem(url)
        t0 = time.perf_counter()
        try:
            if protocol(url) == "s3":
                self._f = fs.open(url, "rb", block_size=S3_BLOCK, cache_type="readahead")
            else:
                self._f = fs.open(url, "rb", block_size=0)  # one streamed GET
        except Exception as e:
            raise as_oserror(e) from e
        self.seconds = time.perf_counter() - t0

    def fill(self) -> None:
        # each chunk is its own bytes object: views into it stay valid, nothing to copy out
        self.base += self.end
        if self.eof:
            self.buf, self.pos, self.end = memoryview(b""), 0, 0
            return
        t0 = time.perf_counter()
        try:
            chunk = self._read()
        except Exception as e:
            # count every byte that crossed the network, so an error says how far the object got
            self.bytes = max(self.bytes, self._arrived())
            self.seconds += time.perf_counter() - t0
            raise as_oserror(e) from e
        self.seconds += time.perf_counter() - t0
        n = len(chunk)
        self.bytes += n
        self.buf = memoryview(chunk)
        self.pos, self.end = 0, n
        if n == 0:
            self.eof = True

    def _read(self) -> bytes:
        """The next chunk. After a cut, the bytes that arrived before it, then the cut: aiohttp
        raises it ahead of the bytes it still holds, and which samples "arrived" would hang
        on whether this read came before the close did."""
        if self._cut is None:
            try:
                return self._f.read(READ_CHUNK)
            except Exception as e:
                self._cut = e
        chunk = self._salvage()
        if not chunk:
            raise self._cut
        return chunk

    def _salvage(self) -> bytes:
        """The bytes of a cut HTTP response that aiohttp still holds behind its error (b"" for
        other transports): taken on the filesystem's event loop, the error set back after."""
        content = getattr(getattr(self._f, "r", None), "content", None)
        if content is None or not hasattr(content, "_exception") or not content.exception():
            return b""

        async def take() -> bytes:
            cut, content._exception = content._exception, None
            try:
                return content.read_nowait(READ_CHUNK)
            finally:
                content._exception = cut

        from fsspec.asyn import sync

        with contextlib.suppress(Exception):  # a salvage that fails loses only those bytes
            return sync(self._f.loop, take)
        return b""

    def _arrived(self) -> int:
        """Bytes of the response received so far, read or still buffered (0 when the
        transport does not say: an HTTP stream's aiohttp response does)."""
        content = getattr(getattr(self._f, "r", None), "content", None)
        total = getattr(content, "total_bytes", None)
        return total if isinstance(total, int) else 0

    def close(self) -> None:
        # closing a broken connection must not mask the error that broke it
        with contextlib.suppress(Exception):
            self._f.close()


def open_reader(path: str, **file_options) -> StreamBase:
    """THE reader of a shard for a path or URL: a :class:`StreamReader` for a URL, else a
    :class:`~loaders.data.readers.FileReader` (given ``file_options``)."""
    if is_url(path):
        return StreamReader(path)
    from loaders.data.readers import FileReader

    return FileReader(path, **file_options)


def read_sample(path: str, offset: int | None = None, size: int = 0) -> bytes:
    """One sample's bytes: a whole file or object (``offset`` None), or ``size`` bytes at
    ``offset`` of a shard (a URL: one ranged GET for a sample under 8 MiB)."""
    if is_url(path):
        return read_object(path) if offset is None else bytes(read_range(path, offset, size)[0])
    with open(path, "rb") as f:
        return f.read() if offset is None else os.pread(f.fileno(), size, offset)


# --- listing ------------------------------------------------------------------------------------


def _norm(url: str) -> str:
    """``url`` with its path's dot segments resolved (``a/b/../../`` → ``/``), trailing / kept."""
    parts = urlsplit(url)
    path = posixpath.normpath(parts.path or "/")
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    if parts.path.endswith("/") and not path.endswith("/"):
        path += "/"
    return parts._replace(path=path).geturl()


def _http_walk(fs, url: str) -> list[str]:
    """Files below ``url`` on a listing web server: only links that stay below it; each index
    page read once, one sort at the end."""
    top = _norm(url if url.endswith("/") else url + "/")
    found: set[str] = set()
    pages, seen = [(top, 0)], {top}
    while pages:
        base, depth = pages.pop()
        for link in fs.ls(base, detail=False):
            full = _norm(urljoin(base, link))
            parts = urlsplit(full)
            if parts.query or parts.fragment or not full.startswith(base) or full == base:
                continue
            if not full.endswith("/"):
                found.add(full)
            elif depth < 32 and full not in seen:
                seen.add(full)
                pages.append((full, depth + 1))
    return sorted(found)


def sizes(urls: list[str], progress: Callable[[int], None] | None = None) -> list[int]:
    """Each object's size (HTTP: a HEAD each, in parallel); 0 where the server would not say.
    ``progress(done)`` after each (100 k shards take a while)."""
    if not urls:
        return []
    fs = filesystem(urls[0])

    def size(u: str) -> int:
        try:
            return int(fs.size(u) or 0)
        except Exception as e:  # noqa: BLE001 - a size is a hint; the read says what is wrong
            # unless the store could not be reached: then nothing can be read, and that is why
            unreachable = transport_error(u, e)
            if unreachable is not None:
                raise unreachable from None
            return 0

    out: list[int] = []
    with ThreadPoolExecutor(max_workers=16) as pool:
        for n in pool.map(size, urls):  # in order, as each is done
            out.append(n)
            if progress is not None:
                progress(len(out))
    return out


def _listing_error(url: str, e: Exception) -> LoaderError:
    unreachable = transport_error(url, e)
    if unreachable is not None:
        return unreachable
    shown = redact_url(url)
    if isinstance(e, FileNotFoundError):
        return LoaderError(f"no such file or directory: {shown}")
    if isinstance(e, PermissionError):
        return LoaderError(f"permission denied: {shown} ({one_line(e)})")
    return LoaderError(f"cannot list {shown}: {one_line(as_oserror(e))}")


def list_objects(url: str) -> dict[str, int]:
    """Every object below ``url`` (or ``url`` itself, one object) with its size (0: unknown),
    dot-folders and dot-files left out."""
    fs = filesystem(url)
    try:
        if not url.endswith("/") and fs.isfile(url):
            return {url: int(fs.size(url) or 0)}
        if protocol(url) == "s3":
            found = fs.find(url.rstrip("/"), detail=True)
            listing = {fs.unstrip_protocol(k): int(v.get("size") or 0) for k, v in found.items()}
        else:
            listing = dict.fromkeys(_http_walk(fs, url), 0)
    except Exception as e:  # noqa: BLE001 - every transport error becomes one line
        raise _listing_error(url, e) from None
    return {
        k: v
        for k, v in listing.items()
        if not any(p.startswith(".") for p in k[len(url) :].strip("/").split("/") if p)
    }


def glob(pattern: str) -> list[str]:
    """Objects matching a glob pattern (``s3://b/p/*.tar``; HTTP needs index pages)."""
    fs = filesystem(pattern)
    try:
        found = fs.glob(pattern)
    except Exception as e:  # noqa: BLE001
        raise _listing_error(pattern, e) from None
    if protocol(pattern) == "s3":
        return sorted(fs.unstrip_protocol(p) for p in found)
    return sorted(str(p) for p in found)
