"""The system under test as a reader of a report wants it: (what, value) pairs from a scan's
results (storage, mount, block device, endpoint, client host, the user's description), and the
flags that make a run's numbers not the system's own (slowed on purpose, partial)."""

from __future__ import annotations

from feedbench.core.envelope import Envelope
from feedbench.core.system import client_cache_caveat
from feedbench.report.doc import dash
from feedbench.report.fmt import fmt_bytes


def system_facts(result: Envelope) -> tuple[list[tuple[str, str]], list[str]]:
    """What the client saw of the system under test, as (what, value) pairs; and the flags:
    what makes this run's numbers not the system's own (slowed on purpose, partial)."""
    facts: list[tuple[str, str]] = []
    z, h, cfg = result.system, result.host, result.config
    if cfg.get("describe"):
        facts.append(("described as", cfg["describe"]))
    if z is not None and z.kind == "url":
        store = "S3-compatible object store" if z.scheme == "s3" else f"{z.scheme} server"
        facts += [("storage", store), ("endpoint", z.endpoint or "—"),
                  ("credentials", "used" if z.credentials else "none (anonymous)")]  # fmt: skip
    elif z is not None:
        where = "network or FUSE" if z.network else "local"
        facts += [("storage", f"{where} filesystem"),
                  ("filesystem", z.fstype or "unknown"), ("mount source", z.source or "—"),
                  ("mount point", z.mount_point or "—"),
                  ("mount options", z.mount_options or "—")]  # fmt: skip
        b = z.block_device
        if b is not None:
            kind = {True: "rotational", False: "solid state", None: "kind unknown"}[b.rotational]
            size = f", {fmt_bytes(b.size_bytes)}" if b.size_bytes else ""
            facts += [("block device", f"{b.name}: {b.model or 'model unknown'}, {kind}{size}, "
                                       f"scheduler {b.scheduler or 'unknown'}"),
                      ("read-ahead", dash(b.read_ahead_kb, lambda x: f"{x:,} KiB"))]  # fmt: skip
    if z is not None:
        facts.append(("over a network", "yes" if z.network else "no (local)"))
        caveat = client_cache_caveat(z)
        if caveat:
            facts.append(("cache caveat", caveat))
    if h is not None:
        facts += [
            ("client host", f"{h.hostname} ({h.platform})"),
            ("CPU", f"{h.cpu_model or 'model unknown'}, {h.cpu_count} cores"),
            ("RAM", f"{h.memory_bytes / 2**30:,.1f} GiB"),
            ("NICs", "; ".join(h.nics) or "none up"),
            ("GPUs", ", ".join(h.cuda_devices) or "none"),
            ("software", f"feedbench {result.tool_version}, Python {h.python}, torch {h.torch}"),
        ]
    for i, m in enumerate(getattr(result, "hosts", None) or []):  # a scan across machines
        facts.append((f"machine {i + 1}", machine_text(m)))
    return facts, flags(result)


def machine_text(m) -> str:
    """One machine of a scan across machines: its name, ranks, CPU, RAM and NICs."""
    h, ranks = m.host, m.ranks
    span = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_ranges(ranks)}"
    nics = f"; {'; '.join(h.nics)}" if h.nics else ""
    return (f"{h.hostname} ({span}): {h.cpu_model or 'CPU unknown'}, {h.cpu_count} cores, "
            f"{h.memory_bytes / 2**30:,.0f} GiB RAM{nics}")  # fmt: skip


def _ranges(ns: list[int]) -> str:
    """[0, 1, 2, 5] → "0–2, 5"."""
    out, start = [], ns[0]
    for a, b in zip(ns, [*ns[1:], None], strict=True):
        if b != a + 1:
            out.append(str(start) if start == a else f"{start}–{a}")
            start = b
    return ", ".join(out)


def flags(result: Envelope) -> list[str]:
    cfg = result.config
    out = []
    if cfg.get("read_latency_s"):
        out.append(f"Slowed on purpose: {cfg['read_latency_s'] * 1e3:g} ms added to every file "
                   "read (--read-latency). These numbers are not the storage's own.")  # fmt: skip
    failure = getattr(result, "failure", None)  # a scan's; other kinds only say partial
    if result.partial or failure:
        out.append("Partial results: the run was interrupted or failed"
                   + (f" ({failure})." if failure else "."))  # fmt: skip
    return out
