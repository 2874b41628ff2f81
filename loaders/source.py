"""What a loader reads: an image tree or WebDataset tar shards, listed once into numpy arrays.

``open_source(path)`` accepts

* an image tree in ImageFolder layout (``root/<class>/**/<image>``; labels are the class folders in
  sorted order), or
* WebDataset shards: a directory holding ``.tar`` files, one ``.tar``, a glob, or a brace list
  (``shards/shard-{00000..00015}.tar``). A sample is the run of consecutive members sharing a key
  (the member name up to the first dot of its base name); its image is the ``jpg``/``jpeg``/``png``/
  ``webp`` member and its label the ``cls`` member (a decimal integer).

Everything is listed ONCE, at build time, into numpy arrays (no per-sample Python objects, so
DataLoader workers do not grow by copy-on-read), and every backend reads the same list.

Bad input found while listing is skipped and counted in :attr:`SampleIndex.skipped`, the same way
for every backend: files without an image extension in a tree, a sample with no image or no label,
a label that is not an integer, and the tail of a truncated shard (the members that are complete
are kept).
"""

from __future__ import annotations

import glob
import os
import tarfile
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from loaders.errors import LoaderError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
SHARD_IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
LABEL_EXT = "cls"


class Skipped(NamedTuple):
    """One sample (or file) a loader skipped, and why."""

    path: str
    reason: str


class StringTable:
    """Many strings in one byte buffer plus offsets: no Python object per string."""

    def __init__(self, strings: list[str]) -> None:
        encoded = [s.encode("utf-8", "surrogateescape") for s in strings]
        lengths = np.fromiter((len(b) for b in encoded), dtype=np.int64, count=len(encoded))
        self.offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.offsets[1:])
        self.buffer = np.frombuffer(b"".join(encoded), dtype=np.uint8).copy()

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> str:
        a, b = self.offsets[i], self.offsets[i + 1]
        return self.buffer[a:b].tobytes().decode("utf-8", "surrogateescape")

    def tolist(self) -> list[str]:
        return [self[i] for i in range(len(self))]


@dataclass
class SampleIndex:
    """Every sample of a source. ``kind`` is ``"tree"`` or ``"shards"``.

    Tree: ``paths[i]`` is sample i's file. Shards: sample i is ``names[i]`` inside
    ``shards[shard_of[i]]``, its image bytes at ``offset[i]`` (``size[i]`` bytes) and its label
    member at ``label_offset[i]`` (``label_size[i]`` bytes). ``labels[i]`` is its class.
    """

    kind: str
    root: str
    labels: np.ndarray  # int64 [N]
    classes: list[str]
    paths: StringTable | None = None  # tree
    shards: list[str] = field(default_factory=list)  # shards
    shard_of: np.ndarray | None = None  # int32 [N]
    offset: np.ndarray | None = None  # int64 [N]
    size: np.ndarray | None = None  # int64 [N]
    label_offset: np.ndarray | None = None
    label_size: np.ndarray | None = None
    names: StringTable | None = None  # image member name, e.g. "000123.jpg"
    skipped: list[Skipped] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def describe(self, i: int) -> str:
        """Where sample ``i`` lives, for error messages: a path, or ``shard.tar:member``."""
        if self.kind == "tree":
            assert self.paths is not None
            return self.paths[i]
        assert self.names is not None and self.shard_of is not None
        return f"{self.shards[int(self.shard_of[i])]}:{self.names[i]}"

    def read(self, i: int) -> bytes:
        """The encoded image of sample ``i`` (plain reads; the backends use their own readers)."""
        if self.kind == "tree":
            assert self.paths is not None
            with open(self.paths[i], "rb") as f:
                return f.read()
        assert self.shard_of is not None and self.offset is not None and self.size is not None
        with open(self.shards[int(self.shard_of[i])], "rb") as f:
            return os.pread(f.fileno(), int(self.size[i]), int(self.offset[i]))

    def samples_per_shard(self) -> np.ndarray:
        assert self.shard_of is not None
        return np.bincount(self.shard_of, minlength=len(self.shards)).astype(np.int64)


def expand_pattern(pattern: str) -> list[str]:
    """Brace lists (``shard-{000..009}.tar``) and globs, as WebDataset users write them."""
    import braceexpand  # ships with webdataset

    out: list[str] = []
    for item in braceexpand.braceexpand(pattern):
        out.extend(sorted(glob.glob(item)) if glob.has_magic(item) else [item])
    return out


def open_source(source: str | os.PathLike[str], fmt: str = "auto") -> SampleIndex:
    """List ``source`` once: an ImageFolder tree or WebDataset shards (``fmt`` forces one)."""
    if fmt not in ("auto", "tree", "shards"):
        raise LoaderError(f"unknown source format {fmt!r}: choose auto, tree or shards")
    if isinstance(source, (list, tuple)):
        return _index_shards([os.fspath(p) for p in source])
    path = os.fspath(source)
    if "{" in path or glob.has_magic(path):
        paths = expand_pattern(path)
        if not paths:
            raise LoaderError(f"no files match {path}")
        return _index_shards(paths)
    if not os.path.exists(path):
        raise LoaderError(f"no such file or directory: {path}")
    if os.path.isfile(path):
        if path.endswith(".tar"):
            return _index_shards([path])
        raise LoaderError(f"{path} is a file: give an image tree or .tar shards")
    tars = sorted(
        os.path.join(path, n) for n in os.listdir(path) if n.endswith(".tar") and n[0] != "."
    )
    if fmt == "shards" or (fmt == "auto" and tars):
        if not tars:
            raise LoaderError(f"no .tar shards in {path}")
        return _index_shards(tars)
    return _index_tree(path)


