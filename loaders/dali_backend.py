"""The DALI backend: GPU (nvJPEG + hardware decoder) or CPU pipelines for image trees and shards.

ORDER, training on a tree: torch's. Batch ``b`` of epoch ``e`` on rank ``r`` is the torch backend's:
indices ``[b·B, (b+1)·B)`` of :func:`loaders.dist.shard_indices` (DistributedSampler for ``seed``
and ``e`` on the GLOBAL rank ``r``, padded to ``ceil(N/W)`` by repeating the start of the
permutation; ``drop_last`` drops the short last batch). The files go in through an external source
(:class:`DealtFiles`, batch by batch, with their labels, and their indices as the keys when asked
for) and DALI's CPU threads read them (``fn.io.file.read``); no DALI shuffle. The source never ends:
after an epoch's last batch come the next epoch's first, so DALI prefetches across the boundary, and
``set_epoch(k)`` on a new loader (``--start-epoch k``) gives exactly epoch k's order. (A rebuilt
pipeline per epoch with ``files=`` was the other way; it would restart DALI, and its prefetch, at
every epoch.)

ORDER, training on shards: a pipeline per epoch. Its webdataset reader gets the shards (and their
index files) in epoch ``e``'s order, the wds backend's :func:`loaders.wds_backend.shard_order`
for ``seed`` and ``e`` (the same on every rank), DALI splits that sequence's samples by the global
rank (below), and the reader's shuffle buffer and the augmentations are seeded by
``(seed, e, rank)``. So epoch ``e`` is a function of ``(seed, e, rank, world)`` (and
``shuffle_buffer``): ``set_epoch(k)`` on a new loader gives the batches, pixels included, of an
uninterrupted run's epoch k. The cost: each epoch's first batches are not prefetched during the
epoch before (BENCHMARKS.md, "DALI's shard order per epoch (issue 26)"). The pipeline is dropped
when its epoch ends (its reader is not reset, which would start reading an epoch nobody asks for).

Readers otherwise: ``fn.readers.file`` (evaluation on a tree; the file list is handed over once as
``files``, with the sample index as the "label" so every batch also carries its keys) or
``fn.readers.webdataset`` (shards; index files are written once from our own listing, so DALI
does not re-scan the tars). Both with ``shard_id`` = the GLOBAL rank, ``num_shards`` = world size,
``pad_last_batch=True``. Training on shards: ``random_shuffle`` with a buffer of
``shuffle_buffer`` samples, over the epoch's shard order (ORDER above).

Your own augmentations: ``dali_augment=fn`` is called inside the pipeline definition with the
decoded uint8 HWC images at the output size and returns DataNodes (:meth:`DaliLoader._augment`).

Decode: ``fn.decoders.image_random_crop`` (train: RandomResizedCrop, area and ratio from the
transform options, :class:`loaders.transforms.TransformSpec`)
or ``fn.decoders.image`` (eval), ``device="mixed"`` on a GPU (nvJPEG, and the hardware JPEG
decoder for ``hw_decoder_load`` of the images, 0.99 by default), ``fn.resize`` to the output
size (antialiased linear) and ``fn.crop_mirror_normalize`` (random flip, mean/std, CHW,
or HWC when ``channels_last``). Files are read with plain reads for trees and mapped for shards
(``dont_use_mmap``; the faster of the two for each, BENCHMARKS.md "Loaders"). Without a GPU
(or with ``device="cpu"``) the same graph runs on the CPU (``device_id=None``), which is how the
tests run it. ``decode="cpu"`` on a GPU decodes, crops and resizes on the CPU and normalises on
the GPU (DECODE ON THE CPU below); ``decode="auto"``, the default, decodes on the CPU for
batches of at most 64 (SMALL BATCHES) and, with at least 12 threads and no ``dali_augment``, for
larger ones too, then resizing on the GPU (LARGER BATCHES ON ENOUGH THREADS); else on the GPU.

**Equal lengths.** Dealt (training on a tree): every rank gets ``ceil(N/W)`` samples, as torch.
Readers: DALI splits ``N`` samples into ``W`` contiguous shards of ``floor`` or ``ceil``
of ``N / W`` samples. The iterator uses ``reader_name`` with ``LastBatchPolicy.FILL`` on a padded
reader, so every rank gets ``ceil(ceil(N/W) / B)`` full batches, each shard padded by repeating
its last sample. (``PARTIAL`` is not used: when the shard sizes differ, it hands the smaller shard
an EMPTY last batch.) This loader then trims the last batch so that every rank yields exactly
``ceil(N/W)`` samples: its own shard, plus one repeat of its last sample where its shard is the
shorter one. That is ``W·ceil(N/W) − N`` repeats per epoch, the same count as DistributedSampler.

Evaluation (``train=False``): no shuffle, the tree's files in index order, and every rank always
reads its own shard (``stick_to_shard``): DALI's contiguous split is
:func:`loaders.dist.eval_indices`, and the trimming above stops at the rank's own sample count, so
every sample is yielded exactly once and nothing is repeated (``even_batches=True``: the trimming
stops at ``ceil(N/W)`` instead, the shorter shards' last sample repeated once and marked).
DALI needs at least one sample per rank: fewer is a :class:`LoaderError` on every rank.

RESUMPTION: the pipeline is built with DALI's checkpointing, and :meth:`state_dict` carries the
checkpoint DALI's iterator gives for the batches it has returned; a loader given that state rebuilds
the pipeline from it, so the rest of the epoch (the batches not yet received, with the same
augmentations) and the epochs after it are those of the uninterrupted run. (Dealt: the checkpoint
restores the source's iteration, counted from the ``plan`` saved with it, and the random
operators' state; the reader's position on shards.) The checkpoint is this rank's: each rank saves
and loads its own, and the world size cannot change midway through an epoch.

On a GPU the host waits for the caller's stream before handing over each batch (``pace``, see
PACING below).

Batches live in DALI's output buffers, which it reuses: use (or copy) a batch before asking for the
next one, as a training step does.

Epochs follow DALI's own counter. ``set_epoch(e)`` to anything other than the next epoch rebuilds
the pipeline seeded by ``(seed, e)``. Dealt (training on a tree): the order is then epoch e's, the
uninterrupted run's, but the random crops and flips are the new pipeline's (for those too, resume
from the state). Shards (training): every epoch has a new pipeline, so the order and the
augmentations are the uninterrupted run's; a state saved at an epoch's start or end carries no
checkpoint, only one saved midway does. An epoch left before its end (a peek, a ``break``) is
started over by the next ``iter()`` (:class:`loaders.base.LoaderBase`) from the checkpoint taken
at its start (shards: a new build for the epoch): the same order as if it had not been left.

Bad input: stops with one line naming the file (:class:`LoaderError`). DALI cannot skip an image
it fails to decode; when it fails, this loader finds the culprit by checking the source's files on
the CPU (in parallel) and names it (:mod:`loaders.dali_errors`). Listing-time problems (non-image
files in a tree, samples with no label, truncated shards) are skipped and counted as for every
backend.
"""

