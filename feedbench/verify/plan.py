"""A verify's config checked against this machine and the data: the :class:`Plan` of its runs."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Any

from feedbench.core.envelope import DatasetInfo, cuda_devices, envelope
from feedbench.core.errors import FeedbenchError
from feedbench.core.listing import skipped_files, skipped_warning
from feedbench.scan.factory import resolve as resolve_factory
from feedbench.verify.config import (
    COMPILE_MODES,
    CPU_AFFINITIES,
    CPU_DEFAULTS,
    DEVICES,
    GPU_DEFAULTS,
    MODELS,
    SCALINGS,
    STREAM_PRIORITIES,
    Plan,
    VerifyConfig,
    parse_ddp_options,
)
from feedbench.verify.loaders import (
    BASELINE,
    DALI_EXAMPLE,
    GPU_ONLY,
    LIBRARY,
    SYNTHETIC,
    batches_per_epoch,
    is_user,
    loader_options,
    unavailable,
)
from feedbench.verify.results import KIND, VerifyResult, units


def check_gpus(asked: tuple[int, ...], present: int) -> None:
    """More GPUs asked than this machine has: one clear error."""
    if present == 0:
        raise FeedbenchError(
            "--device cuda: no CUDA GPU is visible here (use --device cpu, or leave --device "
            "auto to train on the CPU)"
        )
    if max(asked) > present:
        raise FeedbenchError(
            f"--gpus asks for {max(asked)} GPUs; this machine has {present} "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
        )


def count_samples(path: str) -> tuple[DatasetInfo, int]:
    """What is at ``path`` and how many usable samples it holds, as the loaders index it."""
    from loaders.data import locate, open_index
    from loaders.errors import LoaderError

    try:
        layout = locate(path)
        index = open_index(layout)
    except LoaderError as e:
        raise FeedbenchError(str(e)) from None
    info = DatasetInfo(
        path=os.path.abspath(path),
        format=layout.kind,
        files=len(layout.files),
        bytes=layout.total_bytes,
        samples=len(index),
    )
    # the index's list, not the layout's: it adds what reading the shards' headers left out
    info.skipped_files, info.skipped = skipped_files(index.skipped)
    return info, len(index)


def describe(path: str) -> tuple[DatasetInfo, int | None]:
    """What a user's loader reads: as :func:`count_samples` where the path holds images or tar
    shards, else its files (samples unknown)."""
    from loaders.data.layout import locate_files
    from loaders.errors import LoaderError

    try:
        return count_samples(path)
    except FeedbenchError:
        pass
    try:
        layout = locate_files(path)
    except LoaderError as e:
        raise FeedbenchError(str(e)) from None
    info = DatasetInfo(os.path.abspath(path), "files", len(layout.files), layout.total_bytes, None)
    return info, None


def sources_for(data: str) -> dict[str, str]:
    """The path each loader reads. A feedbench sample root (``images/`` and ``shards/``): the
    tree for baseline, torch and dali, the shards for wds; any other path: the path itself."""
    from loaders.data.layout import SAMPLE_SHARDS, SAMPLE_TREE

    tree, shards = os.path.join(data, SAMPLE_TREE), os.path.join(data, SAMPLE_SHARDS)
    if os.path.isdir(tree) and os.path.isdir(shards):
        return {BASELINE: tree, DALI_EXAMPLE: tree, "torch": tree, "dali": tree, "wds": shards,
                "auto": tree}  # fmt: skip
    return {name: data for name in (BASELINE, DALI_EXAMPLE, *LIBRARY)}


@dataclass
class Settings:
    """The device a verify trains on, and its model and sizes (defaults for that device filled
    in)."""

    device: str  # cuda / cpu
    model: str
    image_size: int
    batch: int
    steps: int
    warmup: int
    interleave: int


def resolve(config: VerifyConfig) -> Settings:
    """The device (``auto``: CUDA when a GPU is visible) and the defaults for it; checks the
    device, scaling, GPU counts and model."""
    if config.device not in DEVICES:
        raise FeedbenchError(f"--device takes {', '.join(DEVICES)} (got {config.device!r})")
    if config.scaling not in SCALINGS:
        raise FeedbenchError(f"--scaling takes weak or strong (got {config.scaling!r})")
    if not config.gpus or min(config.gpus) < 1:
        raise FeedbenchError("--gpus takes counts ≥ 1")
    present = len(cuda_devices()) if config.device != "cpu" else 0  # CPU runs: no CUDA to start
    device = config.device if config.device != "auto" else ("cuda" if present else "cpu")
    if device == "cuda":
        check_gpus(config.gpus, present)
    defaults = GPU_DEFAULTS if device == "cuda" else CPU_DEFAULTS
    model = config.model or defaults["model"]
    if model not in MODELS:
        raise FeedbenchError(f"unknown model {model!r}: choose from {', '.join(MODELS)}")
    return Settings(
        device=device,
        model=model,
        # 0 is a value given (refused in check_options), not "unset"
        image_size=config.image_size if config.image_size is not None else defaults["image_size"],
        batch=config.batch_size if config.batch_size is not None else defaults["batch_size"],
        steps=config.steps if config.steps is not None else defaults["steps"],
        warmup=config.warmup if config.warmup is not None else defaults["warmup"],
        interleave=config.interleave if config.interleave is not None else defaults["interleave"],
    )


def check_options(config: VerifyConfig, s: Settings) -> dict[str, Any]:
    """Sizes, target and the training options, against each other and the device; the DDP
    options, parsed."""
    if s.image_size < 16:
        raise FeedbenchError("--image-size must be at least 16 pixels")
    if s.batch < 1:
        raise FeedbenchError("--batch-size must be at least 1")
    if s.steps < 1:
        raise FeedbenchError("--steps must be at least 1")
    if s.warmup < 0:
        raise FeedbenchError("--warmup must be 0 or more")
    if config.workers is not None and config.workers < 0:
        raise FeedbenchError("--workers must be 0 or more")
    if not 0 < config.target_au <= 1:
        raise FeedbenchError("--target-au must be within (0, 1]")
    if config.stream_priority not in STREAM_PRIORITIES:
        raise FeedbenchError(
            f"--stream-priority takes {' or '.join(STREAM_PRIORITIES)} "
            f"(got {config.stream_priority!r})"
        )
    if config.stream_priority != "normal" and s.device != "cuda":
        raise FeedbenchError("--stream-priority is a CUDA stream setting: it needs --device cuda")
    if s.interleave < 0:
        raise FeedbenchError(f"--interleave takes steps per block, 0 for none, not {s.interleave}")
    if config.sync_each_step and s.device != "cuda":
        raise FeedbenchError("--sync-each-step waits for the GPU: it needs --device cuda")
    ddp_options = parse_ddp_options(config.ddp_options)
    if config.compile not in COMPILE_MODES:
        raise FeedbenchError(f"--compile takes {', '.join(COMPILE_MODES)} (got {config.compile!r})")
    if config.cpu_affinity not in CPU_AFFINITIES:
        raise FeedbenchError(
            f"--cpu-affinity takes {' or '.join(CPU_AFFINITIES)} (got {config.cpu_affinity!r})"
        )
    if config.scaling == "strong":
        bad = [g for g in config.gpus if s.batch % g]
        if bad:
            raise FeedbenchError(
                f"strong scaling splits the global batch {s.batch} over the GPUs: it does not "
                f"divide by {bad[0]}"
            )
    return ddp_options


def machine_warnings(config: VerifyConfig, device: str) -> list[str]:
    """What the figures of a CPU verify do not say."""
    warnings: list[str] = []
    cores = os.cpu_count() or 1
    if device == "cpu":
        warnings.append(
            "no GPU: each rank trains on one CPU core (gloo) while its loader shares the same "
            "cores, so these figures test the whole path; they do not predict GPU training"
        )
    if device == "cpu" and max(config.gpus) > cores:
        warnings.append(
            f"{max(config.gpus)} CPU processes on {cores} cores: they share cores, so the "
            "scaling says little"
        )
    return warnings


def choose_loaders(config: VerifyConfig, device: str, warnings: list[str]) -> list[str]:
    """Explicit names must exist and be usable here (a user's factory must resolve); the default
    takes what is available (and says in ``warnings`` what it left out)."""
    if config.loaders is None:
        names = [BASELINE]
        for name in (DALI_EXAMPLE, *(n for n in LIBRARY if n != "auto")):
            if name in GPU_ONLY and device != "cuda":
                continue
            why = unavailable(name)
            if why:
                warnings.append(f"loader {name} left out: {why}")
            else:
                names.append(name)
        return names
    names = list(config.loaders)
    for name in names:
        if is_user(name):
            resolve_factory(name)  # its file or module imports, its function is there
            continue
        why = unavailable(name)
        if why:
            raise FeedbenchError(f"loader {name} is unavailable: {why}")
        if name in GPU_ONLY and device != "cuda":
            raise FeedbenchError(f"loader {name} decodes on the GPU: it needs --device cuda")
    return names


def count_sources(
    data: str, sources: dict[str, str], real: list[str], warnings: list[str]
) -> tuple[dict[str, int], DatasetInfo]:
    """Samples in each source the loaders read, and the dataset to describe (the baseline's, or
    the first loader's; the data itself when only synthetic runs). What listing left out is
    told in ``warnings`` for every source, not only the one described: on a sample root the
    wds loader reads shards the results do not describe."""
    if not (os.path.exists(data) or "{" in data or glob.has_magic(data)):
        raise FeedbenchError(f"no such file or directory: {data}")
    samples: dict[str, int] = {}
    infos: dict[str, DatasetInfo] = {}
    dataset = None
    for name in real:
        path = sources[name]
        if path not in infos or (path not in samples and not is_user(name)):
            # a factory reads its own way: its data counted where our loaders could read it
            infos[path], n = describe(path) if is_user(name) else count_samples(path)
            if n is not None:
                samples[path] = n
        if dataset is None or name == BASELINE:
            dataset = infos[path]
        if name in (BASELINE, DALI_EXAMPLE) and infos[path].format != "tree":
            raise FeedbenchError(
                f"the {name} loader reads an image tree (ImageFolder); {path} holds tar shards"
            )
    if dataset is None:  # synthetic only: describe the data anyway
        dataset, n = count_samples(data)
        samples[data] = n
        infos[data] = dataset
    for info in infos.values():
        warnings += skipped_warning(info)
    return samples, dataset


def check_batches(
    config: VerifyConfig, s: Settings, counts: dict[str, tuple[str, int]], warnings: list[str]
) -> None:
    """Each loader's data holds a full batch per rank at every count (else FeedbenchError), and
    enough batches per epoch at the largest (else a warning). ``counts``: loader → (the path it
    reads, its samples)."""
    unit = "GPU" if s.device == "cuda" else "CPU process"
    for path, n in counts.values():
        for g in config.gpus:
            per = s.batch if config.scaling == "weak" else s.batch // g
            if batches_per_epoch(n, g, per) < 1:
                raise FeedbenchError(
                    f"{path} has {n} images: too few for a batch of {per} on each of "
                    f"{units(g, unit)} (needs at least {per * g}); use a smaller --batch-size or "
                    "more data"
                )
    g = max(config.gpus)
    per = s.batch if config.scaling == "weak" else s.batch // g
    for name, (_, n) in counts.items():
        if batches_per_epoch(n, g, per) < 5:
            warnings.append(
                f"{name}: only {batches_per_epoch(n, g, per)} batches per epoch at {g} ranks: "
                "epoch starts weigh on the steps; use more data for steadier figures"
            )
            break


def check_gpu_options(options: dict[str, dict], device: str) -> None:
    """DALI (or torch) asked to decode or resize on the GPU of a run that trains on the CPU: one
    line now, rather than the run failing once started."""
    from loaders.option_values import NEEDS_GPU

    if device == "cuda":
        return
    for backend in ("dali", "torch"):
        for key in NEEDS_GPU:
            if options.get(backend, {}).get(key) == "gpu":
                raise FeedbenchError(f"--loader-option {backend}:{key}=gpu needs --device cuda")


def plan(config: VerifyConfig) -> Plan:
    """Check every option against this machine and the data; raise FeedbenchError on bad input."""
    s = resolve(config)
    ddp_options = check_options(config, s)
    warnings = machine_warnings(config, s.device)
    names = choose_loaders(config, s.device, warnings)
    real = [n for n in names if n != SYNTHETIC]
    options = loader_options(config.loader_options, real)
    check_gpu_options(options, s.device)
    order = ([SYNTHETIC] if config.synthetic or SYNTHETIC in names else []) + real
    # the data: it must exist, and hold a full batch per rank at the largest count
    sources = sources_for(config.data) | {n: config.data for n in real if is_user(n)}
    samples, dataset = count_sources(config.data, sources, real, warnings)
    # a factory batches its own way (a partial last batch, its own sampler): not checked here
    counts = {n: (sources[n], samples[sources[n]]) for n in real if not is_user(n)}
    check_batches(config, s, counts, warnings)
    return Plan(
        device=s.device,
        backend="nccl" if s.device == "cuda" else "gloo",
        unit="GPU" if s.device == "cuda" else "CPU process",
        model=s.model,
        image_size=s.image_size,
        batch_size=s.batch,
        steps=s.steps,
        warmup=s.warmup,
        loaders=order,
        sources=sources,
        samples=samples,
        dataset=dataset,
        warnings=warnings,
        options=options,
        ddp_options=ddp_options,
        interleave=s.interleave,
    )


def new_result(config: VerifyConfig, p: Plan) -> VerifyResult:
    cfg = config.as_dict() | {
        "device": p.device,
        "backend": p.backend,
        "unit": p.unit,
        "model": p.model,
        "image_size": p.image_size,
        "batch_size": p.batch_size,
        "steps": p.steps,
        "warmup": p.warmup,
        "interleave": p.interleave,
        "loaders": p.loaders,
        "options_per_loader": p.options,
        "ddp_options": p.ddp_options,
        "sources": {k: v for k, v in p.sources.items() if k in p.loaders},
        "loader_code": {n: resolve_factory(n).describe() for n in p.loaders if is_user(n)},
        "precision": "bf16 autocast, channels_last" if p.device == "cuda" else "fp32",
        "optimizer": "SGD lr 0.01 momentum 0.9 wd 1e-4",
        "data_bound_above": round(1 - config.target_au, 6),
    }
    return VerifyResult(
        **envelope(KIND, cfg, config.data),
        dataset=p.dataset,
        warnings=list(p.warnings),
    )
