"""The system under test, as far as this client can see it: where the data's bytes come from.

For a path: the mount it lives on (filesystem type, source or server, mount options, from the
mount table), and for a local block device its model, rotational flag, read-ahead and scheduler.
For a URL: the scheme, the endpoint (no credentials) and whether credentials were used. Network
and FUSE filesystems keep client-side caches (attributes, pages) that a cold pass may not empty:
:func:`client_cache_caveat` says so.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from feedbench.core.files import read_stripped

NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "lustre", "9p",
              "afs", "beegfs", "gpfs", "wekafs", "virtiofs")  # fmt: skip


@dataclass
class BlockDevice:
    name: str
    model: str | None = None
    rotational: bool | None = None
    read_ahead_kb: int | None = None
    scheduler: str | None = None
    size_bytes: int | None = None


@dataclass
class SystemUnderTest:
    """Where a dataset's bytes come from (``kind``: "mount" for a path, "url" for a URL)."""

    kind: str
    fstype: str | None = None  # e.g. ext4, nfs4, fuse.rclone
    source: str | None = None  # the mount's source: a device, or server:/export
    mount_point: str | None = None
    mount_options: str | None = None
    block_device: BlockDevice | None = None
    scheme: str | None = None  # URL: s3, http, https
    endpoint: str | None = None  # URL: the host (S3: the endpoint), no credentials
    credentials: bool | None = None  # URL: whether credentials were used
    network: bool = False  # bytes cross a network (a network or FUSE filesystem, a URL)


def _unescape(text: str) -> str:
    """Mount table fields escape spaces, tabs, newlines and backslashes as octal."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(code, char)
    return text


def mount_of(path: str, table: str = "/proc/self/mounts") -> dict[str, str]:
    """The mount holding ``path`` (longest mount point that contains it): device, mount point,
    filesystem type, options; empty where the table cannot be read."""
    real = os.path.realpath(path)
    best: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path(table).read_text().splitlines():
            parts = line.split()
            if len(parts) < 4:
                continue
            dev, mnt, fstype, opts = (_unescape(p) for p in parts[:4])
            inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
            if inside and len(mnt) >= len(best.get("mount", "")):
                best = {"device": dev, "mount": mnt, "fstype": fstype, "options": opts}
    return best


def block_device(device: str) -> BlockDevice | None:
    """The whole disk behind ``/dev/...`` (a partition's disk), from sysfs."""
    if not device.startswith("/dev/"):
        return None
    name = os.path.basename(os.path.realpath(device))
    part = Path("/sys/class/block") / name
    if not part.exists():
        return None
    if (part / "partition").exists():
        name = part.resolve().parent.name
    base = Path("/sys/block") / name
    ra = read_stripped(base / "queue" / "read_ahead_kb")
    rot = read_stripped(base / "queue" / "rotational")
    size = read_stripped(base / "size")
    scheduler = read_stripped(base / "queue" / "scheduler") or ""  # "none [mq-deadline] kyber"
    chosen = scheduler.partition("[")[2].partition("]")[0] or scheduler or None
    return BlockDevice(
        name=name,
        model=read_stripped(base / "device" / "model"),
        rotational=None if rot is None else rot == "1",
        read_ahead_kb=int(ra) if ra and ra.isdigit() else None,
        scheduler=chosen,
        size_bytes=int(size) * 512 if size and size.isdigit() else None,
    )


def is_network(fstype: str | None) -> bool:
    return bool(fstype) and (fstype in NETWORK_FS or fstype.startswith(("fuse", "nfs")))


def describe_path(path: str) -> SystemUnderTest:
    mount = mount_of(path)
    fstype = mount.get("fstype")
    return SystemUnderTest(
        kind="mount",
        fstype=fstype,
        source=mount.get("device"),
        mount_point=mount.get("mount"),
        mount_options=mount.get("options"),
        block_device=block_device(mount.get("device", "")),
        network=is_network(fstype),
    )


def describe_url(url: str, environ: dict[str, str] | None = None) -> SystemUnderTest:
    from loaders.data.remote import endpoint, protocol

    env = os.environ if environ is None else environ
    parts = urlsplit(url)
    scheme = protocol(url)
    if scheme == "s3":
        has_keys = bool(env.get("AWS_ACCESS_KEY_ID") or env.get("AWS_PROFILE"))
        creds = has_keys or Path(os.path.expanduser("~/.aws/credentials")).exists()
    else:
        creds = bool(parts.username or parts.password)
    return SystemUnderTest(
        kind="url", scheme=scheme, endpoint=endpoint(url), credentials=creds, network=True
    )


def describe(path: str) -> SystemUnderTest:
    from loaders.data.remote import is_url

    return describe_url(path) if is_url(path) else describe_path(path)


def client_cache_caveat(system: SystemUnderTest) -> str | None:
    """Why a cold pass may not be cold all the way to the storage, or None."""
    if system.kind == "url":
        return (
            "remote source: 'cold' means this machine holds no copy (reads bypass any client "
            "cache); the server's own caches are out of feedbench's reach, so a second pass may "
            "be served from its memory"
        )
    if system.network:
        return (
            f"{system.fstype} filesystem ({system.source}): 'cold' evicts this machine's page "
            "cache, but the client may keep its own caches (FUSE or NFS attribute and data "
            "caches, per its mount options) and the server its memory; a cold pass can be "
            "partly served from them"
        )
    return None
