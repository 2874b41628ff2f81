"""Listing a local folder: links followed but each folder visited once, unreadable folders and
files named like every other file left out, and a large tree listed whole (issue 24)."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from feedbench.core.envelope import DatasetInfo
from feedbench.core.listing import skipped_files, skipped_warning
from loaders.data import Skipped, locate

NOBODY = 65534  # the unprivileged user (and group) the permission test lists as


def _tree(root: Path, classes: dict[str, int]) -> None:
    for name, n in classes.items():
        (root / name).mkdir(parents=True)
        for i in range(n):
            (root / name / f"{i}.jpg").write_bytes(b"\xff\xd8 tiny")


def _reasons(layout, root: Path) -> list[tuple[str, str]]:
    return [(os.path.relpath(s.path, root), s.reason.replace(str(root), "ROOT"))
            for s in layout.skipped]  # fmt: skip


def test_a_symlink_loop_is_visited_once_and_named(tmp_path):
    root = tmp_path / "d"
    _tree(root, {"cat": 2, "dog": 3})
    (root / "cat" / "loop").symlink_to("..")  # back to the root: a walk that follows it never ends
    outside = tmp_path / "extra" / "bird"
    _tree(outside.parent, {"bird": 1})
    (root / "bird").symlink_to(outside)  # a class folder that is a link: listed
    (root / "dog" / "bird2").symlink_to(outside)  # the same folder again: named, not listed twice
    layout = locate(root)
    assert layout.classes == ["bird", "cat", "dog"]
    assert [os.path.relpath(f, root) for f in layout.files] == [
        "bird/0.jpg", "cat/0.jpg", "cat/1.jpg", "dog/0.jpg", "dog/1.jpg", "dog/2.jpg",
    ]  # fmt: skip
    assert list(layout.labels) == [0, 1, 1, 2, 2, 2]
    assert _reasons(layout, root) == [
        ("cat/loop", "symbolic link loop"),
        ("dog/bird2", "already listed as ROOT/bird"),
    ]
    count, named = skipped_files(layout.skipped)
    assert count == 2 and named[0].path == str(root / "cat" / "loop")


def _traversable(path: Path) -> list[tuple[Path, int]]:
    """Let every user pass through ``path``'s folders (search only, no listing); returns what
    to restore. pytest's own temporary root is private to its user."""
    changed = []
    for folder in [path, *path.parents]:
        mode = folder.stat().st_mode
        if not mode & stat.S_IXOTH:
            changed.append((folder, stat.S_IMODE(mode)))
            folder.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
    return changed


def _list_as_nobody(root: Path) -> dict:
    """``locate(root)`` in a forked child that dropped to user and group 65534 (root's
    override would read any folder), its files and skipped entries sent back as JSON. The
    child is forked, not started: this interpreter may sit where that user cannot run it."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            layout = locate(root)
            out = {"files": layout.files, "skipped": [list(s) for s in layout.skipped]}
        except BaseException as e:  # noqa: BLE001 - whatever it is, the parent shows it
            out, code = {"error": f"{type(e).__name__}: {e}"}, 1
        with os.fdopen(write_end, "w") as f:
            json.dump(out, f)
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        got = json.load(f)
    os.waitpid(pid, 0)
    return got


def test_an_unreadable_folder_and_file_are_counted_and_named(tmp_path):
    root = tmp_path / "d"
    _tree(root, {"cat": 2, "dog": 2, "fish": 5})
    for p in [root, *root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    (root / "fish").chmod(0)  # 5 images nobody may list
    (root / "dog" / "1.jpg").chmod(0)  # one image nobody may read
    restore = _traversable(tmp_path)
    try:
        if os.geteuid() == 0:
            got = _list_as_nobody(root)
        else:  # the permission bits already apply to this user
            layout = locate(root)
            got = {"files": layout.files, "skipped": [list(s) for s in layout.skipped]}
    finally:
        (root / "fish").chmod(0o755)
        for folder, mode in restore:
            folder.chmod(mode)
    assert "error" not in got, got
    assert [os.path.relpath(f, root) for f in got["files"]] == [
        "cat/0.jpg",
        "cat/1.jpg",
        "dog/0.jpg",
    ]
    assert [(os.path.relpath(p, root), why) for p, why in got["skipped"]] == [
        ("dog/1.jpg", "unreadable (Permission denied)"),
        ("fish", "unreadable folder (Permission denied)"),
    ]
    # the same entries reach a results file and the one warning, as any file left out
    count, named = skipped_files([Skipped(*s) for s in got["skipped"]])
    dataset = DatasetInfo(str(root), "tree", 3, 0, 3, count, named)
    (warning,) = skipped_warning(dataset)
    assert warning.startswith("2 files left out when listing: ")
    assert f"{root / 'fish'}: unreadable folder (Permission denied)" in warning


@pytest.mark.slow
def test_a_100k_file_tree_is_listed_whole(tmp_path):
    root = tmp_path / "big"
    classes, per_class = 100, 1000
    for c in range(classes):
        folder = f"{root}/n{c:05d}"
        os.makedirs(folder)
        for i in range(per_class):  # empty files: listing reads no byte of them
            os.close(os.open(f"{folder}/{i:06d}.JPEG", os.O_CREAT | os.O_WRONLY, 0o644))
    (root / "n00007" / "readme.txt").write_text("not an image\n")
    try:
        layout = locate(root)
        assert len(layout.files) == classes * per_class and layout.total_bytes == 0
        assert layout.classes == [f"n{c:05d}" for c in range(classes)]
        assert list(layout.labels[::per_class]) == list(range(classes))
        assert layout.files[per_class] == str(root / "n00001" / "000000.JPEG")
        assert [os.path.basename(s.path) for s in layout.skipped] == ["readme.txt"]
    finally:
        shutil.rmtree(root)  # 100k inodes: not left for pytest's later clean-up
