"""The memory a process's control group may use: the most page cache a client in a container (a
Kubernetes pod, ``docker --memory``, ``systemd-run -p MemoryMax=``) can hold, whatever the
machine's RAM. The kernel charges the page cache to the group that read the data, and reclaims
it at the group's limit, so a dataset 5× that limit cannot be served from this client's cache.

Both cgroup versions: v2 (one hierarchy, ``memory.max`` at each level, the lowest applies) and
v1 (the memory controller's ``memory.stat`` states the effective ``hierarchical_memory_limit``).
"""

from __future__ import annotations

from pathlib import Path

from feedbench.core.files import read_stripped

NO_LIMIT = 1 << 60  # v1 writes "no limit" as a page-rounded 2**63 - 1; anything above is none


def memory_limit(
    proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"
) -> int | None:
    """Bytes this process's control group may use, or None without a limit (or without cgroups
    to read). ``proc_cgroup`` and ``root``: where the kernel shows them (for tests)."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    groups = dict(_entry(line) for line in lines if line.count(":") >= 2)
    limits = []
    if "" in groups:  # v2: "0::/path"; the group's memory.max and every ancestor's
        limits.append(_v2_limit(Path(root), groups[""]))
    v1 = next((path for ctl, path in groups.items() if "memory" in ctl.split(",")), None)
    if v1 is not None:
        limits.append(_v1_limit(Path(root), v1))
    found = [x for x in limits if x is not None and x < NO_LIMIT]
    return min(found) if found else None


def _entry(line: str) -> tuple[str, str]:
    _, controllers, path = line.split(":", 2)
    return controllers, path


def _v2_limit(root: Path, path: str) -> int | None:
    base = root / "unified" if (root / "unified" / "cgroup.controllers").exists() else root
    here = base / path.lstrip("/")
    limits = []
    for level in [here, *here.parents]:
        if level == base.parent:
            break
        value = read_stripped(level / "memory.max")
        if value is not None and value != "max":
            limits.append(int(value))
    return min(limits) if limits else None


def _v1_limit(root: Path, path: str) -> int | None:
    stat = read_stripped(root / "memory" / path.lstrip("/") / "memory.stat")
    if stat is None:  # a container sees its own group as the root of the hierarchy
        stat = read_stripped(root / "memory" / "memory.stat")
    for line in (stat or "").splitlines():
        key, _, value = line.partition(" ")
        if key == "hierarchical_memory_limit":
            return int(value)
    return None
