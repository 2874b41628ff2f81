"""Accelerator appetites: how many samples per second one accelerator consumes, and where from.

A profile becomes an emulated step: a consumer sleeps ``batch / samples_per_s`` seconds a batch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from feedbench.core.errors import FeedbenchError


@dataclass(frozen=True)
class Profile:
    name: str
    model: str
    accelerator: str
    samples_per_s: float  # per accelerator
    batch_size: int  # per accelerator, as measured
    precision: str
    source: str  # where the figure came from

    def step_s(self, batch_size: int | None = None) -> float:
        return (batch_size or self.batch_size) / self.samples_per_s

    def as_dict(self) -> dict:
        return asdict(self)


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            name="resnet50-h200",
            model="torchvision resnet50, 224×224, SGD, channels_last",
            accelerator="NVIDIA H200",
            samples_per_s=4700.0,
            batch_size=256,
            precision="bf16 autocast",
            source=(
                "ResNet-50 training on synthetic data already on the GPU, one H200, "
                "2026-11-29; feedbench verify's synthetic ceiling there later measured "
                "4,473-4,603 img/s (BENCHMARKS.md, verify sections)"
            ),
        ),
    )
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise FeedbenchError(
            f"unknown profile {name!r}: choose one of {', '.join(sorted(PROFILES))}"
        ) from None
