"""A loader whose ranks yield different batch counts (rank 0 one more): DDP would hang."""

import torch


def make_loader(rank, batch_size):
    return [torch.zeros(batch_size, 3) for _ in range(3 if rank == 0 else 2)]
