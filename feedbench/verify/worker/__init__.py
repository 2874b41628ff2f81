"""One DDP rank of ``feedbench verify``: ``python -m feedbench.verify.worker`` under torchrun."""
