"""The errors a loader raises: one line that names the file or the fix."""

from __future__ import annotations


class LoaderError(Exception):
    """A problem with the data or the options, in one line (e.g. the file that cannot decode)."""


class MissingDependencyError(LoaderError, ImportError):
    """An optional dependency is not installed; the message says what to ``pip install``."""

    def __init__(self, package: str, extra: str) -> None:
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
