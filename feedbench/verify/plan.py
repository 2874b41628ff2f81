"""A verify's config checked against this machine and the data: the :class:`Plan` of its runs."""

from __future__ import annotations

import glob
import os

from feedbench.core.envelope import DatasetInfo, envelope
from feedbench.core.errors import FeedbenchError
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
    LOADERS,
    SYNTHETIC,
    batches_per_epoch,
    loader_options,
    unavailable,
)
from feedbench.verify.results import KIND, VerifyResult, units


def cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


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
        n = len(open_index(layout))
    except LoaderError as e:
        raise FeedbenchError(str(e)) from None
    info = DatasetInfo(
        path=os.path.abspath(path),
        format=layout.kind,
        files=len(layout.files),
        bytes=layout.total_bytes,
        samples=n,
    )
    return info, n


def sources_for(data: str) -> dict[str, str]:
    """The path each loader reads. A feedbench sample root (``images/`` and ``shards/``): the
    tree for baseline, torch and dali, the shards for wds; any other path: the path itself."""
    from loaders.data.layout import SAMPLE_SHARDS, SAMPLE_TREE

    tree, shards = os.path.join(data, SAMPLE_TREE), os.path.join(data, SAMPLE_SHARDS)
    if os.path.isdir(tree) and os.path.isdir(shards):
        return {BASELINE: tree, DALI_EXAMPLE: tree, "torch": tree, "dali": tree, "wds": shards}
    return {name: data for name in (BASELINE, DALI_EXAMPLE, *LIBRARY)}


