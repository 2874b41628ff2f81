"""The training and validation loops of PyTorch's ImageNet example (pytorch/examples,
imagenet/main.py), shortened, with feedbench's loaders in place of its DataLoaders.

Only the lines marked ``# loaders:`` differ from what the example does with ImageFolder,
DistributedSampler and DataLoader (docs/dropin.md shows them as a diff): the loops read
``train_sampler.set_epoch(epoch)``, ``len(train_loader)``, ``len(val_loader.sampler)`` and
``len(val_loader.dataset)`` as they always did.

    torchrun --nproc-per-node 8 examples/imagenet_example.py /data/imagenet -a resnet50

DIR holds ``train`` and ``val`` (image trees, or folders of WebDataset shards with
``--backend wds``). One process per GPU (NCCL); without CUDA, or with --cpu, gloo on the CPU.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch._dynamo  # noqa: F401  (before the process group: see examples/imagenet_ddp.py)
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Subset

import loaders  # loaders: 1 of 4


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="PyTorch ImageNet training on feedbench's loaders")
    p.add_argument("data", metavar="DIR", help="holds train/ and val/")
    p.add_argument("-a", "--arch", default="resnet18", help="a torchvision model, or 'tiny'")
    p.add_argument("-j", "--workers", default=4, type=int, help="loader workers per rank")
    p.add_argument("--epochs", default=90, type=int)
    p.add_argument("--start-epoch", default=0, type=int, help="manual epoch (restarts)")
    p.add_argument("-b", "--batch-size", default=256, type=int, help="per rank")
    p.add_argument("--lr", "--learning-rate", default=0.1, type=float)
    p.add_argument("--momentum", default=0.9, type=float)
    p.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
    p.add_argument("-p", "--print-freq", default=10, type=int)
    p.add_argument("--seed", default=0, type=int, help="the initial weights")
    # not in the original: the backend, and a small image size for quick runs
    p.add_argument("--backend", default="torch", choices=loaders.BACKENDS)
    p.add_argument("--image-size", default=224, type=int)
    p.add_argument("--cpu", action="store_true", help="gloo on the CPU even with CUDA")
    return p.parse_args()


class AverageMeter:
    """A running sum and count; ``all_reduce`` sums them over the ranks."""

    def __init__(self, name: str, fmt: str = ":f") -> None:
        self.name, self.fmt = name, fmt
        self.val = self.sum = self.count = self.avg = 0.0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def all_reduce(self) -> None:
        total = torch.tensor([self.sum, self.count], dtype=torch.float64)
        dist.all_reduce(total)
        self.sum, self.count = total.tolist()
        self.avg = self.sum / self.count

    def __str__(self) -> str:
        return ("{name} {val" + self.fmt + "} ({avg" + self.fmt + "})").format(**vars(self))


def accuracy(output: torch.Tensor, target: torch.Tensor, topk=(1,)) -> list[float]:
    """Top-k accuracy in percent, for each k."""
    pred = output.topk(max(topk), 1).indices
    hit = pred.eq(target.view(-1, 1))
    return [100.0 * float(hit[:, :k].any(1).float().mean()) for k in topk]


def make_model(arch: str, num_classes: int) -> nn.Module:
    if arch == "tiny":  # a 3-layer CNN, for runs on the CPU
        return nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, 2, 1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes),
        )  # fmt: skip
    import torchvision

    return torchvision.models.get_model(arch, num_classes=num_classes)


def train(train_loader, model, criterion, optimizer, epoch: int, device, args) -> None:
    losses, top1 = AverageMeter("Loss", ":.4e"), AverageMeter("Acc@1", ":6.2f")
    model.train()
    end = time.time()
    for i, (images, target) in enumerate(train_loader):
        images = images.to(device, non_blocking=True)  # already there: the loaders put it there
        target = target.to(device, non_blocking=True)
        output = model(images)
        loss = criterion(output, target)
        losses.update(loss.item(), images.size(0))
        top1.update(accuracy(output, target)[0], images.size(0))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i % args.print_freq == 0 and dist.get_rank() == 0:
            took = time.time() - end
            print(f"Epoch: [{epoch}][{i}/{len(train_loader)}] {losses} {top1} ({took:.2f}s)")
        end = time.time()


def validate(val_loader, model, criterion, device, args) -> float:
    losses, top1 = AverageMeter("Loss", ":.4e"), AverageMeter("Acc@1", ":6.2f")

    def run_validate(loader) -> None:
        with torch.no_grad():
            for images, target in loader:
                images = images.to(device, non_blocking=True)
                target = target.to(device, non_blocking=True)
                output = model(images)
                losses.update(criterion(output, target).item(), images.size(0))
                top1.update(accuracy(output, target)[0], images.size(0))

    model.eval()
    run_validate(val_loader)
    top1.all_reduce()
    # the original's remainder: what a drop_last DistributedSampler left out, evaluated on every
    # rank after the reduction; the loaders' exact evaluation leaves nothing there
    world = dist.get_world_size()
    if len(val_loader.sampler) * world < len(val_loader.dataset):
        rest = Subset(
            val_loader.dataset, range(len(val_loader.sampler) * world, len(val_loader.dataset))
        )
        run_validate(DataLoader(rest, batch_size=args.batch_size, num_workers=args.workers))
    print(f"rank {dist.get_rank()}: * Acc@1 {top1.avg:.3f} of {int(top1.count)} images")
    return top1.avg


def main() -> None:
    args = parse_args()
    cpu = args.cpu or not torch.cuda.is_available()
    device = torch.device("cpu") if cpu else torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    if not cpu:
        torch.cuda.set_device(device)
    dist.init_process_group("gloo" if cpu else "nccl")
    traindir, valdir = os.path.join(args.data, "train"), os.path.join(args.data, "val")
    kw = dict(batch_size=args.batch_size, workers=args.workers, device=device,
              backend=args.backend, image_size=args.image_size)  # fmt: skip
    train_loader = loaders.build_loader(traindir, **kw)  # loaders: 2 of 4
    train_sampler = train_loader.sampler  # loaders: 3 of 4
    val_loader = loaders.build_loader(valdir, train=False, **kw)  # loaders: 4 of 4

    torch.manual_seed(args.seed)
    model = make_model(args.arch, len(train_loader.dataset.classes)).to(device)
    model = nn.parallel.DistributedDataParallel(model, device_ids=None if cpu else [device.index])
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(
        model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay
    )
    for epoch in range(args.start_epoch, args.epochs):
        train_sampler.set_epoch(epoch)
        for group in optimizer.param_groups:  # the LR decayed by 10 every 30 epochs
            group["lr"] = args.lr * 0.1 ** (epoch // 30)
        train(train_loader, model, criterion, optimizer, epoch, device, args)
        validate(val_loader, model, criterion, device, args)
    for loader in (train_loader, val_loader):
        loader.close()
    del model, optimizer  # DDP holds the group: free it first (imagenet_ddp.py)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
