"""``parquet:rows=N``: N rows of a Parquet file as a sample, on real files written by pyarrow with
row groups of uneven sizes, read locally and over HTTP (rclone on loopback), through the data
layer and through ``feedbench scan`` at 1 and 2 consumers. The bytes each sample must cost are
worked out here from the file's own metadata (the column chunks of the row groups its rows lie
in), not from the code under test."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from feedbench.scan.sources import detect
from loaders.data import columnar
from loaders.data.records import RecordFormatError

pa = pytest.importorskip(
    "pyarrow", reason="Parquet needs pyarrow: pip install 'feedbench[formats]'"
)
pq = pytest.importorskip("pyarrow.parquet")

GROUPS = {"a.parquet": [700, 130, 1200, 451], "b.parquet": [333, 900]}  # rows per row group


def _write(folder: Path, name: str, groups: list[int], seed: int):
    """A file of ``groups`` row groups (rows each) with a number, a string and a float column;
    returns its table."""
    rng = np.random.default_rng(seed)
    n = sum(groups)
    table = pa.table({"i": np.arange(n), "s": [f"row {k}" for k in range(n)], "x": rng.random(n)})
    with pq.ParquetWriter(folder / name, table.schema) as w:
        at = 0
        for rows in groups:
            w.write_table(table.slice(at, rows), row_group_size=rows)
            at += rows
    return table


def _files(folder: Path) -> dict[str, object]:
    return {name: _write(folder, name, g, seed=k) for k, (name, g) in enumerate(GROUPS.items())}


def _group_bytes(path: Path) -> list[tuple[int, int, int]]:
    """(first row, end row, bytes of its column chunks) per row group, from the file's footer."""
    md = pq.ParquetFile(path).metadata
    out, first = [], 0
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        size = sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
        out.append((first, first + rg.num_rows, size))
        first += rg.num_rows
    return out


def _sample_bytes(path: Path, n: int) -> list[int]:
    """What reading each n-row sample of ``path`` must cost: every row group its rows touch."""
    groups = _group_bytes(path)
    total = groups[-1][1]
    return [
        sum(size for a, b, size in groups if a < min(start + n, total) and b > start)
        for start in range(0, total, n)
    ]


@pytest.mark.parametrize("n", [7, 97, 451, 1000, 5000])
def test_n_row_samples_cover_each_file_once_and_read_their_row_groups(tmp_path, n):
    tables = _files(tmp_path)
    source, notes = detect(str(tmp_path), f"parquet:rows={n}")
    rows = {name: t.num_rows for name, t in tables.items()}
    assert source.fmt == "parquet"
    assert source.units() == sum(math.ceil(r / n) for r in rows.values())  # short tails kept
    samples = list(source.iter_samples(range(source.units())))
    assert all(s.error is None for s in samples)
    want_bytes = [b for name in sorted(tables) for b in _sample_bytes(tmp_path / name, n)]
    assert [s.read_bytes for s in samples] == want_bytes
    at = 0
    for name in sorted(tables):
        mine = samples[at : at + math.ceil(rows[name] / n)]
        at += len(mine)
        decoded = [source.decode(s) for s in mine]
        assert [t.num_rows for t in decoded[:-1]] == [n] * (len(mine) - 1)
        assert decoded[-1].num_rows == rows[name] - n * (len(mine) - 1)
        assert pa.concat_tables(decoded).equals(tables[name])  # the rows, in order, once
        whole = sum(size for _, _, size in _group_bytes(tmp_path / name))  # a plain reading
        assert all(0 < s.read_bytes <= whole for s in mine)
    short = [name for name, r in rows.items() if r % n]
    assert bool(short) == any("holds fewer rows" in note for note in notes)
    if short:
        assert f"last sample of {len(short)} of {len(rows)} files" in notes[0]


def test_without_rows_a_sample_is_still_a_row_group(tmp_path):
    tables = _files(tmp_path)
    source, notes = detect(str(tmp_path), "parquet")
    assert source.units() == sum(len(g) for g in GROUPS.values()) and not notes
    samples = list(source.iter_samples(range(source.units())))
    sizes = [size for name in sorted(tables) for *_, size in _group_bytes(tmp_path / name)]
    assert [s.read_bytes for s in samples] == sizes
    assert [source.decode(s).num_rows for s in samples] == [r for g in GROUPS.values() for r in g]


def test_each_footer_is_parsed_once_and_every_sample_still_read_and_decoded(tmp_path):
    tables = _files(tmp_path)
    n = 97
    source, _ = detect(str(tmp_path), f"parquet:rows={n}")
    want = [b for name in sorted(tables) for b in _sample_bytes(tmp_path / name, n)]
    whole = pa.concat_tables([tables[k] for k in sorted(tables)])
    columnar.FOOTERS.clear()
    for _ in range(2):  # the second pass finds every footer parsed
        samples = list(source.iter_samples(range(source.units())))
        assert [s.read_bytes for s in samples] == want  # the cache holds metadata, not data
        decoded = [source.decode(s) for s in samples]
        assert columnar.FOOTERS.parsed == len(tables)  # once per file, not once per sample
        assert pa.concat_tables(decoded).equals(whole)
    first = samples[0]
    first.data[:] = 0  # its bytes spoiled, its footer held: decoding reads the bytes again
    with pytest.raises(RecordFormatError, match="not a readable parquet sample"):
        source.decode(first)


