"""Hugging Face ``datasets`` streaming a local Parquet file, split by rank, through a DataLoader."""

from torch.utils.data import DataLoader


def make_loader(path, rank, world_size, batch_size, columns=None):
    from datasets import load_dataset
    from datasets.distributed import split_dataset_by_node

    dataset = load_dataset("parquet", data_files=path, split="train", streaming=True)
    if columns:
        dataset = dataset.select_columns(columns.split(","))
    dataset = split_dataset_by_node(dataset, rank=rank, world_size=world_size)
    return DataLoader(dataset.with_format("torch"), batch_size=batch_size)
