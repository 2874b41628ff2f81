"""``python -m feedbench``: the command line (torchrun starts scan ranks with it)."""

from feedbench.cli import main

main()
