"""The system under test as a reader wants it: (what, value) pairs from a results file
(storage, mount, block device, endpoint, client host, the user's description), and the flags
that make a run's numbers not the system's own (slowed on purpose, partial). The one source of
these facts: the pages (HTML, Markdown) list them, the console prints them a group a line."""

from __future__ import annotations

from dataclasses import dataclass

from feedbench.core.envelope import Envelope
from feedbench.core.system import client_cache_caveat
from feedbench.report.doc import dash
from feedbench.report.fmt import fmt_bytes

Facts = list[tuple[str, str]]


@dataclass(frozen=True)
class FactGroup:
    """Facts that belong together (the storage, its block device, the client): one line of the
    console, rows of a report's table. ``console``: False where the console says it elsewhere."""

    facts: Facts
    console: bool = True


def fact_groups(result: Envelope) -> list[FactGroup]:
    """The one description of the system under test, for the report and the console alike:
    the user's description, the storage (a filesystem and its block device, or an endpoint),
    the client machine and, for a scan across machines, each machine."""
    z, h, cfg = result.system, result.host, result.config
    groups = [FactGroup([("described as", cfg["describe"])])] if cfg.get("describe") else []
    if z is not None:
        groups += _storage(z)
    if h is not None:
        groups += [
            FactGroup([("client host", f"{h.hostname} ({h.platform})"), ("CPU", cpu_text(h)),
                       ("RAM", ram_text(h)), ("NICs", "; ".join(h.nics) or "none up"),
                       ("GPUs", ", ".join(h.cuda_devices) or "none")]),
            FactGroup([("software", f"feedbench {result.tool_version}, Python {h.python}, "
                                    f"torch {h.torch}")]),
        ]  # fmt: skip
    machines = getattr(result, "hosts", None) or []  # a scan across machines
    groups += [FactGroup([(machine_label(i, m), machine_text(m))]) for i, m in enumerate(machines)]
    return groups


def _storage(z) -> list[FactGroup]:
    """Where the bytes came from: an endpoint, or a filesystem (and its block device); whether
    over a network; why a cold pass may not be cold (the console has it among the warnings)."""
    network = ("over a network", "yes" if z.network else "no (local)")
    if z.kind == "url":
        store = "S3-compatible object store" if z.scheme == "s3" else f"{z.scheme} server"
        groups = [FactGroup([("storage", store), ("endpoint", z.endpoint or "—"),
                             ("credentials", "used" if z.credentials else "none (anonymous)"),
                             network])]  # fmt: skip
    else:
        where = "network or FUSE" if z.network else "local"
        groups = [FactGroup([("storage", f"{where} filesystem"),
                             ("filesystem", z.fstype or "unknown"),
                             ("mount source", z.source or "—"),
                             ("mount point", z.mount_point or "—"),
                             ("mount options", z.mount_options or "—"), network])]  # fmt: skip
        b = z.block_device
        if b is not None:
            kind = {True: "rotational", False: "solid state", None: "kind unknown"}[b.rotational]
            size = f", {fmt_bytes(b.size_bytes)}" if b.size_bytes else ""
            groups.append(FactGroup([
                ("block device", f"{b.name}: {b.model or 'model unknown'}, {kind}{size}, "
                                 f"scheduler {b.scheduler or 'unknown'}"),
                ("read-ahead", dash(b.read_ahead_kb, lambda x: f"{x:,} KiB")),
            ]))  # fmt: skip
    caveat = client_cache_caveat(z)
    if caveat:
        groups.append(FactGroup([("cache caveat", caveat)], console=False))
    return groups


def system_facts(result: Envelope) -> tuple[Facts, list[str]]:
    """What the client saw of the system under test, as (what, value) pairs; and the flags:
    what makes this run's numbers not the system's own (slowed on purpose, partial)."""
    return [f for g in fact_groups(result) for f in g.facts], flags(result)


def cpu_text(h) -> str:
    return f"{h.cpu_model or 'model unknown'}, {h.cpu_count} cores"


def ram_text(h) -> str:
    limit = getattr(h, "memory_limit_bytes", None)
    cgroup = f" (its cgroup may use {limit / 2**30:,.1f} GiB)" if limit is not None else ""
    return f"{h.memory_bytes / 2**30:,.1f} GiB{cgroup}"


def machine_label(i: int, m) -> str:
    """A torchrun node by its node rank (two on one machine are two); older files: machine i."""
    node = getattr(m, "node", None)
    return f"node {node}" if node is not None else f"machine {i + 1}"


def machine_text(m) -> str:
    """One machine of a scan across machines: its name, ranks, CPU, RAM and NICs."""
    h, ranks = m.host, m.ranks
    span = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_ranges(ranks)}"
    nics = f"; {'; '.join(h.nics)}" if h.nics else ""
    return f"{h.hostname} ({span}): CPU {cpu_text(h)}, {ram_text(h)} RAM{nics}"


def _ranges(ns: list[int]) -> str:
    """[0, 1, 2, 5] → "0–2, 5"."""
    out, start = [], ns[0]
    for a, b in zip(ns, [*ns[1:], None], strict=True):
        if b != a + 1:
            out.append(str(start) if start == a else f"{start}–{a}")
            start = b
    return ", ".join(out)


def flags(result: Envelope) -> list[str]:
    return [f for f in (slowed_flag(result), partial_flag(result)) if f]


def slowed_flag(result: Envelope) -> str | None:
    added_s = result.config.get("read_latency_s")
    if not added_s:
        return None
    return (f"Slowed on purpose: {added_s * 1e3:g} ms added to every file read (--read-latency). "
            "These numbers are not the storage's own.")  # fmt: skip


def partial_flag(result: Envelope) -> str | None:
    failure = getattr(result, "failure", None)  # a scan's; other kinds only say partial
    if not (result.partial or failure):
        return None
    return "Partial results: the run was interrupted or failed" + (
        f" ({failure})." if failure else "."
    )
