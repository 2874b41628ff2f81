"""The models a verify trains."""

from __future__ import annotations

from feedbench.core.errors import FeedbenchError
from feedbench.verify.config import MODELS


def build_model(name: str, num_classes: int):
    """torchvision ResNet-50 / ResNet-18 (random weights), or a small CNN for CPU runs."""
    import torch.nn as nn

    if name in ("resnet50", "resnet18"):
        import torchvision

        return getattr(torchvision.models, name)(weights=None, num_classes=num_classes)
    if name == "smallcnn":

        def block(cin: int, cout: int) -> list[nn.Module]:
            return [
                nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True),
            ]

        return nn.Sequential(
            *block(3, 32),
            *block(32, 64),
            *block(64, 128),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(128, num_classes),
        )
    raise FeedbenchError(f"unknown model {name!r}: choose from {', '.join(MODELS)}")
