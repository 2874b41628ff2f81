"""samples/s, MB/s and files/s of a measurement describe one window: the steady one after the
warm-up batches (a real scan)."""

from __future__ import annotations

import pytest

from feedbench.scan.config import ScanConfig
from feedbench.scan.run import scan


@pytest.mark.parametrize("layout", ["images", "shards"])
def test_rates_share_the_steady_window(dataset, layout):
    config = ScanConfig(str(dataset / layout), stages=("read",), batch_size=2, consumers=(1, 2))
    result = scan(config)
    for m in result.measurements:
        for c in m.per_consumer:
            # MB/s × window = the bytes read in that window, per consumer
            assert c.steady_s and 0 < c.steady_read_bytes < c.read_bytes
            assert c.steady_samples_per_s * c.steady_s == pytest.approx(c.steady_samples)
        assert m.steady_mb_per_s * 1e6 == pytest.approx(
            sum(c.steady_read_bytes / c.steady_s for c in m.per_consumer)
        )
        assert m.steady_files_per_s == pytest.approx(
            sum(c.steady_files / c.steady_s for c in m.per_consumer)
        )
    one = next(m for m in result.measurements if m.consumers == 1)
    (c,) = one.per_consumer
    # one consumer: bytes per sample from the rates = bytes per sample in the window
    assert one.steady_mb_per_s * 1e6 / one.steady_samples_per_s == pytest.approx(
        c.steady_read_bytes / c.steady_samples
    )
    for p in result.curve:  # the curve reports the three over that window
        ms = [m for m in result.measurements if m.consumers == p.consumers]
        assert p.rate_basis == "steady"
        assert p.mb_per_s_mean == pytest.approx(sum(m.steady_mb_per_s for m in ms) / len(ms))
        assert p.files_per_s_mean == pytest.approx(sum(m.steady_files_per_s for m in ms) / len(ms))
