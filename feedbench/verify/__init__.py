"""feedbench verify: real DDP training per loader and GPU count, and whether the GPUs stay fed."""
