"""Can my own DataLoader keep N GPUs fed? Measure it with ``feedbench.measure``.

    python examples/measure_my_loader.py data/images --consumers 1 2 4 --step-time 0.05

Each consumer is one process standing for one GPU / DDP rank: it builds the loader below for its
rank, takes batches and sleeps ``--step-time`` per batch in place of the model's step (all ranks in
step, as DDP is). AU (accelerator utilisation) is the share of time a GPU would spend computing
rather than waiting for data.
"""

from __future__ import annotations

import argparse

from torch.utils.data import DataLoader, DistributedSampler
from torchvision import transforms
from torchvision.datasets import ImageFolder

import feedbench


def make_loader(path, rank, world_size, batch_size, workers, seed, image_size=224):
    """The loader of your training script, as a factory. feedbench calls it in every consumer
    with the keywords it takes (also local_rank and epoch), plus the ``options`` given to
    ``measure``. It must live at the top of a .py file: the consumer processes import it."""
    train = transforms.Compose(
        [
            transforms.RandomResizedCrop(image_size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
        ]
    )
    data = ImageFolder(path, transform=train)
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, seed=seed)
    return DataLoader(data, batch_size=batch_size, sampler=sampler, num_workers=workers)


def main() -> None:
    p = argparse.ArgumentParser(description="Measure a torchvision ImageFolder DataLoader.")
    p.add_argument("data", help="an image tree: one folder per class")
    p.add_argument("--consumers", type=int, nargs="+", default=[1, 2], help="GPUs to emulate")
    p.add_argument("--step-time", type=float, default=0.05, help="seconds of a training step")
    p.add_argument("--batch-size", type=int, default=64, help="per consumer")
    p.add_argument("--workers", type=int, help="loader workers per consumer (default: core share)")
    p.add_argument("--image-size", type=int, default=224)
    args = p.parse_args()

    # passing the data path lets feedbench drop it from the page cache first: a cold read
    result = feedbench.measure(
        make_loader,
        args.data,
        consumers=args.consumers,
        step_time_s=args.step_time,
        batch_size=args.batch_size,
        workers=args.workers,
        options={"image_size": args.image_size},  # more keywords for make_loader
    )
    for point in result.curve:  # one per consumer count (mean over repeats, after warm-up)
        print(
            f"{point.consumers} consumer(s): {point.samples_per_s_mean:.1f} samples/s, "
            f"AU {point.au_mean:.2f} (lowest rank {point.au_min:.2f})"
        )
    print(f"verdict: {result.verdict.text}")


if __name__ == "__main__":
    main()
