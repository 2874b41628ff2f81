"""Train and validate with Lightning (DDP) on feedbench's loaders, validation exact over the ranks
(docs/eval-and-small-data.md).

    torchrun --nproc-per-node 8 examples/lightning_ddp.py data/train data/val
    torchrun --nproc-per-node 2 examples/lightning_ddp.py data/train data/val --cpu

Lightning takes the loaders as they are (it puts a DistributedSampler only into a torch
DataLoader): each shards by itself. Validation is exact (no repeats, ranks may differ by a batch),
which Lightning's per-epoch reduction allows; it logs sums (``reduce_fx="sum"``), not per-rank
means, so the top-1 is exact when the ranks hold different numbers of images.
"""

from __future__ import annotations

import argparse
import os

import lightning as L
import torch
import torch.distributed as dist
from torch import nn

from loaders import BACKENDS, build_loader


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Lightning DDP training and validation on loaders.")
    p.add_argument("train", help="training data: an image tree or a directory of .tar shards")
    p.add_argument("val", help="validation data, checked after every epoch")
    p.add_argument("--backend", choices=BACKENDS, default="torch")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--workers", type=int, default=None, help="loader workers per rank")
    p.add_argument("--cpu", action="store_true", help="run on the CPU (gloo)")
    return p.parse_args()


class Classifier(L.LightningModule):
    def __init__(self, classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(16, classes),
        )

    def training_step(self, batch, _):
        images, labels = batch
        return nn.functional.cross_entropy(self.net(images), labels)

    def validation_step(self, batch, _):
        images, labels = batch
        correct = (self.net(images).argmax(1) == labels).sum().float()
        # sums, reduced over the ranks once per epoch: exact whatever each rank holds
        kw = dict(reduce_fx="sum", sync_dist=True, on_epoch=True, batch_size=len(labels))
        self.log("val_correct", correct, **kw)
        self.log("val_images", torch.tensor(float(len(labels))), **kw)

    def on_validation_epoch_end(self) -> None:
        m = self.trainer.callback_metrics
        if not self.trainer.sanity_checking and self.trainer.is_global_zero:
            correct, images = float(m["val_correct"]), int(m["val_images"])
            print(
                f"epoch {self.current_epoch} validation: top-1 {100 * correct / images:.2f}% "
                f"of {images} images",
                flush=True,
            )

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    args = parse_args()
    trainer = L.Trainer(
        accelerator="cpu" if args.cpu else "auto",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),  # torchrun's processes per node
        strategy="ddp",
        max_epochs=args.epochs,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    where = dict(
        rank=trainer.global_rank,
        world_size=trainer.world_size,
        local_rank=trainer.local_rank,
        device=trainer.strategy.root_device,
        image_size=args.image_size,
        workers=args.workers,
    )
    train = build_loader(args.train, args.backend, args.batch_size, **where)
    val = build_loader(args.val, args.backend, args.batch_size, train=False, **where)
    model = Classifier(int(train.index.labels.max()) + 1)
    trainer.fit(model, train, val)
    # the loaders' workers and threads end here, not in the interpreter's teardown
    train.close()
    val.close()


def end_in_step() -> None:
    """Under gloo, Lightning leaves the process group to the interpreter's exit (it destroys it
    at exit only under NCCL): gloo's threads are then torn down out of step with the other ranks,
    where a rank was seen to abort ("terminate called without an active exception"). Here, with
    the trainer and its DDP model gone with main(), they end inside destroy_process_group, while
    every rank is still here."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    end_in_step()
