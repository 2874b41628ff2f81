"""A stall shorter than --stall-timeout: the scan goes on, but the measurement says where it
waited, and the run is not valid for sizing (a real loopback web server that pauses)."""

from __future__ import annotations

import contextlib
import http.server
import shutil
import threading
import time

from feedbench.scan.config import ScanConfig
from feedbench.scan.run import scan
from tests.conftest import loopback_http

PAUSE_S = 2.5


@contextlib.contextmanager
def pausing_http(root, pause_on: int):
    """A real web server over ``root`` (index pages, as ``python -m http.server``) that sends
    half of the ``pause_on``-th JPEG it serves, sleeps ``PAUSE_S`` and then sends the rest."""
    served = {"jpegs": 0}
    lock = threading.Lock()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def copyfile(self, source, outputfile):
            if not self.path.endswith(".jpg"):
                return super().copyfile(source, outputfile)
            with lock:
                served["jpegs"] += 1
                mine = served["jpegs"]
            data = source.read()
            if mine == pause_on:
                outputfile.write(data[: len(data) // 2])
                outputfile.flush()
                time.sleep(PAUSE_S)
                data = data[len(data) // 2 :]
            outputfile.write(data)

        def log_message(self, *args):
            pass

    with loopback_http(Handler, root) as port:
        yield f"http://127.0.0.1:{port}"


def test_a_pause_under_the_stall_timeout_is_found_and_not_valid(dataset, tmp_path):
    root = tmp_path / "site"
    shutil.copytree(dataset / "images", root / "images")
    # 24 images in batches of 2 read one by one: the 15th is in the 8th batch, after warm-up
    with pausing_http(root, pause_on=15) as url:
        config = ScanConfig(f"{url}/images/", stages=("read",), batch_size=2, workers=0,
                            stall_timeout_s=30.0)  # fmt: skip
        result = scan(config)
    (m,) = result.measurements
    assert not m.failed and not result.failure  # under the timeout: measured
    assert m.longest_gap_s is not None and PAUSE_S * 0.9 < m.longest_gap_s < PAUSE_S + 2
    assert m.longest_gap_rank == 0 and 0 < m.longest_gap_at_s < m.wall_s
    stall = [b for b in result.sizing.broken if b.startswith("a stall:")]
    assert stall == [
        f"a stall: consumer 0 waited {m.longest_gap_s:.1f} s for one batch at "
        f"{m.longest_gap_at_s:.1f} s into the pass (1 consumer, cold pass, repeat 1; the median "
        f"wait was {m.median_gap_s * 1e3:.0f} ms): its rates average the stall in"
    ]
    assert not result.sizing.valid
