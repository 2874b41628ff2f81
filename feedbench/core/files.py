"""The one way feedbench writes a file: atomically (temp file + rename), with the umask's mode."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _file_mode() -> int:
    """The mode a new file gets from this process's umask (a temp file is made 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write ``data`` to ``path`` via a temp file in the same folder and a rename; the file gets
    the mode the umask gives a new file. An OSError (a full disk) names ``path``; the temp file is
    gone and ``path`` as it was."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), _file_mode())
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename is None:  # write(): no name of its own
            raise OSError(e.errno, e.strerror, str(target)) from e
        raise


@contextmanager
def naming(path: str | os.PathLike[str]) -> Iterator[None]:
    """An OSError within that names no file names ``path``: write() and close() on a full disk
    name none, and a one-line error should say which file could not be written (a writer
    process's error crosses to its parent by pickle, the name with it)."""
    try:
        yield
    except OSError as e:
        if e.filename is not None:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from e


def read_stripped(path: Path) -> str | None:
    """A small text file's content without surrounding blanks (a /proc or /sys entry), or None
    when it cannot be read."""
    try:
        return path.read_text().strip()
    except (OSError, ValueError):  # ValueError: not text (UnicodeDecodeError)
        return None
