"""feedbench: can this storage and this CPU keep my GPUs fed?"""

from feedbench.version import __version__

__all__ = ["__version__", "measure"]


def __getattr__(name: str):
    # feedbench.measure imports torch: only when asked for, not with every `feedbench` command
    if name == "measure":
        from feedbench.scan.api import measure

        return measure
    raise AttributeError(f"module 'feedbench' has no attribute {name!r}")