from __future__ import annotations

import re
import sys
import tempfile

import numpy as np
import torch

from loaders.affinity import RESERVE_CORES, loader_cores, started_on
from loaders.base import LoaderBase
from loaders.dali_errors import diagnose, find_undecodable
from loaders.dali_feed import parse_labels, write_dali_indexes
from loaders.dali_graph import READER, DaliGraph
from loaders.data import SampleIndex, remote
from loaders.dropin import SourceView
from loaders.errors import LoaderError, require_dali
from loaders.option_values import NEEDS_GPU, check_values
from loaders.pacing import LEAD_MS, Pacer
from loaders.resume import ResumePoint

# The dealt source's outputs (jpegs, labels[, keys]), saved with a checkpoint: a checkpoint
# restores only into a pipeline with the same outputs. 2: labels are an output (was: indexed
# on the training thread); older states have none.
DEALT_OUTPUTS = 2
# Share of the JPEGs for the hardware JPEG decoder (A100/H100/H200), above DALI's default 0.65:
# the hardware engine leaves the SMs to training (BENCHMARKS.md, "Loaders" and "verify").
HW_DECODER_LOAD = 0.99
# DECODE ON THE CPU (``decode="cpu"`` on a GPU): decode, random crop and resize on DALI's CPU
# threads; DALI copies the uint8 batch to the GPU and only normalises there, so training keeps
# the SMs and the CPU does the rest: for hosts whose GPUs are the scarce part. By default for
# small batches, and for larger ones with enough threads (below; BENCHMARKS.md, "Where the DALI
# loader's last 7% goes").
# SMALL BATCHES (``decode="auto"``): at most this many images per batch are decoded on the CPU.
# There a step is short and bound by the host thread that launches its kernels (ResNet-50 at 64 on
# an H200: ~30 ms, the GPU ~58% busy even on synthetic data), and DALI's GPU decode, whose
# threads drive nvJPEG and the hardware decoder through the same CUDA context, slowed the step
# to 0.60 of the synthetic ceiling (16 threads; 0.83 with 2, 0.84 with 4), against 1.0 decoding
# on the CPU. BENCHMARKS.md, "Small batches on one H200 (issue 29)"; measured at 64 and 256
# only, so the threshold between them is a choice.
SMALL_BATCH = 64
# LARGER BATCHES ON ENOUGH THREADS (``decode="auto"``, over SMALL_BATCH a batch, at least
# CPU_DECODE_THREADS threads): the CPU decodes and cuts the crop, the GPU resizes (RESIZE ON THE
# GPU). At 256 per GPU on an H100 with 16 cores it fed the step completely in 5 runs of 5
# (1.000 of the ceiling, 7.1-7.5 cores busy, ~525 img/s a busy core), where the GPU decode,
# whose kernels share the SMs with training, gave 0.94-0.98 in 9 runs, and 0.96 and 0.98
# interleaved with it on one host (BENCHMARKS.md, runs 17, 21 and 22). An H200 asks ~4,500
# img/s there: ~9 busy cores; 12 threads leave a third over that. With fewer threads a rank
# decodes on the GPU, whose hardware decoder needs none of them. A faster GPU asks more of the
# CPU: sized for H100 and H200, not measured on others.
CPU_DECODE_THREADS = 12
# RESIZE ON THE GPU (``resize="gpu"``, with the decode on the CPU): the CPU decodes and cuts the
# random crop; the crop (uint8, of its own size) goes to the GPU and is resized there. DALI's
# antialiased CPU resize is about half of its CPU pipeline's time (decode + crop alone ran
# 1.8-1.9x as many images a second on 2 threads, 2.1-2.3x on 1: BENCHMARKS.md, "DALI's CPU
# resize"): each batch's CPU time, so its latency, halves. "auto" (the default) resizes on the
# GPU for LARGER BATCHES ON ENOUGH THREADS, else where it decodes: at 64 per GPU the CPU resize
# gave 0.99 and the GPU resize 0.94 and 0.93 on one host, none of them resolved (run 22).
# PACING (GPU, ``pace=1``, the default): before a batch is handed over, the host waits for the
# caller's current stream, i.e. for the previous training step and this batch's copy out of DALI's
# buffer (``pace=k``: for what was queued k - 1 handovers earlier; ``pace=0``: never waits;
# ``pace_lead_ms=L``: until L ms before the previous step is due to end: loaders.pacing).
# A training loop without a synchronising call otherwise runs ahead of the GPU, keeping it full
# of training kernels queued at (or above) the priority of DALI's; DALI's kernels for the next
# batches then wait behind them, and training waits for data. What the wait costs depends on the
# step (DDP's per-step buffer broadcast); BENCHMARKS.md, "Pacing the DALI loader" and "The DALI
# loader at 0.97".


