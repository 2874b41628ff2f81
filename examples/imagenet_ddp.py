"""Train an image classifier with DDP on feedbench's loaders, in the spirit of PyTorch's
examples/imagenet/main.py: exact validation, and checkpoints that resume mid-epoch.

    torchrun --nproc-per-node 8 examples/imagenet_ddp.py data/train --val data/val \\
        --backend dali --arch resnet50 --epochs 90 --batch-size 256 \\
        --checkpoint ckpt.pt --checkpoint-every 1000          # add --resume ckpt.pt to go on

One process per GPU (NCCL, GPU = local rank); with --cpu, or without CUDA, the ranks run on the
CPU over gloo. TRAIN and --val are image trees (class folders) or WebDataset shards.
"""

from __future__ import annotations

import argparse
import os

import torch

# DDP's constructor imports torch._dynamo. Imported after the process group exists, it keeps ten
# references to it (torch 2.14.1): the group and gloo's threads then outlive destroy_process_group
# and end at interpreter exit, no longer in step with the other ranks (rank 1 was seen to abort
# there). Imported before, both end at destroy_process_group.
import torch._dynamo  # noqa: F401
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from loaders import BACKENDS, build_loader


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="DDP training on feedbench's loaders.")
    p.add_argument("train", help="training data: an image tree or a directory of .tar shards")
    p.add_argument("--val", help="validation data, checked after every epoch (default: none)")
    p.add_argument("--backend", choices=BACKENDS, default="torch")
    p.add_argument("--arch", default="tiny", help="'tiny' (a 3-layer CNN) or a torchvision model")
    p.add_argument("--epochs", type=int, default=90)
    p.add_argument("--batch-size", type=int, default=256, help="per rank")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--workers", type=int, help="loader workers per rank (default: its core share)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu", action="store_true", help="train on the CPU (gloo) even with CUDA")
    p.add_argument("--print-freq", type=int, default=10, help="steps between loss lines")
    p.add_argument(
        "--checkpoint",
        help="save model, optimizer and loader position here "
        "(a {step} in the name, say ckpt-{step}.pt, keeps every one)",
    )
    p.add_argument("--checkpoint-every", type=int, default=1000, help="steps between saves")
    p.add_argument("--resume", help="checkpoint to go on from (exactly where it was taken)")
    p.add_argument("--save-final", help="save the trained model's state_dict here")
    return p.parse_args()


def setup(cpu: bool) -> tuple[int, int, torch.device]:
    """Join the process group torchrun describes in the environment; this rank's device."""
    if cpu or not torch.cuda.is_available():
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)  # NCCL's collectives, all_gather_object too, use it
    dist.init_process_group("gloo" if device.type == "cpu" else "nccl")
    return dist.get_rank(), dist.get_world_size(), device


def make_model(arch: str, num_classes: int) -> nn.Module:
    if arch != "tiny":
        import torchvision  # only when asked: it adds a second of start-up to every rank

        return torchvision.models.get_model(arch, num_classes=num_classes)

    def block(cin: int, cout: int) -> list[nn.Module]:
        conv = nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False)
        return [conv, nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

    return nn.Sequential(
        *block(3, 16), *block(16, 32), *block(32, 64),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes),
    )  # fmt: skip


def save_checkpoint(path: str, step: int, model, optimizer, scheduler, loader) -> None:
    """Everything a resumed run needs to go on exactly, written by rank 0."""
    # dali's loader state is per rank (torch's and wds's are the same on every rank): keep all
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, loader.state_dict())
    if dist.get_rank() == 0:
        ckpt = {
            "step": step,
            "model": model.module.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "loaders": states,
        }
        path = path.format(step=step)
        torch.save(ckpt, path + ".tmp")
        os.replace(path + ".tmp", path)  # a job killed while saving keeps the previous one


