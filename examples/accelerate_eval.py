"""Train and evaluate with Hugging Face Accelerate on feedbench's loaders: a gather every
evaluation step, exact over the ranks (docs/eval-and-small-data.md).

    accelerate launch --num-processes 8 examples/accelerate_eval.py data/train data/val
    torchrun --nproc-per-node 2 examples/accelerate_eval.py data/train data/val --cpu

The loaders shard by themselves (``accelerator.prepare`` would return them as they are), so they
are not prepared. Evaluation uses ``even_batches=True``: every rank yields batches of the same
sizes, which a per-step ``accelerator.gather`` needs, and ``valid`` marks the repeats that make
them even, so each image is counted once.
"""

from __future__ import annotations

import argparse

import torch

# DDP's constructor (which prepare() calls) imports torch._dynamo; imported after the process
# group exists, it keeps references to it (torch 2.14.1) and gloo's threads outlive the group's
# end, to abort the process at interpreter exit ("terminate called without an active
# exception", seen in CI). Imported before, they end with the group (as in imagenet_ddp.py).
import torch._dynamo  # noqa: F401
from accelerate import Accelerator
from torch import nn

from loaders import BACKENDS, build_loader


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Accelerate training and evaluation on loaders.")
    p.add_argument("train", help="training data: an image tree or a directory of .tar shards")
    p.add_argument("val", help="validation data, checked after every epoch")
    p.add_argument("--backend", choices=BACKENDS, default="torch")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--workers", type=int, default=None, help="loader workers per rank")
    p.add_argument("--cpu", action="store_true", help="run on the CPU (gloo)")
    return p.parse_args()


def tiny_cnn(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, classes),
    )


def evaluate(accelerator: Accelerator, model: nn.Module, loader) -> tuple[int, int]:
    """(correct, counted) over every rank: a gather per step, the repeats left out."""
    model.eval()
    correct = counted = 0
    with torch.no_grad():
        for images, labels, valid in loader:
            preds = model(images).argmax(1)
            preds, labels, valid = accelerator.gather((preds, labels, valid))
            correct += int((preds == labels)[valid].sum())
            counted += int(valid.sum())
    return correct, counted


def main() -> None:
    args = parse_args()
    accelerator = Accelerator(cpu=args.cpu)
    where = dict(
        rank=accelerator.process_index,
        world_size=accelerator.num_processes,
        local_rank=accelerator.local_process_index,
        device=accelerator.device,
        image_size=args.image_size,
        workers=args.workers,
    )
    train = build_loader(args.train, args.backend, args.batch_size, **where)
    val = build_loader(args.val, args.backend, args.batch_size, train=False, even_batches=True,
                       **where)  # fmt: skip
    model = tiny_cnn(int(train.index.labels.max()) + 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    for epoch in range(args.epochs):
        model.train()
        train.set_epoch(epoch)
        for images, labels in train:
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
        correct, counted = evaluate(accelerator, model, val)
        accelerator.print(
            f"epoch {epoch} validation: top-1 {100 * correct / counted:.2f}% of {counted} images"
        )
    # the loaders' worker processes and threads ended here, not by the interpreter's teardown
    # (where a thread still running can abort the process: BENCHMARKS, loader workers at exit)
    train.close()
    val.close()
    del model, optimizer  # the DDP model holds the process group: freed before it ends
    accelerator.wait_for_everyone()
    accelerator.end_training()
    if torch.distributed.is_initialized():  # every rank still here: the group ends in step
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