def _pipe_seed(seed: int, rank: int, epoch: int) -> int:
    return (seed * 1_000_003 + rank * 7919 + epoch * 104_729 + 1) % (2**31 - 1)


def check_options(
    index: SampleIndex,
    world_size: int,
    gpu: bool,
    dali_augment,
    decode,
    pace,
    pace_lead_ms,
    resize,
) -> tuple[int, float]:
    """The dali backend's own option checks (one clear error each, on every rank, before any
    pipeline); returns ``(pace, pace_lead_ms)`` as the loader keeps them."""
    if index.remote:
        raise LoaderError(
            f"the dali backend reads local files (DALI maps or reads them itself), not "
            f"{remote.redact_url(index.root)}: use backend 'wds' or 'torch' for URLs, or "
            "mount the store"
        )
    if len(index) < world_size:
        raise LoaderError(
            f"{len(index)} samples cannot be split over {world_size} ranks by DALI: its "
            "readers need at least one sample per shard (rank); run ≤ "
            f"{len(index)} ranks, or use backend='torch', which pads training and gives "
            "a rank without samples no evaluation batches"
        )
    if dali_augment is not None and not callable(dali_augment):
        raise ValueError(f"dali_augment must be callable, got {type(dali_augment)}")
    check_values({"decode": decode, "pace": pace, "pace_lead_ms": pace_lead_ms, "resize": resize})
    if resize == "gpu" and dali_augment is not None:
        # the augmentations are handed the resized images where the decode left them
        raise ValueError("resize='gpu' does not combine with dali_augment: leave resize 'auto'")
    for name, value in zip(NEEDS_GPU, (decode, resize), strict=True):
        if value == "gpu" and not gpu:
            raise ValueError(f"{name}='gpu' needs a CUDA device")
    pace = int(pace)
    # the lead is a refinement of pace=1; other paces wait as they say
    return pace, float(pace_lead_ms) if pace == 1 else 0.0


