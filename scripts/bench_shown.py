"""What ``shown(result)`` costs (the copy with control characters escaped that every renderer and
figure builder starts from), for a scan whose monitor timelines are long: the test data of
``tests/report/test_plots.py`` (12 measurements, 2 GPUs) with each timeline lengthened to
``READINGS`` readings. Prints the median process time of one copy, and of a scan's three figures.

    PYTHONPATH=$PWD python scripts/bench_shown.py [READINGS]
"""

from __future__ import annotations

import dataclasses
import sys

from benchlib.common import cpu


def main(readings: int) -> None:
    from feedbench.report import scan_plots
    from feedbench.report.fmt import shown
    from tests.report.test_plots import make_result

    result = make_result(gpus=2)
    for m in result.measurements:
        first = m.monitor.samples
        m.monitor.samples = [
            dataclasses.replace(first[i % len(first)], t_s=0.25 * (i + 1)) for i in range(readings)
        ]
    total = sum(len(m.monitor.samples) for m in result.measurements)
    print(f"{len(result.measurements)} measurements, {total:,} readings")
    print(f"shown(result): {cpu(lambda: shown(result)):.3f} s")
    figures = (scan_plots.scaling_figure, scan_plots.au_figure, scan_plots.timeline_figure)
    for build in figures:
        print(f"{build.__name__}: {cpu(lambda b=build: b(result), repeats=3):.3f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
