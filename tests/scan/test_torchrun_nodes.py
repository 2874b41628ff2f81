"""A scan across torchrun nodes: each node's share of the one-window aggregate, and plan's split
of what one client pulls from what the storage serves to all.

The unit test splits known per-consumer shares; the torchrun test starts two real agents on
loopback (two "nodes" on this machine, one rank each) and plans from what they wrote.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys

import pytest

from feedbench.scan.merge import node_rates
from feedbench.scan.results import CacheState, ConsumerStats, Measurement
from tests.conftest import ROOT
from tests.scan.conftest import _free_port


def _consumer(rank: int, samples: int, nbytes: int) -> ConsumerStats:
    return ConsumerStats(
        rank=rank, samples=samples, files=samples, read_bytes=nbytes, errors=0, batches=10,
        wall_s=1.0, first_batch_s=0.1, samples_per_s=0.0, steady_samples_per_s=None, stages=[],
        common_samples=samples, common_read_bytes=nbytes,
    )  # fmt: skip


def _measurement(consumers: list[ConsumerStats], window_s: float, overlap: float) -> Measurement:
    n = sum(c.common_samples or 0 for c in consumers)
    return Measurement(
        consumers=len(consumers), workers=0, pass_name="cold", repeat=1, samples=n, files=n,
        read_bytes=0, errors=0, batches=0, wall_s=1.0, first_batch_s=0.1, samples_per_s=0.0,
        steady_samples_per_s=n / window_s, mb_per_s=0.0, files_per_s=0.0, stages=[],
        cache=CacheState("cold", None), per_consumer=consumers, window_s=window_s,
        window_samples=n, window_overlap=overlap,
    )  # fmt: skip


def test_node_rates_split_the_common_window_by_node():
    """Ranks 0, 1 on node 0 and 2, 3 on node 1 (one host): each node's samples and bytes in the
    window over its length; the nodes sum to the aggregate. No overlap: no split."""
    cs = [_consumer(0, 10, 1000), _consumer(1, 30, 3000), _consumer(2, 20, 500), _consumer(3, 0, 0)]
    m = _measurement(cs, window_s=2.0, overlap=0.9)
    nodes = {0: (0, "h"), 1: (0, "h"), 2: (1, "h"), 3: (1, "h")}
    got = node_rates(m, nodes)
    assert [(r.node, r.ranks, r.window_samples, r.samples_per_s) for r in got] == [
        (0, [0, 1], 40, 20.0),
        (1, [2, 3], 20, 10.0),
    ]
    assert got[0].mb_per_s == pytest.approx(4000 / 2.0 / 1e6)
    assert sum(r.samples_per_s for r in got) == pytest.approx(m.steady_samples_per_s)
    assert node_rates(_measurement(cs, window_s=2.0, overlap=0.0), nodes) == []
    older = [_consumer(0, 10, 1000), _consumer(1, 5, 10)]
    older[1].common_read_bytes = None  # a rank's share not recorded
    assert node_rates(_measurement(older, 1.0, 0.9), {0: (0, "h"), 1: (1, "h")}) == []


def two_node_scan(data: str, out, cwd, *extra: str, timeout_s: float = 120) -> None:
    """Two torchrun agents on 127.0.0.1 as two nodes, one rank each, scanning ``data``."""
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    procs = []
    for node in range(2):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node",
               "1", "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port",
               str(port), "-m", "feedbench", "consumer", data, "--json", str(out),
               "--no-plots", *extra]  # fmt: skip
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env, cwd=cwd))  # fmt: skip
    try:
        outs = [p.communicate(timeout=timeout_s) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs


@pytest.mark.slow
@pytest.mark.usefixtures("torchrun_logs")
def test_two_nodes_on_loopback_give_per_node_rates_and_plan_splits_them(dataset, tmp_path, cli):
    out = tmp_path / "2n.json"
    # the emulated step keeps the two ranks in step (as DDP would): their windows overlap, and
    # every repeat is judged on a busy machine too
    two_node_scan(str(dataset / "images"), out, tmp_path, "--stages", "read", "-b", "1",
                  "--workers", "0", "--repeat", "2", "--read-latency", "0.01",
                  "--step-time", "0.005")  # fmt: skip
    r = json.loads(out.read_text())
    host = socket.gethostname()
    assert [(h["node"], h["ranks"]) for h in r["hosts"]] == [(0, [0]), (1, [1])]
    assert len(r["measurements"]) == 2
    for m in r["measurements"]:
        nodes = m["per_node"]
        assert [(n["node"], n["hostname"], n["ranks"]) for n in nodes] == [
            (0, host, [0]),
            (1, host, [1]),
        ]
        # one window for all: the nodes' shares are the aggregate, split
        assert sum(n["window_samples"] for n in nodes) == m["window_samples"] > 0
        assert sum(n["window_read_bytes"] for n in nodes) == m["window_read_bytes"]
        assert sum(n["samples_per_s"] for n in nodes) == pytest.approx(m["steady_samples_per_s"])
        assert sum(n["mb_per_s"] for n in nodes) == pytest.approx(m["steady_mb_per_s"])
        assert all(n["samples_per_s"] > 0 for n in nodes)
    # plan: one count (2) cannot be fitted, but the split of client from storage is made
    res = cli("plan", str(out), "--rate", "50", "--target-au", "1", "--at", "16",
              "--json", str(tmp_path / "p.json"), "--no-plots")  # fmt: skip
    assert res.code == 0, res.err
    assert "refused: cold: 1 judged consumer count (2)" in res.out
    assert "clients: 2 clients (torchrun nodes) measured together" in res.out
    assert "flag: the scan emulated an accelerator step: each client took no more" in res.out
    p = json.loads((tmp_path / "p.json").read_text())
    (split,) = p["splits"]
    rates = [n["samples_per_s"] for m in r["measurements"] for n in m["per_node"]]
    aggs = [m["steady_samples_per_s"] for m in r["measurements"]]
    assert split["clients"] == 2 and split["repeats"] == 2
    assert split["per_client"]["value"] == pytest.approx(sum(rates) / 4)
    assert split["aggregate"]["value"] == pytest.approx(sum(aggs) / 2)
    need = split["clients_needed"]
    assert need["value"] == math.ceil(16 * 50 / split["per_client"]["value"])
    assert need["low"] == math.ceil(16 * 50 / max(rates))
    assert need["high"] == math.ceil(16 * 50 / min(rates))
    shown = [ln for ln in res.out.splitlines() if ln.startswith("clients, cold pass")]
    assert len(shown) == 1 and shown[0].startswith("clients, cold pass, 2 clients × 1 consumer")
    assert f"node 0 on {host} " in shown[0] and f"node 1 on {host} " in shown[0]
    assert f"16 accelerators need {need['value']:,.0f} ({need['low']:,.0f}–" in res.out