def _index_tree(root: str) -> SampleIndex:
    classes = sorted(
        e.name for e in os.scandir(root) if e.is_dir(follow_symlinks=True) and e.name[0] != "."
    )
    if not classes:
        raise LoaderError(f"{root} has no class folders (ImageFolder layout: root/<class>/<image>)")
    paths: list[str] = []
    labels: list[int] = []
    skipped: list[Skipped] = []
    used: list[str] = []
    for name in classes:
        found = 0
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, name), followlinks=True):
            dirnames[:] = sorted(d for d in dirnames if d[0] != ".")
            for fn in sorted(filenames):
                if fn[0] == ".":
                    continue
                full = os.path.join(dirpath, fn)
                if os.path.splitext(fn)[1].lower() in IMAGE_EXTENSIONS:
                    paths.append(full)
                    labels.append(len(used))
                    found += 1
                else:
                    skipped.append(Skipped(full, "not an image file (extension)"))
        if found:
            used.append(name)
    if not paths:
        raise LoaderError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) under {root}")
    return SampleIndex(
        kind="tree",
        root=root,
        labels=np.asarray(labels, dtype=np.int64),
        classes=used,
        paths=StringTable(paths),
        skipped=skipped,
    )


def split_member_name(name: str) -> tuple[str, str]:
    """WebDataset's rule: the key is the name up to the first dot of the base name."""
    slash = name.rfind("/") + 1
    dot = name.find(".", slash)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1 :].lower()


def _index_shards(paths: list[str]) -> SampleIndex:
    if not paths:
        raise LoaderError("no shards given")
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise LoaderError(f"shard not found: {missing[0]} ({len(missing)} of {len(paths)} missing)")
    cols: dict[str, list[int]] = {k: [] for k in ("shard", "off", "size", "loff", "lsize", "lab")}
    names: list[str] = []
    skipped: list[Skipped] = []
    for s, path in enumerate(paths):
        with open(path, "rb") as f:
            fd = f.fileno()
            samples = list(_shard_samples(path))
            for member, img, lab, problem in samples:
                where = f"{path}:{member}"
                if problem:
                    skipped.append(Skipped(where, problem))
                    continue
                assert img is not None and lab is not None
                try:
                    label = int(os.pread(fd, lab[1], lab[0]).strip())
                    if label < 0:
                        raise ValueError
                except ValueError:
                    skipped.append(Skipped(where, "label is not a non-negative integer"))
                    continue
                cols["shard"].append(s)
                cols["off"].append(img[0])
                cols["size"].append(img[1])
                cols["loff"].append(lab[0])
                cols["lsize"].append(lab[1])
                cols["lab"].append(label)
                names.append(img[2])
    if not names:
        reason = f" ({skipped[0].path}: {skipped[0].reason})" if skipped else ""
        raise LoaderError(f"no usable samples in {len(paths)} shards{reason}")
    labels = np.asarray(cols["lab"], dtype=np.int64)
    return SampleIndex(
        kind="shards",
        root=os.path.dirname(paths[0]) or ".",
        labels=labels,
        classes=[str(c) for c in range(int(labels.max()) + 1)],
        shards=list(paths),
        shard_of=np.asarray(cols["shard"], dtype=np.int32),
        offset=np.asarray(cols["off"], dtype=np.int64),
        size=np.asarray(cols["size"], dtype=np.int64),
        label_offset=np.asarray(cols["loff"], dtype=np.int64),
        label_size=np.asarray(cols["lsize"], dtype=np.int64),
        names=StringTable(names),
        skipped=skipped,
    )


_Member = tuple[int, int, str]  # data offset, size, member name


def _shard_samples(path: str):
    """Yield ``(member, image, label, problem)`` per sample of one tar, grouping by key."""
    file_size = os.path.getsize(path)
    key: str | None = None
    parts: dict[str, _Member] = {}

    def finish():
        img = next((parts[e] for e in SHARD_IMAGE_EXTS if e in parts), None)
        lab = parts.get(LABEL_EXT)
        first = next(iter(parts.values()))[2]
        if img is None:
            return (first, None, None, "sample has no image (jpg/jpeg/png/webp)")
        if lab is None:
            return (img[2], None, None, "sample has no label (.cls)")
        return (img[2], img, lab, None)

    try:
        tf = tarfile.open(path, "r:")  # noqa: SIM115
    except (tarfile.TarError, OSError) as e:
        yield (os.path.basename(path), None, None, f"not a readable tar file ({e})")
        return
    truncated = None
    with tf:
        while True:
            try:
                info = tf.next()
            except (tarfile.TarError, OSError) as e:
                truncated = f"truncated or damaged shard ({e})"
                break
            if info is None:
                break
            if not info.isfile():
                continue
            k, ext = split_member_name(info.name)
            if not k or k.endswith("/"):
                continue
            if info.offset_data + info.size > file_size:
                truncated = f"truncated shard: {info.name} is cut off"
                break
            if k != key and parts:
                yield finish()
                parts = {}
            key = k
            parts.setdefault(ext, (info.offset_data, info.size, info.name))
    if parts:
        last = finish()
        if truncated and last[3] is not None:
            last = (last[0], None, None, truncated)  # the cut-off sample itself
            truncated = None
        yield last
    if truncated:
        yield ("(end)", None, None, truncated)
