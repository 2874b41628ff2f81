"""THE tar reader: a shard's 512-byte headers walked in place, its members grouped into samples.

:func:`iter_shard` reads ustar, GNU long names and pax path/size records (other special members
are skipped) from any reader of :mod:`loaders.data.readers`, and yields one :class:`RawSample`
per sample (WebDataset grouping, :mod:`loaders.data.formats`): its image, its label, the bytes and
seconds read since the previous sample. A truncated stream or a header whose checksum is wrong
ends the shard with one error record, after the good samples before it.

It runs in series with the read calls of a one-consumer scan, so it is one generator per shard
(no member-level generator between it and the tar) and the common case is written out inline: a
header lies in the read buffer (headers are 512-byte aligned, refills 1 MiB), its fields are
unpacked in one call and checked where they lie, and a payload that lies in the buffer is sliced
from it (``views=True``: no copy; valid until the next sample is asked for); anything else goes
through the reader's methods. The image being grouped sits in ``reader.hold``, which the reader
copies out before a refill overwrites it.

``listing=True`` reads no image payload (a sparse reader seeks past them) and records where each
sample's image and label lie instead (``RawSample.at``): how the loaders index shards.
"""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Iterator

from loaders.data.formats import IMAGE_MEMBER_EXTS_B, LABEL_EXT_B


class RawSample:
    """One sample's bytes as read from storage, or why it could not be read.

    ``key``: the file path, or ``"shard.tar:key"``; ``data``: the image bytes (a memoryview only
    when asked for views); ``read_bytes`` / ``read_s``: what reading it cost (payload and container
    overhead); ``at``: with ``listing``, ``(image offset, image size, image member name, label
    offset, label size)`` in the shard.
    """

    __slots__ = ("key", "data", "label", "read_bytes", "read_s", "error", "at")

    def __init__(self, key, data, label, read_bytes, read_s, error=None, at=None) -> None:
        self.key = key
        self.data = data
        self.label = label
        self.read_bytes = read_bytes
        self.read_s = read_s
        self.error = error
        self.at = at

    def __repr__(self) -> str:
        size = None if self.data is None else len(self.data)
        return f"RawSample({self.key!r}, {size} bytes, label={self.label}, error={self.error!r})"


class TarFormatError(Exception):
    """The shard is truncated or its headers are corrupt."""


NO_IMAGE = "no image member"
ZERO_IMAGE = "zero-byte image member"
BAD_LABEL = "missing or bad label (.cls)"


def _octal(field: bytes) -> int:
    if field and field[0] & 0x80:  # GNU base-256 for sizes of 8 GiB and more
        return int.from_bytes(field[1:], "big")
    try:
        return int(field.rstrip(b" \0"), 8)  # the usual "0001234\0" or "012345\0 "
    except ValueError:
        pass
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def header_sum(header: bytes) -> int:
    """The ustar checksum: the unsigned sum of the header's bytes, its checksum field as 8 spaces.

    Summed by zlib's Adler-32 (component A = 1 + the sum of the bytes, modulo 65521) over pieces
    of at most 256 bytes, whose sums (≤ 65,280) never wrap: exact, and 5× faster than ``sum()``.
    """
    return (
        (zlib.adler32(header[:148]) & 0xFFFF)
        + (zlib.adler32(header[156:412]) & 0xFFFF)
        + (zlib.adler32(header[412:512]) & 0xFFFF)
        - 3
        + 8 * 32
    )


def _pax_path(payload: bytes) -> tuple[str | None, int | None]:
    path, size = None, None
    for record in payload.split(b"\n"):
        _, _, kv = record.partition(b" ")
        key, _, value = kv.partition(b"=")
        if key == b"path":
            path = value.decode("utf-8", "replace")
        elif key == b"size":
            size = int(value)
    return path, size


def _text(name: bytes) -> str:
    return name.decode("utf-8", "replace")


def parse_label(data) -> int | None:
    """A ``.cls`` payload: a non-negative decimal integer (surrounding whitespace allowed)."""
    try:
        label = int(bytes(data))  # int() takes ASCII digits and whitespace
    except ValueError:
        return None
    return label if label >= 0 else None


# name, size, checksum and type flag: read from every header in one C call
_HEADER = struct.Struct("100s24x12s12x8s1s")
_ZERO_BLOCK = bytes(512)
_REGULAR = (b"0", b"\0", b"7")