def placement(
    decode: str, resize: str, gpu: bool, batch_size: int, threads: int, augment: bool = False
) -> tuple[str, str]:
    """Where DALI decodes and where it resizes, each "gpu" or "cpu", for the asked ``decode`` and
    ``resize`` (DECODE ON THE CPU, SMALL BATCHES, LARGER BATCHES ON ENOUGH THREADS, RESIZE ON
    THE GPU). ``augment``: a ``dali_augment`` is given; it is handed the resized images where
    the decode left them, so larger batches keep both on the GPU for it, as before."""
    if not gpu:
        return "cpu", "cpu"
    if decode == "auto" and batch_size > SMALL_BATCH:
        many = threads >= CPU_DECODE_THREADS and not augment
        return ("cpu", "gpu") if many else ("gpu", "gpu")
    decoded = "cpu" if decode == "auto" else decode
    return decoded, decoded if resize == "auto" else resize


class DaliLoader(DaliGraph, LoaderBase):
    """NVIDIA DALI backend; see the module docstring for the pipeline and the length rule."""

    backend = "dali"
    _worker_word = "threads"

    def __init__(
        self,
        index: SampleIndex,
        info,
        batch_size: int,
        *,
        workers: int,
        prefetch: int = 2,
        shuffle_buffer: int = 4096,
        hw_decoder_load: float = HW_DECODER_LOAD,
        dont_use_mmap: bool | None = None,
        pace: int | bool = 1,
        pace_lead_ms: float = LEAD_MS,
        decode: str = "auto",
        resize: str = "auto",
        dali_augment=None,
        reserve_cores: int = RESERVE_CORES,
        **common,
    ) -> None:
        require_dali()
        super().__init__(index, info, batch_size, **common)
        self.gpu = self.device.type == "cuda"
        self.pace, self.pace_lead_ms = check_options(
            index, info.world_size, self.gpu, dali_augment, decode, pace, pace_lead_ms, resize
        )
        self.dali_augment = dali_augment
        self._loader_cpus = loader_cores(reserve_cores, info.local_rank, info.local_world_size)
        self.num_threads = max(1, workers)
        self.workers = self.num_threads  # DALI CPU threads
        self.prefetch = prefetch
        self.shuffle_buffer = shuffle_buffer
        self.hw_decoder_load = hw_decoder_load
        # see PACING
        self._pacer = (
            Pacer(self.device, self.pace, self.pace_lead_ms) if self.gpu and pace else None
        )
        # None: plain reads for image trees (a map + unmap per small file costs more than a read),
        # mapping for shards (a few large files); BENCHMARKS.md, "Loaders"
        self.dont_use_mmap = index.kind == "tree" if dont_use_mmap is None else bool(dont_use_mmap)
        self.decode, self.resize = placement(
            decode, resize, self.gpu, batch_size, self.workers, dali_augment is not None
        )
        # training on a tree: torch's order, fed file by file (ORDER); else DALI's readers
        self._dealt = self.train and index.kind == "tree"
        # training on shards: a pipeline per epoch, its shards in that epoch's order (ORDER)
        self._per_epoch = self.train and index.kind == "shards"
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._index_paths: list[str] = []
        if index.kind == "shards":
            self._tmp = tempfile.TemporaryDirectory(prefix="loaders-dali-idx-")
            self._index_paths = write_dali_indexes(index, self._tmp.name)
            self._key_of: dict[tuple[str, str], int] | None = None
        # on the host: the batch's keys arrive there, and indexing a GPU table with host indices
        # would copy them synchronously (a wait for the training stream every batch)
        self._class_of = torch.from_numpy(np.array(index.labels))  # (a saved index: read-only)
        self.dataset = SourceView(index)  # len(), classes: what scripts read (loaders.dropin)
        self._iterator = None
        self._dali_epoch = 0  # the epoch DALI's pipeline will produce next
        self._built: int | None = None  # the epoch the pipeline was built for
        self._plan: tuple[int, int] | None = None  # (epoch, batch) a dealt pipeline began at
        self._midway = False  # an epoch was left before its end: DALI cannot reset there
        self._left: dict | None = None  # the pipeline's state when an epoch was left midway
        self._epoch_start: dict | None = None  # its state at the start of the epoch begun last

    def _settings(self) -> list[str]:
        words = super()._settings()  # the decode's place first, then the resize's
        words.insert(1, f"resize on the {self.resize.upper()}")
        return words

    # --- the pipeline -------------------------------------------------------------------------
    def _build(self, epoch: int, checkpoint: bytes | None = None, plan=None) -> None:
        """A pipeline (and its iterator) for ``epoch``, or restored from ``checkpoint``; a dealt
        one (ORDER) starts at ``plan`` = (epoch, batch) (the checkpoint's plan when restoring)."""
        from nvidia.dali import pipeline_def
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        @pipeline_def(
            batch_size=self.batch_size,
            num_threads=self.num_threads,
            device_id=self.device.index if self.gpu else None,
            seed=_pipe_seed(self.seed, self.info.rank, epoch),
            prefetch_queue_depth=self.prefetch,
            enable_checkpointing=True,  # state_dict; DALI documents no cost
        )
        def pipeline():
            jpegs, extra, keys = self._read()
            images, mirror = self._decode(jpegs)
            if self.dali_augment is not None:
                images = self._augment(images)
            images = self._normalise(images, mirror)
            outputs = [images, extra] + ([keys] if self._keys_out else [])
            if self._with_source:
                outputs.append(self._source(jpegs))
            return tuple(outputs)

        self.close()
        self._left = None
        self._plan = tuple(plan or (epoch, 0)) if self._dealt else None
        self._built = epoch  # (read by _read while the graph is defined, below)
        names = ["images", "extra"] + (["keys"] if self._keys_out else [])
        names += ["source"] if self._with_source else []
        # a reader's epochs end (the iterator resets); a dealt source runs on (ORDER); a
        # pipeline per epoch is not reset (it would start reading an epoch nobody asks for)
        ends = {} if self._dealt else dict(reader_name=READER, auto_reset=not self._per_epoch)
        try:
            with started_on(self._loader_cpus):  # DALI's threads start in the build (affinity)
                pipe = pipeline(checkpoint=checkpoint)
                self._iterator = DALIGenericIterator(
                    [pipe], names, last_batch_policy=LastBatchPolicy.FILL, **ends
                )
        except RuntimeError as e:
            raise self._diagnose(e) from None
        self._dali_epoch = epoch
        meta = {} if self._dealt else pipe.reader_meta(READER)
        self.shard_id = int(meta.get("shard_id", self.info.rank))

    # The graph, piece by piece: called inside the pipeline definition. Your own operators go
    # in through ``dali_augment`` (:meth:`_augment`); a subclass may override a piece.
    @property
    def _with_source(self) -> bool:
        return self.return_keys and self.index.kind == "shards"

    @property
    def _keys_out(self) -> bool:
        """A dealt pipeline's keys are an output of their own, made only when asked for (its
        labels come out as ``extra``)."""
        return self.return_keys and self._dealt

    # --- one epoch ---------------------------------------------------------------------------
    def _epoch_batches(self, epoch: int, start: ResumePoint | None):
        skip = start.batches if start else 0
        if self._dealt and skip >= len(self):
            return  # (drop_last with fewer samples than a batch: an epoch of no batches)
        if not self._restore(epoch, start) and (
            skip
            or self._iterator is None
            or epoch != self._dali_epoch
            or self._midway
            or (self._per_epoch and epoch != self._built)
        ):
            self._rebuild(epoch, skip)
        assert self._iterator is not None
        if start is None and (self._epoch_start or {}).get("epoch") != epoch:
            # epoch 0, or a pipeline per epoch: the epoch's start is a new build
            fresh = not epoch or self._per_epoch
            self._epoch_start = None if fresh else self._checkpoint()
        remaining = self.samples_per_rank - skip * self.batch_size
        finished = False
        self._midway = True
        try:
            for data in self._dali_batches(len(self) - skip):
                out = data[0]
                n = min(self.batch_size, remaining)
                remaining -= n
                if n == 0 or (self.drop_last and n < self.batch_size):
                    continue  # DALI's padding beyond this rank's samples, or a partial batch
                batch = self._outputs(out, n)
                if self._pacer is not None:
                    self._pacer.wait()
                yield batch
            finished = True
        except RuntimeError as e:
            self._iterator = None
            raise self._diagnose(e) from None
        finally:
            if finished:
                self._dali_epoch = epoch + 1
                self._midway = False
                if self._per_epoch:  # its epoch is over; the next one has its own (ORDER)
                    self._iterator = None
            else:  # left mid-epoch: DALI cannot reset there; rebuild for the next iteration
                # what state_dict reports from now on; none at the interpreter's exit, where
                # nothing iterates again and DALI's Python is half torn down (an error printed)
                self._left = None if sys.is_finalizing() else self._checkpoint()
                self._iterator = None

    def _dali_batches(self, count: int):
        """The iterator's batches of one epoch: a reader's until its epoch ends (padding
        included), a dealt source's (which never ends) exactly the ``count`` of the epoch."""
        if not self._dealt:
            yield from self._iterator
            return
        for _ in range(count):
            yield next(self._iterator)

    def _rebuild(self, epoch: int, skip: int = 0) -> None:
        """A new pipeline for ``epoch``: from the checkpoint taken at its start if this loader
        began it before (a peek, a ``break``), so that epoch's order and augmentations are the
        ones it had; else seeded by ``(seed, epoch)`` (dealt: from batch ``skip`` on)."""
        at = self._epoch_start
        if not skip and at is not None and at["epoch"] == epoch and at["checkpoint"] is not None:
            self._build(epoch, checkpoint=at["checkpoint"], plan=at.get("plan"))
        else:
            self._build(epoch, plan=(epoch, skip))

    # --- resumption ---------------------------------------------------------------------------
    def _checkpoint(self) -> dict:
        """The pipeline's state (DALI's checkpoint, counting the batches the iterator returned,
        not what DALI prefetched), the epoch its pipeline is in, whether it is midway, and
        (dealt, ORDER) the (epoch, batch) it began at, from which the checkpoint's iteration
        counts."""
        if self._per_epoch and not self._midway:  # an epoch's start: a new build (ORDER)
            return {"checkpoint": None, "epoch": self._dali_epoch, "midway": False}
        if self._iterator is None:
            return self._left or {"checkpoint": None, "epoch": 0, "midway": False}
        cpt = self._iterator.checkpoints()[0]
        plan = list(self._plan) if self._plan is not None else None
        return {
            "checkpoint": bytes(cpt),
            "epoch": self._dali_epoch,
            "midway": self._midway,
            "plan": plan,
            "per_epoch": self._per_epoch,
            "dealt_outputs": [DEALT_OUTPUTS, self._keys_out] if self._dealt else None,
        }

    def _backend_state(self) -> dict:
        """DALI's own state: per rank (the pipeline reads this rank's samples) and per epoch
        position; it carries the random augmentations' state and the reader's position, so
        only its checkpoint reproduces the rest of an epoch left midway."""
        pending = self._resume.extra if self._resume is not None else None
        return {"shuffle_buffer": self.shuffle_buffer, "dali": pending or self._checkpoint()}

    def _extra_state(self, state: dict) -> dict:
        if not self._dealt and state.get("shuffle_buffer") != self.shuffle_buffer:
            raise ValueError(
                f"the loader state was saved with shuffle_buffer={state.get('shuffle_buffer')!r},"
                f" this loader has {self.shuffle_buffer!r}: DALI's order depends on it"
            )
        dali = state.get("dali")
        if not isinstance(dali, dict) or state["world_size"] != self.info.world_size:
            return {}  # an epoch's start on another world size: a new pipeline
        if dali.get("checkpoint") is not None and state.get("rank") != self.info.rank:
            raise ValueError(
                f"this dali loader state is rank {state.get('rank')}'s, not rank "
                f"{self.info.rank}'s: the dali backend's state is per rank (each rank saves and "
                "loads its own; gather them with torch.distributed.all_gather_object)"
            )
        if dali.get("checkpoint") is not None and (
            self._dealt != bool(dali.get("plan")) or self._per_epoch != bool(dali.get("per_epoch"))
        ):
            raise ValueError(
                "this dali loader state was saved by another version of loaders (its pipeline "
                "reads the files another way): resume from an epoch's start"
            )
        if dali.get("checkpoint") is not None and self._dealt:
            self._check_dealt_outputs(dali.get("dealt_outputs"))
        return dict(dali)

    def _check_dealt_outputs(self, saved) -> None:
        """DALI restores a checkpoint only into a pipeline with the same outputs; told "the
        checkpoint might come from another pipeline", a user could not tell why."""
        if not saved or saved[0] != DEALT_OUTPUTS:
            raise ValueError(
                "this dali loader state was saved by another version of loaders (its pipeline "
                "had other outputs): resume from an epoch's start"
            )
        if bool(saved[1]) != self._keys_out:
            raise ValueError(
                f"this dali loader state was saved with return_keys={bool(saved[1])}, this "
                f"loader has return_keys={self._keys_out}: DALI's pipeline has other outputs; "
                "build the loader as it was saved"
            )

    def _restore(self, epoch: int, start: ResumePoint | None) -> bool:
        """Build the pipeline from a loaded checkpoint, if it is where ``epoch`` resumes: in
        that epoch, or at the end of the one before (then a reader's padding batches are
        drained; a dealt source's next batch is already the epoch's first)."""
        dali = start.extra if start is not None else {}
        cpt, at, midway = dali.get("checkpoint"), dali.get("epoch"), dali.get("midway")
        if self._per_epoch and not (midway and at == epoch):
            cpt = None  # the epoch's start, or the end of the one before: a new build (ORDER)
        if cpt is None or not (at == epoch or (midway and at == epoch - 1)):
            if start is not None and start.batches and not self._dealt:
                raise ValueError("the dali loader state has no pipeline checkpoint to resume")
            return False  # (dealt: the order is a function of the epoch, rebuilt from there)
        self._build(at, checkpoint=cpt, plan=dali.get("plan"))
        self._dali_epoch, self._midway = at, bool(midway)
        if at == epoch - 1:
            if not self._dealt:
                for _ in self._iterator:  # the padding left of the epoch before
                    pass
            self._dali_epoch, self._midway = epoch, False
        return True

    def _outputs(self, out: dict, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One batch; nothing here makes the host wait for the GPU (that is ``pace``'s choice).

        The images are already on the device (DALI copies them on the current stream); so are
        a dealt pipeline's labels. A reader's labels are made on the host from its CPU outputs
        and copied from pinned memory with ``non_blocking``.
        """
        images, extra = out["images"], out["extra"]
        if n < len(images):  # (a full batch: no slicing op on the training thread)
            images, extra = images[:n], extra[:n]
        if images.device != self.device:
            images = images.to(self.device, non_blocking=True)
        if self.channels_last:
            images = images.permute(0, 3, 1, 2)  # NHWC memory = NCHW channels_last
        if images.dtype != self.dtype:
            images = images.to(self.dtype)
        if self._dealt:  # labels, on the device already (and keys if asked for)
            keys = out["keys"][:n].reshape(-1) if "keys" in out else torch.empty(0)
            return images, extra.reshape(-1), keys
        extra = extra.cpu()  # the reader's outputs: already on the host in a GPU pipeline
        if self.index.kind == "tree":
            keys = extra.reshape(-1).to(torch.int64)
            labels = self._class_of[keys]
        else:
            labels = parse_labels(extra)
            keys = self._shard_keys(out["source"][:n]) if "source" in out else torch.empty(0)
        if self.gpu:
            labels = labels.pin_memory().to(self.device, non_blocking=True)
        return images, labels, keys

    def _shard_keys(self, source: torch.Tensor) -> torch.Tensor:
        if self._key_of is None:
            ix = self.index
            assert ix.names is not None and ix.shard_of is not None
            self._key_of = {
                (ix.shards[int(ix.shard_of[i])], ix.names[i]): i for i in range(len(ix))
            }
        keys = []
        for row in source.cpu().numpy():
            text = row.tobytes().rstrip(b"\0").decode()
            tar, _, rest = text.rpartition(":")
            tar = tar.rpartition(":")[0] if re.fullmatch(r".*:\d+", tar) else tar
            keys.append(self._key_of.get((tar, rest), -1))
        return torch.tensor(keys, dtype=torch.int64)

    # --- errors -------------------------------------------------------------------------------
    def _diagnose(self, error: Exception) -> LoaderError:
        """DALI's multi-line error → one line naming the file (:mod:`loaders.dali_errors`)."""
        return diagnose(error, self.index, self.info.rank, self.num_threads)

    def find_undecodable(self, threads: int | None = None) -> tuple[str, str] | None:
        """The first sample (in listing order) that the CPU decoder cannot decode, and why."""
        return find_undecodable(self.index, threads or self.num_threads)

    def close(self) -> None:
        self._iterator = None  # DALI frees the pipeline with the iterator
        if self._pacer is not None:
            self._pacer.reset()

    def __del__(self) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            tmp.cleanup()
