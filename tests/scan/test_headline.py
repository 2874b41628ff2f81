"""The headline a storage buyer reads: the cold (first-epoch) pass first, the warm one beside
it, each named; read latencies of the samples that waited on a read (real scans)."""

from __future__ import annotations

import re

from feedbench.report.doc_scan import answer
from feedbench.report.fmt import fmt_rate, fmt_s
from feedbench.scan.config import ScanConfig
from feedbench.scan.run import scan


def test_the_headline_leads_with_the_cold_pass_and_names_the_warm_one(dataset):
    config = ScanConfig(str(dataset / "images"), stages=("read",), batch_size=2, workers=1,
                        passes=("cold", "warm"))  # fmt: skip
    result = scan(config)
    cold, warm = (next(p for p in result.curve if p.pass_name == n) for n in ("cold", "warm"))
    head = answer(result)[0]
    assert head.startswith(
        f"Delivers {fmt_rate(cold.samples_per_s_mean)} samples/s ({cold.mb_per_s_mean:,.1f} "
        "MB/s) at 1 consumer, cold pass (first epoch); "
        f"{fmt_rate(warm.samples_per_s_mean)} samples/s"
    ), head
    assert "warm pass (page cache)" in head


def test_a_shards_read_latency_is_of_the_samples_that_waited_on_a_read(dataset):
    """A shard's samples come several to one 1 MiB read call: those served from its bytes
    waited on nothing, and a median of their 0 s read "0 µs" though every read took time."""
    config = ScanConfig(str(dataset / "shards"), stages=("read",), batch_size=2, workers=0)
    m = scan(config).measurements[0]
    (read,) = [s for s in m.stages if s.name == "read"]
    assert read.busy_s > 0 and read.latency is not None
    assert read.latency.p50_s > 0
    assert not re.fullmatch(r"0 µs", fmt_s(read.latency.p50_s))
    assert fmt_s(1e-7) == "<1 µs" and fmt_s(0.0) == "0 µs"