def load_checkpoint(path: str, model, optimizer, scheduler, loader) -> int:
    """Restore what :func:`save_checkpoint` saved; the global step it was taken at."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    loader.load_state_dict(ckpt["loaders"][dist.get_rank()])
    return ckpt["step"]


def validate(model: nn.Module, loader, device: torch.device) -> tuple[int, int]:
    """Top-1 over the whole validation set: (correct, seen), summed over the ranks.

    With train=False every image is on exactly one rank, so the sums count each once. Ranks
    may hold a batch more or less, so no collective may run per batch: call the bare module
    (DDP's forward would broadcast buffers) and all_reduce once, after the loop."""
    model.eval()
    totals = torch.zeros(2, dtype=torch.int64, device=device)
    with torch.no_grad():
        for images, labels in loader:
            totals[0] += (model.module(images).argmax(1) == labels).sum()
            totals[1] += len(labels)
    dist.all_reduce(totals)
    model.train()
    return int(totals[0]), int(totals[1])


def train_epoch(args, epoch: int, step: int, model, loader, optimizer, scheduler) -> int:
    """One epoch, or its rest after a resume; the global step after it."""
    criterion = nn.CrossEntropyLoss()
    done = loader.state_dict()["batches"]  # of this epoch, trained on before a resume
    for batch, (images, labels) in enumerate(loader, start=done + 1):
        loss = criterion(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        if dist.get_rank() == 0 and step % args.print_freq == 0:
            print(f"epoch {epoch} batch {batch}/{len(loader)} step {step} loss {loss.item():.4f}")
        # midway through the epoch only: its end is saved after validation and the LR step
        if args.checkpoint and step % args.checkpoint_every == 0 and batch < len(loader):
            save_checkpoint(args.checkpoint, step, model, optimizer, scheduler, loader)
    return step


def main() -> None:
    args = parse_args()
    rank, world, device = setup(args.cpu)
    # the loaders shard by rank themselves: no DistributedSampler, and the batches arrive on device
    common = dict(
        backend=args.backend,
        batch_size=args.batch_size,
        image_size=args.image_size,
        rank=rank,
        world_size=world,
        seed=args.seed,
        workers=args.workers,
        device=device,
    )
    train_loader = build_loader(args.train, train=True, **common)
    val_loader = build_loader(args.val, train=False, **common) if args.val else None
    torch.manual_seed(args.seed)  # the same weights on every rank (DDP broadcasts rank 0's too)
    model = make_model(args.arch, train_loader.index.num_classes).to(device)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)  # per epoch
    step = 0
    if args.resume:
        step = load_checkpoint(args.resume, model, optimizer, scheduler, train_loader)
        at = train_loader.state_dict()
        if rank == 0:
            print(
                f"resumed from {args.resume}: epoch {at['epoch']} batch {at['batches']}/"
                f"{len(train_loader)} step {step}"
            )
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    for epoch in range(train_loader.state_dict()["epoch"], args.epochs):
        train_loader.set_epoch(epoch)  # keeps a resumed loader's place in this epoch
        step = train_epoch(args, epoch, step, model, train_loader, optimizer, scheduler)
        scheduler.step()
        if val_loader is not None:
            correct, seen = validate(model, val_loader, device)
            if rank == 0:
                top1 = 100 * correct / seen
                print(f"epoch {epoch} validation: top-1 {top1:.2f}% of {seen} images")
        if args.checkpoint:
            save_checkpoint(args.checkpoint, step, model, optimizer, scheduler, train_loader)
    if args.save_final and rank == 0:
        torch.save(model.module.state_dict(), args.save_final)
    for loader in (train_loader, val_loader):
        if loader is not None:
            loader.close()
    # The DDP model holds the process group: freed first, the group and its threads end inside
    # destroy_process_group, while every rank is still here, not at interpreter exit (see the
    # torch._dynamo import at the top; rank 1 was seen to abort there: "terminate called")
    del model, optimizer, scheduler
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
