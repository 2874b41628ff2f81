"""Forked loader workers must not run finalizers of objects they inherited.

A DataLoader with workers forks the process, and a worker's collector then finalizes any garbage
cycle it inherited. For a DALI pipeline left to the collector (a loader in a reference cycle,
say through a kept traceback) that ``__del__`` waits for DALI's threads, or a lock one of them
held at the fork — threads only the parent has: the worker hangs, and the training loop with it.
Seen in this test suite (``Pipeline._shutdown`` in a torch worker's init); timing-dependent, so the
test below checks the mechanism instead: garbage with a finalizer that records which process ran
it, and workers that collect as soon as they start.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.loaders.test_loaders import make_tiny

SCRIPT = textwrap.dedent(
    """
    import gc, os, sys
    import loaders.torch_backend as tb
    from loaders import build_loader

    source, backend, log = sys.argv[1], sys.argv[2], sys.argv[3]

    class Finalized:
        def __del__(self):
            with open(log, "a") as f:
                f.write(f"{os.getpid()}\\n")

    tb._worker_init = lambda _: gc.collect()  # what any allocation in a worker may set off
    loader = build_loader(source, backend, 4, workers=2, device="cpu", image_size=32)
    gc.disable()  # the cycle stays garbage until someone collects it
    cycle = [Finalized()]
    cycle.append(cycle)
    del cycle
    gc.enable()
    n = sum(len(images) for images, labels in loader)
    loader.close()
    print(os.getpid(), n)
    """
)


def test_workers_do_not_finalize_garbage_they_inherit(tmp_path):
    """The torch backend here; wds and the scan's consumer start their workers through the same
    ``loaders.base.start_workers`` (on the wds path something else already collects in the
    parent before the fork, so this test cannot tell the guard's effect there)."""
    data = make_tiny(tmp_path / "data", n=24, per_shard=6)
    log = tmp_path / "finalized-by"
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(data["tree"]), "torch", str(log)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    parent, n = map(int, r.stdout.split())
    assert n == 24
    # finalized once, by the parent: before its workers forked, not in a worker
    assert log.read_text().split() == [str(parent)]
