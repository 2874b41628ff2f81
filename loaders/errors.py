"""The errors a loader raises: one line that names the file or the fix."""

from __future__ import annotations


def last_line(text: str) -> str:
    """A traceback's last non-blank line, stripped (``TYPE: message``); ``text`` itself when it
    has none. DataLoader and scan's consumer processes hand a child's exception on as that text."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else text


class LoaderError(Exception):
    """A problem with the data or the options, in one line (e.g. the file that cannot decode).

    Raised in a DataLoader worker, it reaches the training process as DataLoader re-raises it:
    ``LoaderError(message=TEXT)`` (because of the ``message`` attribute below), TEXT being the
    worker's whole traceback. The error keeps its one line, the traceback's last, and the text
    in ``worker_traceback``."""

    message = "a loader error"  # truthy: DataLoader passes ``message=`` (torch.utils._utils)

    def __init__(self, *args: object, message: str | None = None) -> None:
        self.worker_traceback = message
        if message is not None:  # its last line is "loaders.errors.LoaderError: the line"
            args = (last_line(message).partition(": ")[2],)
        super().__init__(*args)


class MissingDependencyError(LoaderError, ImportError):
    """An optional dependency is not installed; the message says what to ``pip install``."""

    def __init__(self, package: str = "", extra: str = "", *, message: str | None = None) -> None:
        if message is not None:  # re-raised from a DataLoader worker (see LoaderError)
            super().__init__(message=message)
            self.name = None
            return
        super().__init__(f"the {extra} backend needs {package}: pip install 'feedbench[{extra}]'")
        self.name = package


def require_dali():
    """Import DALI (``nvidia.dali``) or raise :class:`MissingDependencyError`."""
    try:
        import nvidia.dali  # noqa: F401
        import nvidia.dali.plugin.pytorch  # noqa: F401
    except ImportError as e:
        raise MissingDependencyError("nvidia-dali-cuda130", "dali") from e
    return nvidia.dali
