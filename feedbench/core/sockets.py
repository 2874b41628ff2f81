"""Bytes arriving on a job's TCP connections, read from the kernel (``ss``, iproute2): what tells
storage that is slow (bytes arriving, slower than a batch needs) from storage that stopped (no
byte). Asked only when a job looks stalled, so its cost never reaches a measurement."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from typing import NamedTuple

_PID = re.compile(r"pid=(\d+)")
_INODE = re.compile(r"\bino:(\d+)")
_RECEIVED = re.compile(r"\bbytes_received:(\d+)")


class _Connection(NamedTuple):
    owners: frozenset[int]
    local: str  # address:port
    peer: str
    received: int


def received(pids: Iterable[int], inside: Iterable[int] = ()) -> dict[int, int] | None:
    """Bytes received so far by each TCP connection (by socket inode) of the processes ``pids``
    from outside them and ``inside`` (connections among them, a process group's own store, are
    left out); None where ``ss`` cannot say (not installed, not Linux)."""
    try:
        text = subprocess.run(
            ["ss", "-tinpeH", "state", "established"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return outside(_connections(text), pids, inside)


def outside(
    found: dict[int, _Connection], pids: Iterable[int], inside: Iterable[int] = ()
) -> dict[int, int]:
    """Bytes received by each connection of ``pids`` whose peer is none of theirs or
    ``inside``'s (a consumer's connection to another consumer's store is left out)."""
    wanted = frozenset(pids)
    own = wanted | frozenset(inside)
    ours = {c.local for c in found.values() if c.owners & own}
    return {ino: c.received for ino, c in found.items()
            if c.owners & wanted and c.peer not in ours}  # fmt: skip


def _connections(text: str) -> dict[int, _Connection]:
    """``ss -tinpeH`` output by socket inode: a line per connection, its details indented."""
    out: dict[int, _Connection] = {}
    head: list[str] = []
    for line in text.splitlines():
        if line and not line[0].isspace():
            head = line.split()
        inode, got = _INODE.search(" ".join(head)), _RECEIVED.search(line)
        if got and inode and len(head) >= 4:
            owners = frozenset(int(p) for p in _PID.findall(" ".join(head)))
            out[int(inode.group(1))] = _Connection(owners, head[2], head[3], int(got.group(1)))
    return out


def arrived(before: dict[int, int], after: dict[int, int]) -> int:
    """Bytes received between two :func:`received` readings (a new connection's all count)."""
    return sum(max(0, n - before.get(ino, 0)) for ino, n in after.items())
