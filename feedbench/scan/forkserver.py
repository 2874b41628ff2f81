"""The fork server's first import (its preload): the server dies with the scan that started it,
even one killed outright (SIGKILL), and with it every consumer forked from it (theirs is the
same request: :func:`feedbench.core.supervise.die_with_parent`). Without it the server goes on
until its interpreter's teardown ends, seconds with torch loaded, and its consumers go on
reading meanwhile."""

from __future__ import annotations

import os

from feedbench.core.supervise import die_with_parent

SERVER_PARENT_ENV = "FEEDBENCH_FORK_SERVER_PARENT"  # the scan's pid, in the server's environment

_parent = os.environ.get(SERVER_PARENT_ENV)
if _parent is not None:  # this is the server (the scan set it only to start it)
    die_with_parent(int(_parent))
