"""What a scan is asked to do: :class:`ScanConfig`, checked, and the :class:`Plan` it resolves
to (batch size, emulated step, the accelerator it stands for)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from feedbench.core.choices import at_least, parse_names
from feedbench.core.errors import FeedbenchError
from feedbench.core.workloads import get_row, get_shape
from feedbench.scan.factory import check_options, is_user_spec, resolve
from feedbench.scan.profiles import get_profile

STAGES = ("read", "decode", "augment", "collate", "transfer")  # a sample's path, in order

PASSES = ("cold", "warm")


@dataclass
class ScanConfig:
    path: str | None  # None: feedbench.measure of a loader that knows its own data
    stages: tuple[str, ...] = ("read", "decode", "augment")
    batch_size: int | None = None  # None: the profile's batch, else 64
    passes: tuple[str, ...] = ("cold",)
    consumers: tuple[int, ...] = (1,)
    workers: int | None = None  # per consumer; None: cores divided fairly
    repeat: int = 1
    fmt: str = "auto"
    image_size: int = 224
    drop_caches: bool = False
    direct: bool = False
    step_s: float | None = None
    rate: float | None = None  # samples/s per accelerator
    profile: str | None = None
    async_steps: bool = False
    warmup_batches: int = 1
    read_latency_s: float = 0.0
    describe: str | None = None  # the system under test in the user's words (price, model, ...)
    read_ahead_mb: float = 0.0  # shards: MiB the kernel is asked to read ahead (0: its own)
    read_thread: bool = True  # a reading thread per local shard, `--stages read` only (open_source)
    target_au: float = 0.9
    find_max: bool = False
    max_consumers: int | None = None
    seed: int = 0
    monitor_interval_s: float = 0.25
    stall_timeout_s: float = 60.0  # no byte and no batch from any consumer this long: stalled
    # measure a training loader end to end: torch, dali, wds, or FILE.py:FUNCTION / MODULE:FUNCTION
    loader: str | None = None
    loader_options: dict[str, Any] = field(default_factory=dict)  # more keywords for the loader
    workload: str | None = None  # an MLPerf-Storage-shaped workload (feedbench.core.workloads)
    accelerator: str | None = None  # the workload's accelerator row (default h100)
    # shards: a loaders' index of them (made there when absent), for each shard's sample count
    index: str | None = None
    emulate: str = "auto"  # the step: a sleep, or kernels on the GPU (feedbench.scan.emulate)

    def as_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ScanConfig:
        names = ScanConfig.__dataclass_fields__
        return ScanConfig(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in names}
        )


@dataclass
class Plan:
    """What a config resolves to: batch size, emulated step, the accelerator it stands for."""

    batch_size: int
    step_s: float = 0.0
    accelerator: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    # a profile's step as the host's time launching it and the device's computing it (the
    # step lasts the longer); without a profile neither is known: the step is the device's
    host_s: float = 0.0
    device_s: float | None = None
    model: str = ""  # the profile's torchvision model: --emulate gpu trains it (emulate.py)
    image_size: int = 224


def parse_stages(text: str) -> tuple[str, ...]:
    """``"read,decode,augment"`` → validated stage names in pipeline order.

    A single name means that stage and all before it (``augment`` = read, decode, augment).
    """
    names = parse_names(text, "--stages")
    unknown = [n for n in names if n not in STAGES]
    if unknown:
        raise FeedbenchError(f"unknown stage {unknown[0]!r}: choose from {', '.join(STAGES)}")
    if len(names) == 1:
        return STAGES[: STAGES.index(names[0]) + 1]
    chosen = tuple(s for s in STAGES if s in names)
    expected = STAGES[: len(chosen)]
    if chosen != expected:
        raise FeedbenchError(
            f"stages are cumulative: {','.join(chosen)} skips "
            f"{', '.join(s for s in expected if s not in chosen)}"
        )
    return chosen


def parse_passes(text: str) -> tuple[str, ...]:
    return parse_names(text, "--passes", PASSES)


def apply_workload(config: ScanConfig, *, target_au_given: bool) -> ScanConfig:
    """``config`` with what its workload's row (:mod:`feedbench.core.workloads`) gives where the
    user gave nothing: the format, batch size, loader workers (DLIO's read threads) and AU
    threshold; the step time comes in :func:`plan`."""
    if config.workload is None:
        if config.accelerator is not None:
            raise FeedbenchError("--accelerator picks a workload's row: give --workload too")
        return config
    row = get_row(config.workload, config.accelerator)
    config.workload, config.accelerator = row.workload, row.accelerator
    if config.fmt == "auto":
        config.fmt = get_shape(row.workload).fmt
    if config.batch_size is None:
        config.batch_size = row.batch_size
    if config.workers is None:
        config.workers = row.read_threads
    if not target_au_given:
        config.target_au = row.target_au
    return config


def _workload_plan(config: ScanConfig, bs: int) -> Plan:
    """The workload row's step: its computation time per batch, scaled to the batch asked."""
    row = get_row(config.workload or "", config.accelerator)
    step_s = row.step_s * bs / row.batch_size
    acc = {
        "kind": "workload",
        "name": f"{row.workload} on {row.accelerator_name}",
        "workload": row.workload,
        "accelerator": row.accelerator_name,
        "samples_per_s": bs / step_s,
        "step_s": step_s,
        "batch_size": bs,
        "workload_batch_size": row.batch_size,
        "source": row.source,
    }
    return Plan(bs, step_s, acc)


def plan(config: ScanConfig) -> Plan:
    given = [x for x in (config.step_s, config.rate, config.profile) if x is not None]
    if len(given) > 1:
        raise FeedbenchError("give one of --step-time, --rate and --profile, not several")
    if config.batch_size is not None and config.batch_size < 1:
        raise FeedbenchError("--batch-size must be at least 1")
    if config.workload is not None and not given:
        bs = config.batch_size or get_row(config.workload, config.accelerator).batch_size
        return _workload_plan(config, bs)
    if config.profile is not None:
        prof = get_profile(config.profile)
        bs = config.batch_size or prof.batch_size
        # the step of the batch asked for (the profile's own batch stays in "profile_batch_size")
        step = prof.step_s(bs)
        acc = prof.as_dict() | {"step_s": step, "kind": "profile", "batch_size": bs}
        # the appetite at the batch asked: a small batch's step is the host's, not the device's
        acc |= {"samples_per_s": bs / step, "profile_samples_per_s": prof.samples_per_s}
        acc["profile_batch_size"] = prof.batch_size
        return Plan(bs, step, acc, host_s=prof.host_s, device_s=prof.device_s(bs),
                    model=prof.torch_model, image_size=prof.image_size)  # fmt: skip
    bs = config.batch_size or 64
    if config.rate is not None:
        if config.rate <= 0:
            raise FeedbenchError("--rate must be positive (samples per second per accelerator)")
        acc = {
            "kind": "rate",
            "samples_per_s": config.rate,
            "step_s": bs / config.rate,
            "batch_size": bs,
            "name": f"{config.rate:g} samples/s",
        }
        return Plan(bs, bs / config.rate, acc)
    if config.step_s is not None:
        if config.step_s <= 0:
            raise FeedbenchError("--step-time must be positive (seconds per batch)")
        acc = {
            "kind": "step",
            "samples_per_s": bs / config.step_s,
            "step_s": config.step_s,
            "batch_size": bs,
            "name": f"{config.step_s:g} s/step",
        }
        return Plan(bs, config.step_s, acc)
    return Plan(bs)


def check_library_values(backend: str, options: dict[str, Any]) -> None:
    """A value a library backend would refuse (``pace_lead_ms=-1``): one line before any rank
    starts, not exit 3 from the ranks."""
    from loaders import check_options as check_backend_options

    try:
        check_backend_options(backend, options)
    except ValueError as e:
        raise FeedbenchError(f"--loader-option for {backend}: {e}") from None


def _check_loader(backend: str, options: dict[str, Any]) -> None:
    if is_user_spec(backend):
        f = resolve(backend)
        check_options(f, options)
        return
    if options:
        from loaders import backend_options

        takes = backend_options(backend, values_only=True)
        unknown = [k for k in options if k not in takes]
        if unknown:
            raise FeedbenchError(
                f"--loader-option {unknown[0]}: the {backend} loader takes "
                f"{', '.join(takes) or 'no options (name a backend to set its options)'}"
            )
        check_library_values(backend, options)
    if backend == "dali":
        try:
            import nvidia.dali  # noqa: F401
        except ImportError:
            raise FeedbenchError(
                "--loader dali needs NVIDIA DALI: pip install 'feedbench[dali]'"
            ) from None
        from loaders.option_values import NEEDS_GPU

        on_gpu = [k for k in NEEDS_GPU if options.get(k) == "gpu"]
        if on_gpu and not _cuda():
            raise FeedbenchError(
                f"--loader-option {on_gpu[0]}=gpu: no CUDA device here for DALI to use"
            )
    if backend == "torch" and options.get("decode") == "gpu" and not _cuda():
        raise FeedbenchError("--loader-option decode=gpu: no CUDA device here for nvJPEG to use")
    if backend == "wds":
        try:
            import webdataset  # noqa: F401
        except ImportError:
            raise FeedbenchError("--loader wds needs webdataset: pip install webdataset") from None


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def check(config: ScanConfig) -> Plan:
    """The checks that need no data: one clear error per bad option; the plan they give."""
    for flag, value, low in (
        ("--repeat", config.repeat, 1),
        ("--workers", config.workers, 0),
        ("--warmup", config.warmup_batches, 0),
        ("--read-latency", config.read_latency_s, 0),
        ("--max-consumers", config.max_consumers, 1),
        ("--stall-timeout", config.stall_timeout_s, 1),
    ):
        at_least(value, low, flag)
    if not 0 <= config.read_ahead_mb <= 1024:
        raise FeedbenchError("--read-ahead takes 0 to 1024 MiB")
    if not 0 < config.target_au <= 1:
        raise FeedbenchError("--target-au must be within (0, 1]")
    p = plan(config)
    if config.loader is not None:
        _check_loader(config.loader, config.loader_options)
    elif config.loader_options:
        raise FeedbenchError("--loader-option needs --loader")
    if config.find_max and p.step_s <= 0:
        raise FeedbenchError("--find-max needs an accelerator: --profile, --rate or --step-time")
    return p
