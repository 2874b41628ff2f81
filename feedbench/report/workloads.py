"""The workload table (:mod:`feedbench.core.workloads`) for people: ``--list-workloads``."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from feedbench.core.workloads import ROWS, SHAPES
from feedbench.report.fmt import fmt_bytes


def render_workloads(console: Console) -> None:
    """One table of shapes (what ``sample --workload`` writes), one of rows (what ``scan
    --workload --accelerator`` takes), then every source."""
    shapes = Table(title="workloads: the data")
    for col in ("workload", "format", "samples/file", "sample size (mean ± std)"):
        shapes.add_column(col)
    for s in SHAPES.values():
        size = f"{fmt_bytes(s.sample_bytes)} ± {fmt_bytes(s.sample_bytes_std)}"
        shapes.add_row(s.name, s.fmt, f"{s.samples_per_file:,}", size)
    rows = Table(title="workloads: per accelerator (--accelerator)")
    for col in ("workload", "accelerator", "batch", "read threads", "step s", "samples/s", "AU ≥"):
        rows.add_column(col)
    for r in ROWS:
        rate = f"{r.batch_size / r.step_s:,.0f}"
        cells = (str(r.batch_size), str(r.read_threads), f"{r.step_s:.4g}", rate)
        rows.add_row(r.workload, r.accelerator, *cells, f"{r.target_au:.2f}")
    console.print(shapes)
    console.print(rows)
    console.print("sources:")
    for s in SHAPES.values():
        console.print(f"  {s.name} data: {s.source}", markup=False, highlight=False)
    for r in ROWS:
        console.print(f"  {r.workload} {r.accelerator}: {r.source}", markup=False, highlight=False)
