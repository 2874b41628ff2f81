"""Across clients: what one client pulls apart from what the storage serves to all of them.

A scan under torchrun on K nodes records each node's share of every measurement's one-window
aggregate (``Measurement.per_node``: the node's ranks' samples inside the common window over its
length, so the nodes sum to the aggregate). Per pass, over the judged repeats:

- **per client**: each node's rate, what that client pulled (its CPU, its NIC) while sharing the
  storage with the others;
- **the storage**: the aggregate over nodes, what it served to all of them at once;
- **clients a target needs**: ⌈target × demand ÷ per-client rate⌉, its range from the per-client
  range; where target × demand exceeds what the storage was seen to serve, flagged: how far the
  storage goes past the measured aggregate is not measured.

Ranges are min–max over nodes and repeats (a K-node scan has few values: no percentile band).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from feedbench.project.bands import Band
from feedbench.scan import sizing
from feedbench.scan.results import Measurement, ScanResult

UNEVEN = 0.2  # nodes whose mean rates differ by more than this × their mean are flagged
ONE = (
    "one client measured: the projection cannot go past one client. Its curve mixes what this "
    "client can pull (its CPU and NIC) with what the storage serves to all; only a scan under "
    "torchrun on two or more nodes tells them apart"
)
NO_SHARES = (
    "{n} nodes measured together, but the file has no per-node rates (written before they were "
    "recorded): the fit is of their aggregate, with no split of client from storage; scan again"
)
UNJUDGED = (
    "{n} nodes measured together, but none of their repeats can be judged (see the flags): no "
    "split of client from storage"
)
SPLIT = (
    "{n} clients (torchrun nodes) measured together: what one client pulled (its node's rate: "
    "its CPU and NIC) apart from what the storage served to all (the aggregate over nodes, one "
    "window); ranges are min–max over nodes and repeats"
)


STEPPED = (
    "the scan emulated an accelerator step: each client took no more than its consumers' "
    "appetite, so its rate is demand met, not what it can pull (scan without "
    "--profile/--rate/--workload, and give plan --rate)"
)


@dataclass
class NodeShare:
    """One node's rate in each judged repeat of a pass."""

    node: int
    hostname: str
    samples_per_s: list[float]
    mb_per_s: list[float]


@dataclass
class ClientSplit:
    """One pass of a scan across nodes, split into client and storage."""

    pass_name: str
    clients: int  # nodes measured together
    consumers: int  # ranks, all nodes
    repeats: int  # judged repeats with every node's share
    per_client: Band  # samples/s one node pulled: mean over nodes and repeats (min–max)
    aggregate: Band  # samples/s the storage served to all nodes: mean over repeats (min–max)
    per_client_mb_per_s: float
    aggregate_mb_per_s: float
    nodes: list[NodeShare]
    client_fed: Band | None = None  # accelerators one client keeps fed at the demand
    storage_fed: Band | None = None  # accelerators the aggregate kept fed
    target: int | None = None  # accelerators asked for (plan --at)
    clients_needed: Band | None = None  # ⌈target × demand ÷ per-client rate⌉
    flags: list[str] = field(default_factory=list)


def judged(result: ScanResult, pass_name: str) -> list[Measurement]:
    """The measurements of ``pass_name`` a figure may come from: completed, with a one-window
    rate over a window that held enough batches (the rule sizing judges by)."""
    return [
        m
        for m in result.measurements
        if m.pass_name == pass_name and not m.failed and not m.partial
        and m.steady_samples_per_s is not None and sizing.short_window(m, result.config) is None
    ]  # fmt: skip


def _range(xs: list[float]) -> Band:
    return Band(sum(xs) / len(xs), min(xs), max(xs))


def split_pass(
    result: ScanResult, pass_name: str, demand: float | None, target: int | None
) -> ClientSplit | None:
    """The split of ``pass_name`` at its largest consumer count measured on two or more nodes;
    None without such a measurement."""
    shared = [m for m in judged(result, pass_name) if len(m.per_node) >= 2]
    if not shared:
        return None
    at = max(m.consumers for m in shared)
    ms = [m for m in shared if m.consumers == at]
    nodes: dict[int, NodeShare] = {}
    for m in ms:
        for r in m.per_node:
            n = nodes.setdefault(r.node, NodeShare(r.node, r.hostname, [], []))
            n.samples_per_s.append(r.samples_per_s)
            n.mb_per_s.append(r.mb_per_s)
    rates = [x for n in nodes.values() for x in n.samples_per_s]
    mbs = [x for n in nodes.values() for x in n.mb_per_s]
    s = ClientSplit(
        pass_name=pass_name,
        clients=len(nodes),
        consumers=at,
        repeats=len(ms),
        per_client=_range(rates),
        aggregate=_range([m.steady_samples_per_s or 0.0 for m in ms]),
        per_client_mb_per_s=sum(mbs) / len(mbs),
        aggregate_mb_per_s=sum(m.steady_mb_per_s or 0.0 for m in ms) / len(ms),
        nodes=[nodes[k] for k in sorted(nodes)],
        target=target,
    )
    s.flags += _uneven(s)
    if result.accelerator:
        s.flags.append(STEPPED)
    if demand is not None:
        _size(s, demand)
    return s


def _size(s: ClientSplit, demand: float) -> None:
    """Accelerators one client and the storage fed at ``demand`` each, and the clients the
    target needs, flagged where the target asks more of the storage than it was seen to serve."""
    s.client_fed = Band(*(x / demand if x is not None else None for x in astuple(s.per_client)))
    s.storage_fed = Band(*(x / demand if x is not None else None for x in astuple(s.aggregate)))
    if s.target is None:
        return
    need = s.target * demand
    v, lo, hi = astuple(s.per_client)
    if not lo or not v or not hi:
        s.flags.append("a node delivered nothing: no client count to give")
        return
    s.clients_needed = Band(math.ceil(need / v), math.ceil(need / hi), math.ceil(need / lo))
    served = s.aggregate.high or 0.0
    if need > served:
        s.flags.append(
            f"{s.target} accelerators take {need:,.0f} samples/s, more than the {served:,.0f} "
            f"the storage served to {s.clients} clients: the client count holds only while the "
            "storage keeps up, which this scan did not measure (scan on more nodes to see)"
        )


def astuple(b: Band) -> tuple[float | None, float | None, float | None]:
    return b.value, b.low, b.high


def _uneven(s: ClientSplit) -> list[str]:
    means = [sum(n.samples_per_s) / len(n.samples_per_s) for n in s.nodes]
    mean = sum(means) / len(means)
    if mean <= 0 or (max(means) - min(means)) / mean <= UNEVEN:
        return []
    return [
        f"the nodes pulled unequal rates ({min(means):,.0f}–{max(means):,.0f} samples/s): "
        "clients unlike each other, or the storage favours some; the slowest sets the count"
    ]


def splits(
    result: ScanResult, pass_names: list[str], demand: float | None, target: int | None
) -> list[ClientSplit]:
    found = (split_pass(result, p, demand, target) for p in pass_names)
    return [s for s in found if s is not None]


def note(result: ScanResult, found: list[ClientSplit]) -> str:
    """The plan's one line on clients: split (below), not splittable (older file), or one."""
    if found:
        return SPLIT.format(n=max(s.clients for s in found))
    nodes = len(result.hosts)
    if nodes < 2:
        return ONE
    recorded = any(len(m.per_node) >= 2 for m in result.measurements)
    return (UNJUDGED if recorded else NO_SHARES).format(n=nodes)
