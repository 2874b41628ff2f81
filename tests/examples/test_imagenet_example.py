"""PyTorch's ImageNet example's loops with the loaders in place (examples/imagenet_example.py,
docs/dropin.md), under torchrun: 2 ranks, gloo on the CPU, real JPEGs.

It keeps ``train_sampler = train_loader.sampler`` and calls ``train_sampler.set_epoch(epoch)``;
``--start-epoch 1`` must then train on epoch 1's order. Its validation evaluates
``range(len(val_loader.sampler) * world_size, len(val_loader.dataset))`` again after the
distributed loop: with the exact evaluation that must be empty, or samples count twice.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.examples.test_examples import EXAMPLES, _run

pytestmark = [
    pytest.mark.slow,  # torchrun starts processes that import torch
    pytest.mark.usefixtures("torchrun_logs"),
]


def _example(data: Path, *args: str) -> str:
    """Two ranks, batches of 4 at 32 px, a tiny CNN, loss and accuracy every step."""
    return _run(
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(EXAMPLES / "imagenet_example.py"), str(data), "--cpu", "-a", "tiny", "-j", "0",
        "-b", "4", "--image-size", "32", "-p", "1", *args,
    )  # fmt: skip


def _losses(out: str, epoch: int) -> list[str]:
    return re.findall(rf"Epoch: \[{epoch}\]\[\d+/3\] Loss (\S+)", out)


def _counted(out: str) -> list[tuple[str, str]]:
    """(rank, images counted) of every validation."""
    return re.findall(r"rank (\d): \* Acc@1 \S+ of (\d+) images", out)


@pytest.fixture
def imagenet(dataset, tmp_path) -> Path:
    """train/: the 24-image tree; val/: the same less one image (23: 12 and 11 per rank)."""
    root = tmp_path / "imagenet"
    root.mkdir()
    (root / "train").symlink_to(dataset / "images")
    shutil.copytree(dataset / "images", root / "val")
    min(p for p in (root / "val").rglob("*.jpg")).unlink()
    return root


def test_imagenet_example_resumes_at_start_epoch_on_that_epochs_order(imagenet):
    # a learning rate of 0: the weights never change, so a step's loss depends on its batch only
    full = _example(imagenet, "--epochs", "2", "--lr", "0")
    resumed = _example(imagenet, "--epochs", "2", "--lr", "0", "--start-epoch", "1")
    assert len(_losses(full, 0)) == len(_losses(full, 1)) == 3  # 24 / 2 ranks / 4 per batch
    assert _losses(full, 0) != _losses(full, 1)  # the losses tell the epochs' batches apart
    assert _losses(resumed, 0) == []
    assert _losses(resumed, 1) == _losses(full, 1)  # the kept train_sampler set epoch 1
    # every validation counts the 23 images once on every rank: nothing evaluated twice
    assert sorted(_counted(full)) == [("0", "23")] * 2 + [("1", "23")] * 2
    assert sorted(_counted(resumed)) == [("0", "23"), ("1", "23")]


def test_imagenet_example_on_shards(dataset, tmp_path):
    root = tmp_path / "imagenet"
    root.mkdir()
    for part in ("train", "val"):
        (root / part).symlink_to(dataset / "shards")
    out = _example(root, "--epochs", "1", "--backend", "wds")
    assert len(_losses(out, 0)) == 3
    assert sorted(_counted(out)) == [("0", "24"), ("1", "24")]
