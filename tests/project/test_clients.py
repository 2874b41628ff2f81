"""Plan across clients: one client's rate apart from the storage's aggregate, the clients a
target needs, and what plan says without per-node rates. Scans of known per-node rates."""

from __future__ import annotations

import math

import pytest

from feedbench.core.envelope import HostInfo
from feedbench.core.errors import FeedbenchError
from feedbench.project import clients, projection, section
from feedbench.scan.results import NodeRates, RankHosts
from tests.project.scans import scan

ENV = {"kind": "plan", "created_utc": "", "command": [], "config": {}}


def two_nodes(per_node: list[list[float]], with_rates: bool = True):
    """A 2-consumer scan on two torchrun nodes of one host; each repeat's node rates given."""
    result = scan({2: [sum(xs) for xs in per_node]})
    host = HostInfo.current()
    result.hosts = [RankHosts([0], host, 0), RankHosts([1], host, 1)]
    for m, xs in zip(result.measurements, per_node, strict=True):
        m.window_s, m.window_overlap = 10.0, 1.0
        m.per_consumer = []  # (judged without: the rates are written, not measured)
        if with_rates:
            m.per_node = [NodeRates(i, "h", [i], int(x * 10), int(x * 1e5), x, x / 10)
                          for i, x in enumerate(xs)]  # fmt: skip
    return result


def plan_of(result, demand=None, target=None):
    ask = projection.Ask(demand=demand, target=target)
    return projection.plan(result, "s.json", ask, None, ENV, demand, 1.0)


def test_the_split_takes_each_node_as_a_client_and_their_sum_as_the_storage():
    p = plan_of(two_nodes([[100.0, 120.0], [110.0, 90.0], [105.0, 115.0]]), demand=20.0, target=64)
    assert p.refused and not p.passes  # one count: no fit, and still the split
    (s,) = p.splits
    assert (s.clients, s.consumers, s.repeats) == (2, 2, 3)
    assert (s.per_client.value, s.per_client.low, s.per_client.high) == (
        pytest.approx(640 / 6), 90.0, 120.0,
    )  # fmt: skip
    assert (s.aggregate.value, s.aggregate.low, s.aggregate.high) == (
        pytest.approx(640 / 3), 200.0, 220.0,
    )  # fmt: skip
    assert s.client_fed.value == pytest.approx(640 / 6 / 20)
    assert s.storage_fed.high == pytest.approx(11.0)
    need = 64 * 20
    assert (s.clients_needed.value, s.clients_needed.low, s.clients_needed.high) == (
        math.ceil(need / (640 / 6)), math.ceil(need / 120), math.ceil(need / 90),
    )  # fmt: skip
    (flag,) = s.flags  # 1,280 samples/s asked, 220 served at most: beyond what was measured
    assert flag.startswith("64 accelerators take 1,280 samples/s, more than the 220 the storage")
    assert p.clients.startswith("2 clients (torchrun nodes) measured together")


def test_a_target_the_storage_was_seen_to_serve_is_not_flagged_and_uneven_nodes_are():
    (s,) = plan_of(two_nodes([[100.0, 50.0], [100.0, 50.0]]), demand=10.0, target=4).splits
    assert s.clients_needed.value == math.ceil(40 / 75)
    assert s.flags == [
        "the nodes pulled unequal rates (50–100 samples/s): clients unlike each other, or the "
        "storage favours some; the slowest sets the count"
    ]


def test_without_a_demand_or_target_the_rates_alone_and_what_to_give():
    plan = plan_of(two_nodes([[100.0, 100.0], [100.0, 100.0]]))
    (s,) = plan.splits
    assert s.client_fed is None and s.clients_needed is None
    lines = section.section_lines(plan)
    assert lines[-2].startswith("clients, cold pass, 2 clients × 1 consumer, 2 repeats: one "
                                "client pulled 100 (100–100) samples/s")  # fmt: skip
    assert (
        lines[-1]
        == "  accelerators per client: no demand (scan with --profile/--rate, or plan --rate)"
    )
    with_demand = plan_of(two_nodes([[100.0, 100.0]] * 2), demand=10.0)
    assert section.section_lines(with_demand)[-1] == "  clients for K accelerators: give --at K"


def test_without_per_node_rates_plan_says_why_it_cannot_split():
    older = two_nodes([[100.0, 100.0]] * 4, with_rates=False)  # a multi-node file before them
    with pytest.raises(FeedbenchError, match="no projection: cold: 1 judged consumer count"):
        plan_of(older)  # one count and no split: nothing to show
    assert clients.note(older, []).startswith(
        "2 nodes measured together, but the file has no per-node rates"
    )
    one = scan({1: [10.0], 2: [20.0], 4: [40.0], 8: [80.0]})
    assert plan_of(one).clients == clients.ONE


def test_the_compare_line_of_a_split_alone_says_the_refusal_and_the_split():
    line = section.one_line(two_nodes([[100.0, 100.0]] * 2), "s.json", "cold")
    assert line.startswith("no projection (cold: 1 judged consumer count (2);")
    assert "; clients, cold pass, 2 clients × 1 consumer" in line
