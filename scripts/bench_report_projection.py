"""What the scan page's Projection costs ``feedbench report SCAN --html``: the whole page's CPU
time (process time, after one warm-up page: imports and fonts are paid once), and the parts the
projection adds: the fits (once a page; before 2026-12-03, once for the text and once for the
figure) and the plan figure as a PNG.

    PYTHONPATH=$PWD python scripts/bench_report_projection.py \
        benchmarks/2026-12-03-devvm-plan/scan-*.json.gz

Run it under an older tree's PYTHONPATH for the page's cost before (the parts are then skipped).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from benchlib.common import cpu


def main(paths: list[str]) -> None:
    from feedbench.report import kinds
    from feedbench.report.export import write_exports
    from feedbench.report.kinds import load_any

    with tempfile.TemporaryDirectory() as d:
        page = Path(d) / "page.html"
        for path in paths:
            kind, result = load_any(path)
            write_exports(kind, result, path, html=page)  # warm-up
            whole = cpu(lambda: write_exports(kind, result, path, html=page))  # noqa: B023
            line = f"{Path(path).name}: page {whole:.2f} s CPU"
            try:
                from feedbench.project.plots import plan_plot
                from feedbench.project.section import default_plan
            except ImportError:  # a tree from before the section
                print(line)
                continue
            fit = cpu(lambda: default_plan(result, path))  # noqa: B023
            plan, _ = default_plan(result, path)
            png = Path(d) / "plan.png"
            drawn = cpu(lambda: plan_plot(plan, png), 3) if plan else 0.0  # noqa: B023
            fits = 1 if hasattr(kinds, "fit_projection") else 2  # once a page, or text and figure
            print(f"{line}; of it the fits {fits * fit:.2f} s ({fits} × {fit:.2f}), "
                  f"figure {drawn:.2f} s")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
