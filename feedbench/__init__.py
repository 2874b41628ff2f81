"""feedbench: can this storage and this CPU keep my GPUs fed?"""

__version__ = "0.1.0"
