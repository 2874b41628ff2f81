"""A plain torchvision loader, as a training script builds it: ImageFolder, DistributedSampler,
DataLoader (``feedbench scan --loader tests/scan/factories/fb_imagefolder.py:make_loader``)."""

from torch.utils.data import DataLoader, DistributedSampler
from torchvision import transforms
from torchvision.datasets import ImageFolder


def make_loader(path, rank, world_size, batch_size, workers, seed, image_size=224):
    train = transforms.Compose(
        [
            transforms.RandomResizedCrop(image_size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
        ]  # fmt: skip
    )
    dataset = ImageFolder(path, transform=train)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=seed)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers)
