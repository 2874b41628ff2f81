"""What a verify is asked to do: :class:`VerifyConfig`, its choices and defaults, and the
:class:`Plan` it resolves to on this machine."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from feedbench.core.choices import option_value
from feedbench.core.envelope import DatasetInfo
from feedbench.core.errors import FeedbenchError

MODELS = ("resnet50", "resnet18", "smallcnn")

STREAM_PRIORITIES = ("normal", "high")  # the training stream's CUDA priority

CPU_AFFINITIES = ("inherit", "split")  # split: each rank on its own share of the cores

# torch.compile modes for the model (off: eager); reduce-overhead adds CUDA graphs
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune-no-cudagraphs")

# DistributedDataParallel settings that --ddp-option may change, with the types they take
DDP_OPTIONS: dict[str, tuple[type, ...]] = {
    "broadcast_buffers": (bool,),  # rank 0's BatchNorm buffers sent to every rank each forward
    "forward_sync_buffers": (bool,),  # its name from PyTorch 2.14 (broadcast_buffers deprecated)
    "gradient_as_bucket_view": (bool,),
    "static_graph": (bool,),
    "bucket_cap_mb": (int, float),
}

SCALINGS = ("weak", "strong")

DEVICES = ("auto", "cuda", "cpu")

# interleave: on a GPU the loader is paired with the synthetic batch in one process, since the
# host's speed drifts between runs by more than a small batch's loss (BENCHMARKS run 15); on the
# CPU the ceiling runs beside it on the same cores and no launch-bound step drifts
GPU_DEFAULTS = {"model": "resnet50", "image_size": 224, "batch_size": 256, "steps": 200,
                "warmup": 20, "interleave": 25}  # fmt: skip

CPU_DEFAULTS = {"model": "smallcnn", "image_size": 64, "batch_size": 16, "steps": 30, "warmup": 5,
                "interleave": 0}  # fmt: skip


@dataclass
class VerifyConfig:
    data: str
    gpus: tuple[int, ...] = (1, 2)
    loaders: tuple[str, ...] | None = None  # None: baseline + every library loader available
    synthetic: bool = True
    # the synthetic ceiling run again after the loaders at each count, its drift said (None:
    # on a GPU, where a small batch's launch-bound step follows the host's speed: issue 29)
    ceiling_twice: bool | None = None
    # after each loader's window, blocks of this many steps on the loader and on a synthetic
    # batch in turn, paired in one process (0: off; VerifyRun.paired; None: the device's default)
    interleave: int | None = None
    model: str | None = None  # None: resnet50 on GPU, smallcnn on CPU
    steps: int | None = None
    warmup: int | None = None
    batch_size: int | None = None  # per GPU (weak scaling) or global (strong scaling)
    scaling: str = "weak"
    image_size: int | None = None
    workers: int | None = None  # loader workers per rank (None: each loader's default)
    loader_options: tuple[str, ...] = ()  # [LOADER:]KEY=VALUE for the library loaders
    stream_priority: str = "normal"  # normal / high: the training stream's CUDA priority
    ddp_options: tuple[str, ...] = ()  # KEY=VALUE for DistributedDataParallel (DDP_OPTIONS)
    compile: str = "off"  # torch.compile mode for the model (COMPILE_MODES)
    cpu_affinity: str = "inherit"  # inherit / split: each rank pinned to its own share of the cores
    sync_each_step: bool = False  # diagnostic: the host waits for the GPU after taking each batch
    device: str = "auto"
    seed: int = 0
    num_classes: int = 1000
    target_au: float = 0.9
    run_timeout_s: float = 1800.0
    monitor_interval_s: float = 0.25
    keep_going: bool = False  # after a failed run, go on with the next ones

    def as_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass
class Plan:
    """A config resolved against this machine and the data."""

    device: str  # cuda / cpu
    backend: str  # nccl / gloo
    unit: str  # GPU / CPU process
    model: str
    image_size: int
    batch_size: int
    steps: int
    warmup: int
    loaders: list[str]  # run order at each count: synthetic first
    sources: dict[str, str]  # loader → the path it reads
    samples: dict[str, int]  # source path → samples
    dataset: DatasetInfo | None
    warnings: list[str] = field(default_factory=list)
    options: dict[str, dict] = field(default_factory=dict)  # loader → build_loader options
    ddp_options: dict[str, Any] = field(default_factory=dict)  # DistributedDataParallel's
    interleave: int = 0  # steps a paired block (VerifyConfig.interleave, resolved)

    def per_gpu_batch(self, scaling: str, gpus: int) -> int:
        return self.batch_size if scaling == "weak" else self.batch_size // gpus


def _ddp_takes(key: str) -> bool:
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    return key in inspect.signature(DistributedDataParallel.__init__).parameters


def parse_ddp_options(items: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``--ddp-option KEY=VALUE`` values → DistributedDataParallel keyword arguments, checked."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise FeedbenchError(f"--ddp-option takes KEY=VALUE, not {item!r}")
        if key not in DDP_OPTIONS:
            raise FeedbenchError(
                f"--ddp-option {key!r}: verify sets {', '.join(DDP_OPTIONS)} of DDP"
            )
        if not _ddp_takes(key):
            raise FeedbenchError(
                f"--ddp-option {key}: this PyTorch's DistributedDataParallel has no such setting "
                "(forward_sync_buffers is PyTorch 2.14's name for broadcast_buffers)"
            )
        value = option_value(text)
        kinds = DDP_OPTIONS[key]
        if type(value) not in kinds:
            want = " or ".join("true/false" if k is bool else k.__name__ for k in kinds)
            raise FeedbenchError(f"--ddp-option {key} takes {want}, not {text!r}")
        out[key] = value
    return out
