"""Accelerator appetites: how many samples per second one accelerator consumes, and where from.

A profile becomes an emulated step of ``max(batch / samples_per_s, host_s)`` seconds a batch: the
device's time grows with the batch, the host's (the training thread launching the step's
kernels) does not, and at small batches it is the longer one (issue 29: ResNet-50 on an H200
at 64 per GPU runs at ~2,100 img/s, not 64 / 4,700 s a step).
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
    host_s: float = 0.0  # the training thread's time per step, whatever the batch (measured)
    # a torchvision model whose own training step --emulate gpu runs (else timed matmuls)
    torch_model: str = ""
    image_size: int = 224

    def device_s(self, batch_size: int | None = None) -> float:
        return (batch_size or self.batch_size) / self.samples_per_s

    def step_s(self, batch_size: int | None = None) -> float:
        return max(self.device_s(batch_size), self.host_s)

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
                "4,473-4,603 img/s (BENCHMARKS.md, verify sections); host_s: verify's "
                "synthetic ceiling at 64 per GPU there, 1,960-2,176 img/s in four runs "
                "(mean 2,080: 30.8 ms a step; BENCHMARKS.md, small batches)"
            ),
            host_s=64 / 2080.0,
            torch_model="resnet50",
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
