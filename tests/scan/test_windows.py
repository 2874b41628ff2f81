"""samples/s, MB/s and files/s of a measurement describe one window: the one every consumer was
measuring in, after its warm-up batches (real scans)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from feedbench.report.fmt import fmt_rate
from feedbench.sample import SampleSpec, make_sample
from feedbench.scan.config import ScanConfig
from feedbench.scan.merge import MARKS, common_window
from feedbench.scan.results import ConsumerStats
from feedbench.scan.run import scan
from feedbench.scan.sizing import short_window


@pytest.mark.parametrize("layout", ["images", "shards"])
def test_rates_share_the_steady_window(dataset, layout):
    config = ScanConfig(str(dataset / layout), stages=("read",), batch_size=2, consumers=(1, 2))
    result = scan(config)
    for m in result.measurements:
        for c in m.per_consumer:
            # MB/s × window = the bytes read in that window, per consumer
            assert c.steady_s and 0 < c.steady_read_bytes < c.read_bytes
            assert c.steady_samples_per_s * c.steady_s == pytest.approx(c.steady_samples)
        # the three rates: what all consumers delivered in the common window ÷ its length
        assert m.steady_samples_per_s * m.window_s == pytest.approx(m.window_samples)
        assert m.steady_mb_per_s * 1e6 * m.window_s == pytest.approx(m.window_read_bytes)
        assert m.steady_files_per_s * m.window_s == pytest.approx(m.window_files)
        if m.window_overlap > 0:
            assert m.window_samples == sum(c.common_samples for c in m.per_consumer)
        else:  # windows apart: their span, every steady sample, and nothing judged
            assert m.window_samples == sum(c.steady_samples for c in m.per_consumer)
            assert sum(c.common_samples for c in m.per_consumer) == 0
    one = next(m for m in result.measurements if m.consumers == 1)
    (c,) = one.per_consumer
    # one consumer: bytes per sample from the rates = bytes per sample in the window
    assert one.steady_mb_per_s * 1e6 / one.steady_samples_per_s == pytest.approx(
        c.steady_read_bytes / c.steady_samples
    )
    for p in result.curve:  # the curve reports the three over that window
        ms = [m for m in result.measurements if m.consumers == p.consumers]
        if p.rate_basis != "steady":
            continue
        assert p.mb_per_s_mean == pytest.approx(sum(m.steady_mb_per_s for m in ms) / len(ms))
        assert p.files_per_s_mean == pytest.approx(sum(m.steady_files_per_s for m in ms) / len(ms))


def _stats(rank: int, start: float, end: float) -> ConsumerStats:
    return ConsumerStats(rank, 0, 0, 0, 0, 0, end - start + 1.0, None, 0.0, None, [],
                         window_start=start, window_end=end, started_at=start - 1.0)  # fmt: skip


def _marks(*rows: tuple[float, int, int, int]) -> np.ndarray:
    return np.asarray(rows, dtype=np.float64).reshape(-1, 4)


def test_common_window_counts_only_what_fell_inside_it():
    """Two consumers measuring over [10, 14] and [12, 20]: the window both were measuring in is
    [12, 14], and only their batches delivered inside it count (a sum of each one's own rate
    would be 4 + 4 = 8 samples/s)."""
    a, b = _stats(0, 10.0, 14.0), _stats(1, 12.0, 20.0)
    marks = {
        0: _marks((11.0, 8, 800, 1), (12.5, 8, 800, 0), (13.5, 8, 800, 1), (14.0, 8, 0, 0)),
        1: _marks((13.0, 8, 100, 0), (16.0, 8, 100, 0), (18.0, 8, 100, 1), (20.0, 8, 100, 0)),
    }
    w = common_window([a, b], marks)
    assert w is not None
    assert (w.start, w.length_s) == (12.0, 2.0)
    assert (w.samples, w.read_bytes, w.files) == (32, 1700, 1)
    assert w.overlap == pytest.approx(2.0 / 6.0)
    assert (a.common_batches, a.common_samples, b.common_batches) == (3, 24, 1)
    # windows that do not overlap: their span, first start to last end, at overlap 0
    c = _stats(2, 30.0, 31.0)
    w = common_window([a, c], marks | {2: _marks((30.5, 8, 0, 0))})
    assert w is not None and (w.start, w.length_s, w.samples, w.overlap) == (10.0, 21.0, 40, 0)
    assert a.common_batches == 0 and c.common_batches == 0


@pytest.fixture(scope="module")
def sixteen_shards(tmp_path_factory):
    """80 JPEGs in 16 tar shards: 8 consumers read 2 shards each, as the 2,000-image sample."""
    out = tmp_path_factory.mktemp("shards16") / "sample"
    make_sample(out, SampleSpec(images=80, seed=3, classes=4, per_shard=5, fmt="shards"), jobs=1)
    return out / "shards"


@pytest.mark.slow
def test_eight_consumer_headline_is_within_its_own_window(cli, sixteen_shards, tmp_path):
    """The read scan at 1, 2, 4 and 8 consumers: every count's rate is at most the samples it
    read over the window it states (never a sum of per-consumer rates over windows that do not
    overlap), the curve gives the measurement's figure, and the terminal's pipeline row too."""
    out = tmp_path / "r.json"
    r = cli("scan", str(sixteen_shards), "--stages", "read", "--consumers", "1,2,4,8",
            "-b", "2", "--json", str(out))  # fmt: skip
    assert r.code == 0, r.out + r.err
    data = json.loads(out.read_text())
    curve = {p["consumers"]: p for p in data["curve"]}
    basis = {p["rate_basis"] for p in data["curve"]}
    assert len(basis) == 1
    for m in data["measurements"]:
        assert basis == {"steady"}  # a measurement whose consumers measured apart too
        window, rate = m["window_s"], m["steady_samples_per_s"]
        assert window is not None and window > 0
        assert rate <= m["samples"] / window * (1 + 1e-9)
        assert curve[m["consumers"]]["samples_per_s_mean"] == pytest.approx(rate)
        # the whole pass spans every consumer: no consumer's own time is longer
        assert m["wall_s"] >= max(c["wall_s"] for c in m["per_consumer"]) - 1e-6
        starts = [c["window_start"] for c in m["per_consumer"]]
        ends = [c["window_end"] for c in m["per_consumer"]]
        assert m["window_samples"] <= m["samples"]
        if m["window_overlap"] > 0:
            assert m["window_s"] == pytest.approx(min(ends) - max(starts))
        else:  # apart: their span
            assert m["window_s"] == pytest.approx(max(ends) - min(starts))
    last = data["measurements"][-1]
    row = re.search(r"pipeline \(total\)\s+([\d.,k]+) ", r.out)
    assert row is not None, r.out
    assert row.group(1) == fmt_rate(curve[last["consumers"]]["samples_per_s_mean"])


def test_a_thin_overlap_is_not_judged(dataset):
    """A measurement whose consumers measured together for under half their windows is not
    judged, however many batches each measured."""
    config = ScanConfig(str(dataset / "images"), stages=("read",), batch_size=2, workers=1,
                        consumers=(1,))  # fmt: skip
    result = scan(config)
    m = result.measurements[0]
    c = m.per_consumer[0]  # 12 batches of 2, less the warm-up (longer on a busy host)
    assert m.window_overlap == 1.0 and c.common_batches == 12 - c.warmup_batches >= 6
    assert short_window(m, result.config) is None
    m.window_overlap = 0.3
    assert short_window(m, result.config) == (c.common_batches, 5)
    # the verdict still names the count's own rate, and says it is not judged
    from feedbench.scan.verdict import judge

    said = f"this count not judged: {c.common_batches} measured batches per consumer"
    assert any(line.startswith(said) for line in judge(result).evidence)
    assert MARKS not in {s.name for s in m.stages}


@pytest.fixture(scope="module")
def forty_eight_shards(tmp_path_factory):
    """240 JPEGs in 48 tar shards of 5: 24 batches of 5 a consumer at 2 consumers."""
    out = tmp_path_factory.mktemp("shards48") / "sample"
    make_sample(out, SampleSpec(images=240, seed=5, classes=4, per_shard=5, fmt="shards"), jobs=1)
    return out / "shards"


@pytest.mark.slow  # two scans, 5–15 s on the shared 2-core VM
def test_shards_files_per_s_counts_the_shards_read_at_every_count(
    cli, forty_eight_shards, tmp_path
):
    """A shards read scan at 1 and 2 consumers (issue 25: files/s 0.0 at N ≥ 2 though every
    shard was read): a file is a shard, counted once when read to its end; files/s is the
    shards in the window all consumers measured in ÷ its length, never 0 when shards were read
    there. A batch of 5 is one 5-sample shard, so the window's files follow its batches, give or
    take one a loader worker (a shard's end is seen with the batch after its last sample).
    48 shards: with 16 (8 batches a consumer at 2) a loaded 2-core VM left the two consumers'
    windows no shard end in common (a full suite's run, 2026-12-07)."""
    out = tmp_path / "f.json"
    r = cli("scan", str(forty_eight_shards), "--stages", "read", "--consumers", "1,2", "-b", "5",
            "--workers", "1", "--wide", "--no-plots", "--json", str(out))  # fmt: skip
    assert r.code == 0, r.out + r.err
    data = json.loads(out.read_text())
    shards = len(list(forty_eight_shards.glob("*.tar")))
    assert shards == 48 and data["dataset"]["files"] == shards
    for m in data["measurements"]:
        n = m["consumers"]
        assert m["files"] == shards and m["failed_files"] == 0, n  # each shard once, by one
        assert sorted(c["files"] for c in m["per_consumer"]) == [shards // n] * n
        assert m["files_per_s"] * m["wall_s"] == pytest.approx(shards)
        assert 0 < m["window_files"] <= shards and m["window_s"] > 0
        assert m["steady_files_per_s"] > 0
        assert m["steady_files_per_s"] * m["window_s"] == pytest.approx(m["window_files"])
        assert abs(m["window_files"] - m["window_samples"] / 5) <= n, m  # one worker each
    # the --wide scaling table's rows: N, workers, samples/s, ± std, CV, MB/s, files/s, …
    row = r"^ *(\d) (?:✗ )?\s*1\s+[\d,.k]+\s+[\d.]+\s+[\d.]+%\s+[\d,.]+\s+(\S+)"
    table = {int(n): cell for n, cell in re.findall(row, r.out, re.M)}
    curve = {p["consumers"]: p["files_per_s_mean"] for p in data["curve"]}
    assert set(curve) == set(table) == {1, 2}, r.out
    for n, files_per_s in curve.items():
        assert files_per_s > 0 and table[n] == fmt_rate(files_per_s) != "0.0"