def test_held_footers_stay_within_their_budget_least_recently_used_out(tmp_path):
    _files(tmp_path)
    _write(tmp_path, "c.parquet", [50, 60], seed=9)
    source, _ = detect(str(tmp_path), "parquet")
    a, b, c = (m["footer"] for m in source.table.meta)
    footers = columnar.Footers(budget=len(a) + len(b) + len(c) - 1)  # two fit, not three
    for footer in (a, b, a, c):  # c pushes out b, the least recently used
        footers.get(footer)
    assert footers.parsed == 3 and footers.held_bytes == len(a) + len(c)
    footers.get(a)
    assert footers.parsed == 3  # held
    footers.get(b)
    assert footers.parsed == 4 and footers.held_bytes == len(a) + len(b) <= footers.budget
    want = pq.ParquetFile(tmp_path / "a.parquet").metadata
    assert footers.get(a).equals(want) and footers.parsed == 4
    tiny = columnar.Footers(budget=len(a) - 1)  # a footer larger than the budget: not kept
    assert tiny.get(a).equals(want) and tiny.get(a).equals(want)
    assert tiny.parsed == 2 and tiny.held_bytes == 0


def _scan(cli, target: str, n: int, out: Path) -> dict:
    r = cli("scan", target, "--format", f"parquet:rows={n}", "--consumers", "1,2",
            "--stages", "read,decode", "--batch-size", "4", "--workers", "0", "--no-plots",
            "--json", str(out))  # fmt: skip
    assert r.code == 0, r.out + r.err
    return json.loads(out.read_text())


def _check_scan(doc: dict, n: int, path: Path) -> None:
    """Samples = ceil(rows / n) (each rank's share padded to equal length, as DistributedSampler
    pads); bytes = the row groups of the samples read, each sample paying its own."""
    spans = _sample_bytes(path, n)
    units = len(spans)
    assert units == math.ceil(pq.ParquetFile(path).metadata.num_rows / n)
    assert doc["dataset"]["format"] == "parquet" and doc["dataset"]["samples"] == units
    assert doc["config"]["fmt"] == f"parquet:rows={n}"
    for m in doc["measurements"]:
        world = m["consumers"]
        share = math.ceil(units / world)
        assert m["errors"] == 0 and m["samples"] == share * world
        assert [c["samples"] for c in m["per_consumer"]] == [share] * world
        padded = share * world - units  # the padding re-reads a sample or so
        assert sum(spans) <= m["read_bytes"] <= sum(spans) + padded * max(spans)
    assert sorted({m["consumers"] for m in doc["measurements"]}) == [1, 2]


def test_scan_counts_n_row_samples_at_one_and_two_consumers(cli, tmp_path):
    table = _write(tmp_path, "t.parquet", GROUPS["a.parquet"], seed=3)
    n = 300
    assert table.num_rows % n and math.ceil(table.num_rows / n) % 2  # a short tail, and padding
    doc = _scan(cli, str(tmp_path / "t.parquet"), n, tmp_path / "r.json")
    _check_scan(doc, n, tmp_path / "t.parquet")
    assert any("holds fewer rows" in w for w in doc["warnings"])


@pytest.mark.parametrize("bad", ["0", "-3", "1.5", "x", "", "²"])
def test_a_bad_row_count_is_one_error_line(cli, tmp_path, bad):
    _write(tmp_path, "t.parquet", [10], seed=0)
    out = tmp_path / "r.json"
    r = cli("scan", str(tmp_path / "t.parquet"), "--format", f"parquet:rows={bad}",
            "--no-plots", "--json", str(out))  # fmt: skip
    assert r.code == 2 and r.err.startswith("error: ") and len(r.err.strip().splitlines()) == 1
    assert "parquet:rows=N with N a whole number" in r.err and "Traceback" not in r.err
    assert not out.exists()


@pytest.mark.net
def test_n_row_samples_over_http_read_the_same_bytes(cli, tmp_path):
    from tests.scan.conftest import rclone_serve

    served = tmp_path / "served"
    served.mkdir()
    table = _write(served, "t.parquet", GROUPS["a.parquet"], seed=4)
    n = 300
    with rclone_serve(served, "http") as url:
        source, _ = detect(f"{url}/t.parquet", f"parquet:rows={n}")
        samples = list(source.iter_samples(range(source.units())))
        assert pa.concat_tables([source.decode(s) for s in samples]).equals(table)
        assert [s.read_bytes for s in samples] == _sample_bytes(served / "t.parquet", n)
        doc = _scan(cli, f"{url}/t.parquet", n, tmp_path / "r.json")
    _check_scan(doc, n, served / "t.parquet")


def test_a_row_group_is_found_by_its_start_in_any_order():
    from loaders.data.columnar import _group_at

    starts = list(range(4, 40_004, 4))  # 10,000 groups in file order
    assert [_group_at(starts, s) for s in (4, 20_000, 40_000)] == [0, 4999, 9999]
    assert _group_at([30, 10, 20], 10) == 1  # a writer that put them out of order
    with pytest.raises(ValueError):
        _group_at(starts, 6)  # not a group's start