def emit(full: str, image, label: int | None, nbytes: int, seconds: float) -> RawSample:
    """Sample ``full`` ("shard.tar:key"); ``nbytes`` and ``seconds``: read since the previous
    sample (headers, padding and payload of this sample)."""
    if image is None:
        return RawSample(full, None, label, nbytes, seconds, NO_IMAGE)
    if not image:
        return RawSample(full, None, label, nbytes, seconds, ZERO_IMAGE)
    if label is None:
        return RawSample(full, None, None, nbytes, seconds, BAD_LABEL)
    return RawSample(full, image, label, nbytes, seconds)


def _listed(full: str, image_at, label, label_at, nbytes: int, seconds: float) -> RawSample:
    """A listing record: where the sample's members lie, or why it is unusable."""
    if image_at is None:
        return RawSample(full, None, label, nbytes, seconds, NO_IMAGE)
    if label is None or label_at is None:
        return RawSample(full, None, None, nbytes, seconds, BAD_LABEL, (*image_at, -1, 0))
    return RawSample(full, None, label, nbytes, seconds, None, (*image_at, *label_at))


def _short_header(reader):
    """The next header when the buffer holds less than one: ``(buf, 0)``, or None at the end
    of the file (at a member boundary: tolerated, as tarfile does)."""
    header = reader.read(512)
    if not header:
        return None
    if len(header) < 512:
        raise TarFormatError("truncated header")
    return memoryview(header), 0


def _extended(reader, kind: bytes, size: int, padded: int) -> tuple[bytes | None, int | None]:
    """A GNU long name (``L``) or pax record (``x``) member: the name and size it gives the next
    member."""
    payload = reader.read(size)
    if len(payload) < size or reader.skip(padded - size) < padded - size:
        raise TarFormatError("truncated extended header")
    if kind == b"L":
        return payload.rstrip(b"\0"), None
    text, pax_size = _pax_path(payload)
    return (text.encode("utf-8", "surrogateescape") if text else None), pax_size


def _key_in_folder(member: bytes) -> tuple[bytes, bytes]:
    """WebDataset's key and extension of a member whose folder name holds a dot."""
    dot = member.find(b".", member.rfind(b"/") + 1)
    return (member, b"") if dot < 0 else (member[:dot], member[dot + 1 :].lower())


def _with_prefix(buf, off: int, member: bytes) -> bytes:
    """A ustar member name longer than 100 bytes: its prefix field, a slash, its name field."""
    return bytes(buf[off + 345 : off + 500]).split(b"\0", 1)[0] + b"/" + member


def _skip_member(reader, padded: int, member: bytes) -> None:
    if reader.skip(padded) < padded:
        raise TarFormatError(f"truncated member {_text(member)}")


def _copy_payload(reader, size: int, padded: int, member: bytes):
    """A payload that does not lie whole in the buffer with its padding, as new bytes (the
    padding's refill would overwrite a view; one that spans refills is joined anyway)."""
    data = reader.read(size)
    if len(data) < size:
        raise TarFormatError(f"truncated member {_text(member)}")
    if reader.skip(padded - size) < padded - size:
        raise TarFormatError(f"truncated padding after {_text(member)}")
    return data


def _skip_listed(reader, ext: bytes, member: bytes, size: int, padded: int, image_at):
    """Listing: an image or other member is skipped, not read; returns the sample's image
    position (the first image member's)."""
    if image_at is None and ext in IMAGE_MEMBER_EXTS_B:
        image_at = (reader.tell(), size, _text(member))
    if reader.skip(padded) < size:
        raise TarFormatError(f"truncated member {_text(member)}")
    return image_at


def _upper_case(ext: bytes, data, views: bool, hold: list, label):
    """An image or label member whose extension is upper case: as the hot path does; returns
    the label."""
    if ext in IMAGE_MEMBER_EXTS_B and hold[0] is None:
        hold[0] = data if views else bytes(data)
    elif ext == LABEL_EXT_B:
        return parse_label(data)
    return label


