"""The line a failed consumer gets (scan/watch.py): the last line of its traceback, our own error
classes' names left out (their messages are one line already), a foreign error's name kept."""

from __future__ import annotations

import pytest

from feedbench.scan.watch import _last_line

TRACE = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'


@pytest.mark.parametrize(
    ("last", "said"),
    [
        (
            "loaders.errors.LoaderError: shards/a.tar: cut at byte 10",
            "shards/a.tar: cut at byte 10",
        ),
        ("feedbench.core.errors.FeedbenchError: no such file", "no such file"),
        ("LoaderError: bad option", "bad option"),
        ("OSError: [Errno 5] Input/output error", "OSError: [Errno 5] Input/output error"),
        ("mymodule.MyLoaderError: theirs", "mymodule.MyLoaderError: theirs"),
        (
            "RuntimeError: loaders.errors.LoaderError: inside",
            "RuntimeError: loaders.errors.LoaderError: inside",
        ),
    ],
)
def test_a_failed_consumers_line(last, said):
    assert _last_line(TRACE + "    " + last + "\n\n") == said
