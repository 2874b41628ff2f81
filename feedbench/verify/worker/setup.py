"""A verify rank's setup: who it is (:class:`Rank`), its cores, device and process group, its
loader, and the DDP model it trains (:class:`Training`)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from feedbench.core.choices import option_value
from feedbench.core.errors import FeedbenchError
from feedbench.verify.loaders import VerifyLoader, make_loader
from feedbench.verify.results import StepSeries
from feedbench.verify.worker.models import build_model
from feedbench.verify.worker.timing import CommTimer, CudaClock, HostClock, timed_allreduce
from loaders.affinity import cpu_list


def share_of_cpus(cpus: set[int] | list[int], index: int, parts: int) -> list[int]:
    """The ``index``-th of ``parts`` equal, contiguous shares of ``cpus`` (sorted)."""
    ordered = sorted(cpus)
    if parts < 1 or not 0 <= index < parts:
        raise ValueError(f"share {index} of {parts}")
    if len(ordered) < parts:
        raise FeedbenchError(
            f"--cpu-affinity split: {parts} ranks on this machine but only {len(ordered)} cores "
            "to split"
        )
    return ordered[index * len(ordered) // parts : (index + 1) * len(ordered) // parts]


@dataclass
class Rank:
    """Who this process is in the job (torchrun's environment) and where it trains: its device
    and the clock that marks its steps (set by :func:`open_device`)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1  # ranks on this machine
    device: Any = None  # torch.device
    clock: Any = field(default_factory=HostClock)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Rank:
        world = int(env.get("WORLD_SIZE", "1"))
        return cls(
            rank=int(env.get("RANK", "0")),
            world=world,
            local_rank=int(env.get("LOCAL_RANK", "0")),
            local_world=int(env.get("LOCAL_WORLD_SIZE", str(world))),
        )

    @property
    def cuda(self) -> bool:
        return self.device is not None and self.device.type == "cuda"


def pin_cores(args: argparse.Namespace, rank: Rank) -> str:
    """With ``--cpu-affinity split``, pin this process to its share of the cores; the cores it
    runs on, as the kernel lists them. Called before CUDA, torch's thread pools and the loader
    start: their threads inherit it."""
    if args.cpu_affinity == "split":
        share = share_of_cpus(os.sched_getaffinity(0), rank.local_rank, rank.local_world)
        os.sched_setaffinity(0, share)
    return cpu_list(os.sched_getaffinity(0))


def open_device(args: argparse.Namespace, rank: Rank) -> Rank:
    """``rank`` with its device and clock: its GPU and CUDA events (on the highest-priority
    stream with ``--stream-priority high``), or the CPU and perf_counter."""
    if args.device != "cuda":
        return replace(rank, device=torch.device("cpu"), clock=HostClock())
    if not torch.cuda.is_available():
        raise FeedbenchError("--device cuda, but CUDA is not available to this rank")
    device = torch.device("cuda", rank.local_rank)
    torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = True
    if args.stream_priority == "high":
        # every op of this rank (model, loader copies, events) on the device's highest-priority
        # stream: a GPU loader's kernels (DALI's, on its own priority-0 stream) then yield to
        # training's
        from loaders import high_priority_stream

        torch.cuda.set_stream(high_priority_stream(device))
    return replace(rank, device=device, clock=CudaClock(device))


def join_group(args: argparse.Namespace, rank: Rank) -> None:
    """Join the job's process group (NCCL on GPUs, gloo on the CPU; torchrun's rendezvous)."""
    dist.init_process_group(
        "nccl" if rank.cuda else "gloo",
        timeout=timedelta(seconds=args.timeout_s),
        **({"device_id": rank.device} if rank.cuda else {}),
    )


def barrier(rank: Rank) -> None:
    """Every rank here, with its device idle, before and after."""
    rank.clock.sync()
    if rank.cuda:
        dist.barrier(device_ids=[rank.local_rank])
    else:
        dist.barrier()
    rank.clock.sync()


def key_values(items: list[str]) -> dict[str, Any]:
    """``["KEY=VALUE", ...]`` → ``{KEY: value}`` (numbers and booleans as such)."""
    return {k: option_value(v) for k, _, v in (o.partition("=") for o in items)}


def open_loader(args: argparse.Namespace, rank: Rank, series: StepSeries) -> VerifyLoader:
    """This rank's loader (its shard, batches on its device), recorded in ``series``; a
    FeedbenchError when it holds no full batch."""
    loader = make_loader(
        args.loader, args.source, args.batch_size, rank=rank.rank, world_size=rank.world,
        local_rank=rank.local_rank, image_size=args.image_size, workers=args.workers,
        seed=args.seed, device=rank.device, num_classes=args.num_classes,
        dtype=torch.bfloat16 if rank.cuda else torch.float32, channels_last=rank.cuda,
        synthetic_batches=args.synthetic_batches, options=key_values(args.option),
    )  # fmt: skip
    series.workers = loader.workers
    series.loader_settings = loader.settings
    try:
        series.batches_per_epoch = len(loader)
    except TypeError:  # the user's iterable loader: its epochs are counted as they end
        return loader
    if series.batches_per_epoch < 1:
        raise FeedbenchError(
            f"{args.loader}: no full batch of {args.batch_size} per rank on {rank.world} ranks: "
            "the dataset is too small"
        )
    return loader


@dataclass
class Training:
    """What a step trains with."""

    ddp: DDP
    model: Any  # what a step calls: ``ddp``, or its torch.compile'd wrapper
    comm: CommTimer  # the all-reduce hook's marks
    criterion: Any
    optimizer: Any


def ddp_settings(ddp: DDP) -> str:
    """The settings DDP runs with, read back from DDP itself (defaults where not asked)."""
    return (
        f"broadcast_buffers={ddp.broadcast_buffers} "
        f"gradient_as_bucket_view={ddp.gradient_as_bucket_view} "
        f"static_graph={ddp.static_graph} bucket_cap_mb={ddp.bucket_bytes_cap / 2**20:g}"
    )


def build_training(args: argparse.Namespace, rank: Rank, series: StepSeries) -> Training:
    """The model in DDP (``--ddp-option`` settings, the timed all-reduce hook), compiled when
    asked, with its loss and optimizer; what DDP and compile run with is recorded in ``series``."""
    model = build_model(args.model, args.num_classes)
    ddp_kw = key_values(args.ddp_option)
    if rank.cuda:
        model = model.to(rank.device, memory_format=torch.channels_last)
        ddp = DDP(model, device_ids=[rank.local_rank], output_device=rank.local_rank, **ddp_kw)
    else:
        ddp = DDP(model, **ddp_kw)
    series.ddp = ddp_settings(ddp)
    comm = CommTimer(rank.clock, rank.world)
    ddp.register_comm_hook(comm, timed_allreduce)
    step_model: Any = ddp
    if args.compile != "off":  # compiled at the first warm-up step(s)
        mode = None if args.compile == "default" else args.compile
        step_model = torch.compile(ddp, mode=mode)
        series.compiled = args.compile
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    return Training(ddp, step_model, comm, torch.nn.CrossEntropyLoss(), optimizer)