def plan(config: VerifyConfig) -> Plan:
    """Check every option against this machine and the data; raise FeedbenchError on bad input."""
    if config.device not in DEVICES:
        raise FeedbenchError(f"--device takes {', '.join(DEVICES)} (got {config.device!r})")
    if config.scaling not in SCALINGS:
        raise FeedbenchError(f"--scaling takes weak or strong (got {config.scaling!r})")
    if not config.gpus or min(config.gpus) < 1:
        raise FeedbenchError("--gpus takes counts ≥ 1")
    present = cuda_count()
    device = config.device if config.device != "auto" else ("cuda" if present else "cpu")
    if device == "cuda":
        check_gpus(config.gpus, present)
    defaults = GPU_DEFAULTS if device == "cuda" else CPU_DEFAULTS
    model = config.model or defaults["model"]
    if model not in MODELS:
        raise FeedbenchError(f"unknown model {model!r}: choose from {', '.join(MODELS)}")
    image_size = config.image_size or defaults["image_size"]
    batch = config.batch_size or defaults["batch_size"]
    steps = config.steps if config.steps is not None else defaults["steps"]
    warmup = config.warmup if config.warmup is not None else defaults["warmup"]
    if image_size < 16:
        raise FeedbenchError("--image-size must be at least 16 pixels")
    if batch < 1:
        raise FeedbenchError("--batch-size must be at least 1")
    if steps < 1:
        raise FeedbenchError("--steps must be at least 1")
    if warmup < 0:
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
    if config.stream_priority != "normal" and device != "cuda":
        raise FeedbenchError("--stream-priority is a CUDA stream setting: it needs --device cuda")
    if config.sync_each_step and device != "cuda":
        raise FeedbenchError("--sync-each-step waits for the GPU: it needs --device cuda")
    ddp_options = parse_ddp_options(config.ddp_options)
    if config.compile not in COMPILE_MODES:
        raise FeedbenchError(f"--compile takes {', '.join(COMPILE_MODES)} (got {config.compile!r})")
    if config.cpu_affinity not in CPU_AFFINITIES:
        raise FeedbenchError(
            f"--cpu-affinity takes {' or '.join(CPU_AFFINITIES)} (got {config.cpu_affinity!r})"
        )
    if config.scaling == "strong":
        bad = [g for g in config.gpus if batch % g]
        if bad:
            raise FeedbenchError(
                f"strong scaling splits the global batch {batch} over the GPUs: it does not "
                f"divide by {bad[0]}"
            )
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
    # loaders: explicit names must exist and be usable; the default takes what is available
    if config.loaders is None:
        names = [BASELINE]
        for name in (DALI_EXAMPLE, *LIBRARY):
            if name in GPU_ONLY and device != "cuda":
                continue
            why = unavailable(name)
            if why:
                warnings.append(f"loader {name} left out: {why}")
            else:
                names.append(name)
    else:
        names = list(config.loaders)
        for name in names:
            if name not in LOADERS:
                raise FeedbenchError(f"unknown loader {name!r}: choose from {', '.join(LOADERS)}")
            why = unavailable(name)
            if why:
                raise FeedbenchError(f"loader {name} is unavailable: {why}")
            if name in GPU_ONLY and device != "cuda":
                raise FeedbenchError(f"loader {name} decodes on the GPU: it needs --device cuda")
    real = [n for n in names if n != SYNTHETIC]
    options = loader_options(config.loader_options, real)
    order = ([SYNTHETIC] if config.synthetic or SYNTHETIC in names else []) + real
    # the data: it must exist, and hold a full batch per rank at the largest count
    sources = sources_for(config.data)
    samples: dict[str, int] = {}
    infos: dict[str, DatasetInfo] = {}
    dataset = None
    if not (os.path.exists(config.data) or "{" in config.data or glob.has_magic(config.data)):
        raise FeedbenchError(f"no such file or directory: {config.data}")
    for name in real:
        path = sources[name]
        if path not in samples:
            infos[path], samples[path] = count_samples(path)
        if dataset is None or name == BASELINE:
            dataset = infos[path]
        if name in (BASELINE, DALI_EXAMPLE) and infos[path].format != "tree":
            raise FeedbenchError(
                f"the {name} loader reads an image tree (ImageFolder); {path} holds tar shards"
            )
    if dataset is None:  # synthetic only: describe the data anyway
        dataset, n = count_samples(config.data)
        samples[config.data] = n
    for name in real:
        n = samples[sources[name]]
        for g in config.gpus:
            per = batch if config.scaling == "weak" else batch // g
            if batches_per_epoch(n, g, per) < 1:
                raise FeedbenchError(
                    f"{sources[name]} has {n} images: too few for a batch of {per} on each of "
                    f"{units(g, 'GPU' if device == 'cuda' else 'CPU process')} "
                    f"(needs at least {per * g}); use a smaller --batch-size or more data"
                )
    for name in real:
        n = samples[sources[name]]
        g = max(config.gpus)
        per = batch if config.scaling == "weak" else batch // g
        if batches_per_epoch(n, g, per) < 5:
            warnings.append(
                f"{name}: only {batches_per_epoch(n, g, per)} batches per epoch at {g} ranks: "
                "epoch starts weigh on the steps; use more data for steadier figures"
            )
            break
    return Plan(
        device=device,
        backend="nccl" if device == "cuda" else "gloo",
        unit="GPU" if device == "cuda" else "CPU process",
        model=model,
        image_size=image_size,
        batch_size=batch,
        steps=steps,
        warmup=warmup,
        loaders=order,
        sources=sources,
        samples=samples,
        dataset=dataset,
        warnings=warnings,
        options=options,
        ddp_options=ddp_options,
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
        "loaders": p.loaders,
        "options_per_loader": p.options,
        "ddp_options": p.ddp_options,
        "sources": {k: v for k, v in p.sources.items() if k in p.loaders},
        "precision": "bf16 autocast, channels_last" if p.device == "cuda" else "fp32",
        "optimizer": "SGD lr 0.01 momentum 0.9 wd 1e-4",
        "data_bound_above": round(1 - config.target_au, 6),
    }
    return VerifyResult(
        **envelope(KIND, cfg),
        dataset=p.dataset,
        warnings=list(p.warnings),
    )
