"""A loader that hangs: its worker delivers ``after`` samples, then waits forever on the next one
(as a read from a storage server that stopped answering, or a lock never released, would)."""

import threading

import torch
from torch.utils.data import DataLoader, Dataset


class _Hangs(Dataset):
    def __init__(self, after):
        self.after = after

    def __len__(self):
        return 1000

    def __getitem__(self, i):
        if i >= self.after:
            threading.Event().wait()  # never set
        return torch.zeros(3, 8, 8)


def make_loader(batch_size, workers, after=8):
    return DataLoader(_Hangs(after), batch_size=batch_size, num_workers=workers)
