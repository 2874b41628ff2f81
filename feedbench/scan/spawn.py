"""A count's local consumers as processes, started and joined with the standard library: the
parent needs no torch (seconds to import on a small host; the consumers have it from the fork
server). A consumer's exception reaches the parent as its traceback's text, any other failed
exit as its exit code. A failure does not end the other consumers here: the caller ends them
all, loader workers included (:func:`feedbench.scan.run._end`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import pickle
import sys
import tempfile
import traceback
from collections.abc import Callable


class ConsumerRaised(Exception):
    """Consumer ``index`` raised; the message is its traceback."""

    def __init__(self, trace: str, index: int) -> None:
        super().__init__(trace)
        self.index = index


class ConsumerExited(Exception):
    """Consumer ``index`` ended with ``exit_code`` (negative: the signal) without raising."""

    def __init__(self, index: int, exit_code: int) -> None:
        super().__init__(f"consumer {index} exited with code {exit_code}")
        self.index, self.exit_code = index, exit_code


def _run(fn: Callable, index: int, args: tuple, error_file: str) -> None:
    """In the consumer: ``fn(index, *args)``; an exception's traceback goes to ``error_file``
    (one file per consumer: a queue could deadlock a consumer ending mid-write)."""
    try:
        fn(index, *args)
    except KeyboardInterrupt:
        pass
    except Exception:
        with open(error_file, "wb") as f:
            pickle.dump(traceback.format_exc(), f)
        sys.exit(1)


class Consumers:
    """The processes of :func:`start`, in index order."""

    def __init__(self, processes: list, error_files: list[str]) -> None:
        self.processes = processes
        self.error_files = error_files
        self._waiting = {p.sentinel: i for i, p in enumerate(processes)}

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` for consumers to end: True once all have ended well;
        :class:`ConsumerRaised` or :class:`ConsumerExited` for the first that did not."""
        if not self._waiting:
            return True
        for sentinel in multiprocessing.connection.wait(list(self._waiting), timeout=timeout):
            index = self._waiting.pop(sentinel)
            process = self.processes[index]
            process.join()
            if process.exitcode != 0:
                raise self._failure(index, process.exitcode)
        return not self._waiting

    def _failure(self, index: int, exit_code: int) -> Exception:
        path = self.error_files[index]
        try:
            with open(path, "rb") as f:
                return ConsumerRaised(pickle.load(f), index)
        except (OSError, EOFError, pickle.UnpicklingError):  # it wrote none: it exited
            return ConsumerExited(index, exit_code)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def remove_error_files(self) -> None:
        """Every consumer's error file (those that raised after the first failure too)."""
        for path in self.error_files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def start(fn: Callable, args: tuple, n: int, method: str) -> Consumers:
    """``n`` processes of ``fn(index, *args)``, started by ``method`` (fork server, spawn)."""
    ctx = multiprocessing.get_context(method)
    processes, error_files = [], []
    for index in range(n):
        fd, path = tempfile.mkstemp(prefix="feedbench-consumer-", suffix=".error")
        os.close(fd)
        os.unlink(path)  # written only by a consumer that raised
        process = ctx.Process(target=_run, args=(fn, index, args, path))
        process.start()
        processes.append(process)
        error_files.append(path)
    return Consumers(processes, error_files)
