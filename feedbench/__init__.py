"""feedbench: can this storage and this CPU keep my GPUs fed?"""

__version__ = "0.1.0"


def __getattr__(name: str):
    # feedbench.measure imports torch: only when asked for, not with every `feedbench` command
    if name == "measure":
        from feedbench.scan.api import measure

        return measure
    raise AttributeError(f"module 'feedbench' has no attribute {name!r}")