def iter_shard(
    reader, path: str, *, views: bool = False, listing: bool = False
) -> Iterator[RawSample]:
    """The samples of the shard at ``path`` (a path or URL) read through ``reader`` (closed at
    the end), keyed ``"shard.tar:key"``; a shard-level error is keyed by ``path``."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    hold = reader.hold  # [the sample's image: bytes, or a view into the reader's buffer]
    current: bytes | None = None  # the sample's key (UTF-8 bytes)
    label: int | None = None
    image_at = label_at = None  # listing: (offset, size, member name), (offset, size)
    mark_bytes, mark_s = 0, 0.0
    long_name, pax_size = None, None  # what an extended header says of the next member
    # globals as locals: looked up once per shard, not per member
    unpack, images, label_ext, make = _HEADER.unpack_from, IMAGE_MEMBER_EXTS_B, LABEL_EXT_B, emit
    error: str | None = None
    try:
        while True:
            off = reader.pos
            if off == reader.end and not reader.eof:
                reader.fill()
                off = reader.pos
            if reader.end - off >= 512:
                buf = reader.buf
                reader.pos = off + 512
            elif (got := _short_header(reader)) is None:
                break
            else:
                buf, off = got
            name_f, size_f, sum_f, kind = unpack(buf, off)
            if name_f[0] == 0 and buf[off : off + 512] == _ZERO_BLOCK:
                break  # end-of-archive marker
            if _octal(sum_f) != header_sum(buf[off : off + 512]):
                raise TarFormatError("bad header checksum")
            size = _octal(size_f)
            if pax_size is not None:
                size, pax_size = pax_size, None
            padded = (size + 511) & ~511
            if kind in (b"L", b"x"):
                long_name, pax_size = _extended(reader, kind, size, padded)
                continue
            if long_name is not None:
                member, long_name = long_name, None
            else:
                member = name_f.split(b"\0", 1)[0]
                if buf[off + 257 : off + 262] == b"ustar" and buf[off + 345] != 0:
                    member = _with_prefix(buf, off, member)
            if kind not in _REGULAR:  # directories, links, devices: nothing to read
                _skip_member(reader, padded, member)
                continue
            key, _, ext = member.partition(b".")  # WebDataset's key, inline: the hot path
            if b"/" in ext:
                key, ext = _key_in_folder(member)
            if key != current and current is not None:
                b, t = reader.bytes, reader.seconds
                full = f"{name}:{current.decode('utf-8', 'replace')}"
                if listing:
                    yield _listed(full, image_at, label, label_at, b - mark_bytes, t - mark_s)
                else:
                    yield make(full, hold[0], label, b - mark_bytes, t - mark_s)
                # the consumer is done with that sample (and its view into the buffer)
                hold[0] = image_at = label_at = label = None
                mark_bytes, mark_s = b, t
            current = key
            if listing:
                ext = ext.lower()
                if ext != label_ext:  # where it lies, not what it holds
                    image_at = _skip_listed(reader, ext, member, size, padded, image_at)
                    continue
                label_at = (reader.tell(), size)
            start = reader.pos
            if start + padded <= reader.end:  # payload and padding in the buffer
                data = reader.buf[start : start + size]
                reader.pos = start + padded
            else:
                data = _copy_payload(reader, size, padded, member)
            if ext in images:
                if hold[0] is None:  # the sample's first image member
                    hold[0] = data if views else bytes(data)
            elif ext == label_ext:
                try:  # parse_label, inline (the hot path): ASCII digits and whitespace
                    label = int(bytes(data))
                    label = label if label >= 0 else None
                except ValueError:
                    label = None
            elif ext != ext.lower():  # (rare) an upper-case extension
                label = _upper_case(ext.lower(), data, views, hold, label)
        reader.drain()  # the archive's end padding too, as any whole-object reader reads it
        if current is not None:
            full = f"{name}:{current.decode('utf-8', 'replace')}"
            b, t = reader.bytes - mark_bytes, reader.seconds - mark_s
            if listing:
                yield _listed(full, image_at, label, label_at, b, t)
            else:
                yield make(full, hold[0], label, b, t)
    except (TarFormatError, OSError) as e:
        error = f"truncated or corrupt shard after {reader.bytes} bytes ({e})"
    finally:
        reader.close()
    if error is not None:
        yield RawSample(path, None, None, reader.bytes - mark_bytes, 0.0, error)


def timed_open(open_reader, path: str, latency_s: float = 0.0):
    """``open_reader(path)`` with ``latency_s`` of emulated storage latency first; the reader's
    ``seconds`` count both. An OSError comes back as ``(None, why)``."""
    t0 = time.perf_counter()
    if latency_s > 0:
        time.sleep(latency_s)
    try:
        reader = open_reader(path)
    except OSError as e:
        return None, e.strerror or " ".join(str(e).split()) or type(e).__name__
    reader.seconds += time.perf_counter() - t0
    return reader, None
