"""The WebDataset backend: whole shards per rank and per worker, equal batch counts by padding.

Per epoch ``e`` every process computes the same plan from the shared seed (no communication):

1. the shard order is a permutation seeded by ``(seed, e)`` — the same on every rank;
2. split by node: rank ``r`` of ``W`` takes shards ``order[r::W]``; split by worker: worker ``w`` of
   ``K`` takes ``mine[w::K]`` (``webdataset.split_by_node`` / ``split_by_worker`` semantics,
   but with the rank this loader was given — arguments win — instead of re-reading the environment);
3. each worker streams its shards with the data layer's tar reader
   (:func:`loaders.data.tar.iter_shard`: sequential reads of a file, or of an ``s3://`` or
   ``http(s)://`` object through :mod:`loaders.data.remote`), shuffles samples in a buffer of
   ``shuffle_buffer / K`` raw samples (``webdataset.shuffle``), decodes with
   :class:`loaders.decode.CpuDecoder` and sends uint8 chunks of one batch to the main process,
   which re-batches the workers' partial tails.

**Equal batch counts, by padding by repeating.** Whole shards cannot split ``N`` samples evenly, so
every rank yields the same fixed number of samples every epoch,
``S = the sum of the ceil(num_shards / W) largest shards`` (the most any rank can be dealt), in
``ceil(S / B)`` batches (``S // B`` with ``drop_last``). A rank whose shards hold fewer samples
makes up the difference by repeating its own shards' samples (its workers start their shards over),
so every sample is seen at least once per epoch and exactly ``W·S − N`` samples are repeats. With
shards of equal size and a shard count divisible by ``W`` there is no padding at all. There must be
at least ``W × K`` shards (every worker of every rank needs one), else :class:`LoaderError` says so.

Workers go on into the next epoch: one DataLoader iterator runs across epochs (each worker's stream
is endless, every chunk tagged with its epoch), so no worker idles at an epoch's end waiting for the
training loop's next ``iter()`` (BENCHMARKS.md, "wds backend across epoch boundaries"). Workers
with smaller shares pad their epoch with empty chunks,
which keeps DataLoader's strict worker turn aligned with epochs. The starting epoch reaches the
persistent workers through a shared-memory tensor set before the iterator (re)starts: at the first
epoch, after an epoch left midway, or on ``set_epoch`` to other than the next epoch.

Evaluation (``train=False``): shards in their listed order, rank ``r`` takes ``[r::W]`` and reads
each sample once, with no padding: ranks yield what their shards hold, so with shards of unequal
size or a count not divisible by ``W`` they differ by up to a shard or more (whole shards cannot
be split exactly); with ``even_batches=True`` every rank reads as many as the rank with the most
(its workers repeat their shards, each repeat's key marked until the main process turns it into
``valid``). Resumption midway through an epoch replays the epoch's reads up to the point
the state was taken without decoding (the batches made are exactly the uninterrupted run's:
rebatching depends only on chunk sizes), on the same world size and worker count; a sample that
failed to decode in the skipped part would shift the rest (training replaces it with the next).

Bad input: skipped and counted (``loader.skipped``). A sample that cannot be decoded is dropped and
its worker reads one more (repeating if it must), so counts stay exact; samples that listing found
unusable (no label, no image, truncated shard tail) are never yielded.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
import time
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from loaders.affinity import RESERVE_CORES, loader_cores
from loaders.base import LoaderBase, batch_output
from loaders.data import SampleIndex, Skipped, remote, split_member_name
from loaders.data.tar import iter_shard
from loaders.decode import CpuDecoder, DecodeError
from loaders.dropin import SourceInfo
from loaders.errors import LoaderError
from loaders.gpu_decode import EncodedBatch, EncodedBatchMaker, GpuJpegDecoder, decode_where
from loaders.prefetch import DevicePrefetcher
from loaders.resume import ResumePoint
from loaders.slots import BatchSlots, SlotBatch
from loaders.torch_backend import WORKER_NICE, WorkersAcrossEpochs, _new_uint8, worker_options
from loaders.worker_clock import WorkerClock


def split_by_node(src, rank: int, world_size: int):
    """Every ``world_size``-th item from ``rank`` (webdataset.split_by_node, explicit rank)."""
    return list(src)[rank::world_size]


def split_by_worker(src, worker: int, num_workers: int):
    """Every ``num_workers``-th item from ``worker`` (webdataset.split_by_worker, explicit id)."""
    return list(src)[worker::num_workers]


def shard_order(num_shards: int, seed: int, epoch: int) -> np.ndarray:
    """The epoch's shard order: the same on every rank and worker (a shared seed, no messages)."""
    return np.random.default_rng([seed, epoch, 0x5EED]).permutation(num_shards)


def fixed_samples_per_rank(per_shard: np.ndarray, world_size: int) -> int:
    """The most samples whole-shard splitting can deal one rank: the fixed epoch length."""
    k = math.ceil(len(per_shard) / world_size)
    return int(np.sort(per_shard)[::-1][:k].sum())


def worker_quotas(per_shard, order, rank, world_size, num_workers, samples_per_rank):
    """``[(shards, quota)]`` per worker of ``rank``: its shards and how many samples it yields."""
    mine = split_by_node(order, rank, world_size)
    shards = [split_by_worker(mine, w, num_workers) for w in range(num_workers)]
    natural = [int(per_shard[s].sum()) if len(s) else 0 for s in shards]
    pad = samples_per_rank - sum(natural)
    return [
        (s, n + pad // num_workers + (1 if w < pad % num_workers else 0))
        for w, (s, n) in enumerate(zip(shards, natural, strict=True))
    ]


class ShardStream(SourceInfo, IterableDataset):
    """Iterable dataset: in each worker, its shards of this epoch as uint8 chunks of one batch;
    also ``loader.dataset`` (:class:`loaders.dropin.SourceInfo`: ``len()`` is the source's)."""

    def __init__(
        self,
        index: SampleIndex,
        decoder: CpuDecoder,
        *,
        rank: int,
        world_size: int,
        seed: int,
        samples_per_rank: int,
        chunk: int,
        shuffle: bool,
        shuffle_buffer: int,
        pin: bool,
        mark_repeats: bool = False,
        slots: BatchSlots | None = None,
        encode: bool = False,
        clock: WorkerClock | None = None,
    ) -> None:
        self.index = index
        self.slots = slots  # workers decode whole chunks into these (loaders.slots)
        self.clock = clock  # each worker's time making chunks (loaders.worker_clock)
        # decode="gpu": workers send bytes and crops (loaders.gpu_decode), made per process
        self.encode = encode
        self._maker: EncodedBatchMaker | None = None
        self.mark_repeats = mark_repeats
        self.decoder = decoder
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.samples_per_rank = samples_per_rank
        self.chunk = chunk
        self.shuffle = shuffle
        self.shuffle_buffer = shuffle_buffer
        self.pin = pin
        self.epoch = torch.zeros(1, dtype=torch.int64).share_memory_()
        self.skip = torch.zeros(1, dtype=torch.int64).share_memory_()
        self.per_shard = index.samples_per_shard()
        self.first = np.concatenate([[0], np.cumsum(self.per_shard)]).astype(np.int64)
        # shards that listing found cut off (it counted them: reading them again does not)
        shown = {index.describe_shard(s): s for s in range(len(index.shards))}
        self.truncated = {
            index.shards[shown[s.path]]
            for s in index.skipped
            if "truncated" in s.reason and s.path in shown
        }

    def _keys(self, shard: int) -> dict[str, int]:
        assert self.index.names is not None
        a, b = int(self.first[shard]), int(self.first[shard + 1])
        return {split_member_name(self.index.names[i])[0]: i for i in range(a, b)}

    def _samples(
        self, shards, epoch, worker, skipped: list[Skipped]
    ) -> Iterator[tuple[int, bytes]]:
        """``(index, image bytes)`` of ``shards``, in order, forever (each pass = a new cycle)."""
        import webdataset as wds

        for cycle in range(1 << 30):
            found = 0
            raw = self._stream(shards, skipped)
            if self.shuffle:
                rng = random.Random(hash((self.seed, epoch, self.rank, worker, cycle)))
                per_worker = max(1, self.shuffle_buffer)
                raw = wds.shuffle(per_worker, min(per_worker, 100), rng=rng)(raw)
            for item in raw:
                found += 1
                yield item
            if found == 0:
                names = ", ".join(self.index.describe_shard(s) for s in shards[:3])
                raise LoaderError(f"no readable samples in shards {names}")

    def _stream(self, shards, skipped: list[Skipped]) -> Iterator[tuple[int, bytes]]:
        """``(index, image bytes)`` of ``shards`` read front to back by THE tar reader
        (:func:`loaders.data.tar.iter_shard`) from a file or a URL (:mod:`loaders.data.remote`:
        timeouts, one client per endpoint and process). A shard that cannot be read from some
        point on gives the samples before it and is counted in ``skipped`` (unless listing
        already found it cut off); samples that listing left out are not yielded (it counted
        them)."""
        for s in shards:
            path = self.index.shards[s]
            keys = self._keys(s)
            cut = len(path.rstrip("/").rsplit("/", 1)[-1]) + 1  # iter_shard's "name.tar:" prefix
            try:
                # a buffer of its own: this stream pauses mid-shard while others read (a second
                # loader in this process, e.g. validation with workers=0)
                reader = remote.open_reader(path, own_buffer=True)
            except OSError as e:
                why = remote.reason(e)
                skipped.append(Skipped(self.index.describe_shard(s), f"tar read error: {why}"))
                continue
            for sample in iter_shard(reader, path):
                if sample.key == path:  # the shard could not be read on from here
                    if path not in self.truncated:
                        why = f"tar read error: {remote.redact_text(str(sample.error))}"
                        skipped.append(Skipped(self.index.describe_shard(s), why))
                    continue
                i = keys.get(sample.key[cut:])
                if i is not None:  # a zero-byte image (listed) fails to decode, and is counted
                    yield i, sample.data or b""

    def _plan(self, epoch: int, num_workers: int) -> list[tuple[list[int], int]]:
        order = (
            shard_order(len(self.index.shards), self.seed, epoch)
            if self.shuffle
            else np.arange(len(self.index.shards))
        )
        return worker_quotas(
            self.per_shard, order, self.rank, self.world_size, num_workers, self.samples_per_rank
        )

    def chunks_per_worker(self, epoch: int, num_workers: int) -> int:
        """Chunks every worker yields in ``epoch``: the most any worker's quota needs."""
        return self._chunks_in(self._plan(epoch, num_workers))

    def _chunks_in(self, plan: list[tuple[list[int], int]]) -> int:
        """The chunks per worker of an epoch's plan: the most any worker's quota needs.

        A worker with a smaller quota pads with empty chunks, so that DataLoader's strict turn of
        workers (item i comes from worker i mod K) holds exactly one epoch per ``K × M`` items,
        and a worker that finishes early goes on into the next epoch only as far as its prefetch
        allows (no unbounded run-ahead of the worker with the smaller share).
        """
        return max(math.ceil(max(q, 0) / self.chunk) for _, q in plan)

    def __iter__(self):
        """Endless: the chunks of the epoch set before ``iter()``, then of every next epoch.

        Each item is ``(images, labels, keys, skipped, epoch)``; the loader takes exactly
        :meth:`chunks_per_worker` × workers items per epoch. Workers thus start epoch e + 1 while
        epoch e's last batches are still being used (instead of idling until the next ``iter()``).
        To resume midway, the first ``skip`` items of the first epoch (in the workers' turn) are
        read but not decoded: their pixels are never used (see :meth:`WdsLoader._chunks`).
        """
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        first, skip = int(self.epoch[0]), int(self.skip[0])
        for epoch in itertools.count(first):
            yield from self._epoch_chunks(epoch, worker, num_workers, skip if epoch == first else 0)

    def _epoch_chunks(self, epoch: int, worker: int, num_workers: int, skip: int):
        """One worker's chunks of ``epoch``, padded with empty ones to the epoch's chunk count."""
        size = self.decoder.size
        plan = self._plan(epoch, num_workers)
        shards, quota = plan[worker]
        own = int(self.per_shard[shards].sum()) if len(shards) else 0  # then repeats
        chunks = self._chunks_in(plan)
        if chunks == 0:
            raise LoaderError("no samples to read: every worker's quota is empty")
        sent = done = 0
        read_errors: list[Skipped] = []
        samples = self._samples([int(s) for s in shards], epoch, worker, read_errors)
        while done < quota:
            t0 = time.perf_counter()
            n = min(self.chunk, quota - done)
            fake = sent * num_workers + worker < skip
            # a seed per chunk: a chunk's augmentations do not depend on the chunks before it
            rng = np.random.default_rng([self.seed, epoch, self.rank, worker, sent, 0xA06])
            slot, target, slot_labels = self._target(n, fake)
            images, keys, skipped = self._chunk(samples, target, rng, fake, own - done, own)
            skipped += read_errors
            read_errors.clear()
            done += n
            sent += 1
            labels = torch.from_numpy(self.index.labels[np.where(keys < 0, -1 - keys, keys)])
            if slot is not None:  # the slot's number and small arrays (pickled, no shared memory)
                slot_labels[: len(keys)] = labels
                item = SlotBatch(slot, len(keys), keys, skipped, epoch)
            else:
                item = images, labels, torch.from_numpy(keys), skipped, epoch
            if self.clock is not None and not fake:  # a resumed epoch's skipped chunks: read only
                self.clock.since(worker, t0, self.slots if slot is not None else None)
            yield item
        for _ in range(chunks - sent):  # padding in the workers' turn (see chunks_per_worker)
            none = torch.empty(0, dtype=torch.int64)
            yield torch.empty((0, size, size, 3), dtype=torch.uint8), none, none, [], epoch

    def _target(self, n: int, fake: bool):
        """Where a chunk of ``n`` is decoded: (slot, its images, its labels) of the worker's
        next batch slot, or (None, a new uint8 tensor, None); chunks left undecoded (resuming)
        take no slot."""
        if self.slots is not None and not fake and get_worker_info() is not None:
            slot, images, labels = self.slots.claim()
            return slot, images[:n], labels
        if self.encode:  # the chunk's bytes are packed after reading (_chunk)
            return None, n, None
        size = self.decoder.size
        return None, _new_uint8((n, size, size, 3), self.pin), None

    def _chunk(self, samples, images, rng, fake: bool, repeats_from: int, own: int):
        """``len(images)`` samples decoded into ``images`` (``fake``: read, left undecoded);
        decode="gpu": ``images`` is the count, and the chunk an :class:`EncodedBatch`.

        Training replaces a sample that fails to decode with the next one (counts stay exact);
        evaluation leaves it out (every sample at most once), so the chunk is smaller. The
        worker's stream of ``own`` samples repeats forever: twice that many failures in a row
        mean (nearly) none decodes, a LoaderError rather than a worker replacing forever. Even
        evaluation (``mark_repeats``): the key of the ``repeats_from``-th read on, a repeat of
        the worker's own samples, is stored as ``-1 - key`` (:meth:`WdsLoader._mark_repeats`).
        decode="gpu" finds a bad JPEG header here, a bad body only in the training process
        (:class:`loaders.gpu_decode.GpuJpegDecoder`), where the batch is then one smaller."""
        if self.encode:
            n = int(images)
            if self._maker is None:
                self._maker = EncodedBatchMaker(self.decoder)
            maker = self._maker

            def put(data: bytes, got: int) -> None:
                maker.add(data, rng)
        else:
            n = len(images)
            out = images.numpy()

            def put(data: bytes, got: int) -> None:
                self.decoder.decode_into(data, out[got], rng)

        keys = np.empty(n, dtype=np.int64)
        skipped: list[Skipped] = []
        got = tried = in_row = 0
        while got < n and (self.shuffle or tried < n):
            i, data = next(samples)
            tried += 1
            try:
                if not fake:
                    put(data, got)
            except DecodeError as e:
                skipped.append(Skipped(self.index.describe(i), str(e)))
                in_row += 1
                if in_row >= 2 * max(own, 1):
                    first = skipped[-in_row]
                    raise LoaderError(
                        f"{in_row:,} samples in a row could not be decoded (this worker's "
                        f"shards hold {own:,}), e.g. {first.path}: {first.reason}"
                    ) from e
                continue
            in_row = 0
            keys[got] = -1 - i if self.mark_repeats and tried > repeats_from else i
            got += 1
        if not self.encode:
            return images[:got], keys[:got], skipped
        new = functools.partial(_new_uint8, pin=False)
        if fake:
            return EncodedBatch.unread(got, self.decoder.size, new), keys[:got], skipped
        return self._maker.batch(new), keys[:got], skipped


def rebatch(chunks, batch_size: int, drop_last: bool, pin: bool):
    """Chunks of ≤ one batch → batches of exactly ``batch_size`` (the last may be smaller)."""
    pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    count = 0
    for images, labels, keys in chunks:
        if len(images) == batch_size:
            yield images, labels, keys
            continue
        pending.append((images, labels, keys))
        count += len(images)
        while count >= batch_size:
            yield _take(pending, batch_size, pin)
            count -= batch_size
    if count and not drop_last:
        yield _take(pending, count, pin)


def _take(pending, n: int, pin: bool):
    parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    need = n
    while need:
        images, labels, keys = pending[0]
        if len(images) <= need:
            parts.append(pending.pop(0))
            need -= len(images)
        else:
            parts.append((images[:need], labels[:need], keys[:need]))
            pending[0] = (images[need:], labels[need:], keys[need:])
            need = 0
    first = parts[0][0]
    if isinstance(first, EncodedBatch):  # decode="gpu": bytes and crops, not pixels
        batch = EncodedBatch.cat([p[0] for p in parts])
        return batch, torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts])
    out = torch.empty((n, *first.shape[1:]), dtype=first.dtype, pin_memory=pin)
    torch.cat([p[0] for p in parts], out=out)
    return out, torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts])


def _too_few_shards(shards: int, world_size: int, workers: int) -> str:
    """Why ``shards`` cannot feed the ranks' workers, and the fix that does: fewer workers only
    where every rank has a shard (a rank without one has nothing to read, or to repeat)."""
    readers = world_size * max(1, workers)
    why = f"{shards} shards cannot feed {world_size} ranks × {max(1, workers)} workers"
    if shards < world_size:
        return (
            f"{why}: every rank needs at least one whole shard (reshard into ≥ {world_size} "
            f"shards, run ≤ {shards} ranks, or use backend='torch', which splits by sample)"
        )
    return (
        f"{why}: every worker needs at least one shard (use ≤ {shards // world_size} workers, "
        f"or reshard into ≥ {readers} shards)"
    )


class WdsLoader(WorkersAcrossEpochs, LoaderBase):
    """WebDataset backend; see the module docstring for the split and the padding rule."""

    backend = "wds"

    def __init__(
        self,
        index: SampleIndex,
        info,
        batch_size: int,
        *,
        workers: int,
        prefetch: int = 2,
        shuffle_buffer: int = 4096,
        decoder: str = "auto",
        multiprocessing_context=None,
        worker_nice: int = WORKER_NICE,
        reserve_cores: int = RESERVE_CORES,
        batch_transform=None,
        normalize: bool = True,
        slots: bool | None = None,
        decode: str = "auto",
        **common,
    ) -> None:
        super().__init__(index, info, batch_size, **common)
        self._loader_cpus = loader_cores(reserve_cores, info.local_rank, info.local_world_size)
        self.output = batch_output(self, batch_transform, normalize)
        if index.kind != "shards":
            raise LoaderError(
                "the wds backend reads WebDataset shards; for an image tree use backend='torch' "
                "or 'dali' (or write shards: feedbench sample writes both)"
            )
        per_shard = index.samples_per_shard()
        readers = info.world_size * max(1, workers)
        if len(index.shards) < readers:
            raise LoaderError(_too_few_shards(len(index.shards), info.world_size, workers))
        if self.train:
            self.samples_per_rank = fixed_samples_per_rank(per_shard, info.world_size)
        else:  # evaluation: this rank's whole shards, each sample once, no padding
            mine = split_by_node(range(len(per_shard)), info.rank, info.world_size)
            self.samples_per_rank = self.eval_samples = int(per_shard[mine].sum())
            if self.even_batches:  # padded to the most any rank's shards hold (base.py)
                w = info.world_size
                self.samples_per_rank = max(int(per_shard[r::w].sum()) for r in range(w))
        self.shuffle_buffer = shuffle_buffer
        self.workers = workers
        self.decode = decode_where(decode, self.device)
        on_gpu = self.decode == "gpu"
        pin = self.device.type == "cuda" and not on_gpu  # JPEG bytes go through nvJPEG's own
        self.pin = pin
        self.slots = None if on_gpu else self._batch_slots(slots, workers, prefetch, pin)
        self.clock = WorkerClock(workers) if workers > 0 else None
        self.decoder = CpuDecoder(self.image_size, self.train, decoder, self.transform)
        self.gpu_decoder = GpuJpegDecoder(self.decoder, self.device) if on_gpu else None
        self.dataset = ShardStream(
            index,
            self.decoder,
            rank=info.rank,
            world_size=info.world_size,
            seed=self.seed,
            samples_per_rank=self.samples_per_rank,
            chunk=batch_size,
            shuffle=self.train,
            shuffle_buffer=max(1, shuffle_buffer // max(1, workers)),
            pin=pin and workers == 0,
            mark_repeats=self.even_batches,
            slots=self.slots,
            encode=on_gpu,
            clock=self.clock,
        )
        kwargs = worker_options(workers, prefetch, multiprocessing_context, worker_nice)
        self.dataloader = DataLoader(
            self.dataset,
            batch_size=None,
            num_workers=workers,
            pin_memory=pin and workers > 0 and self.slots is None,
            **kwargs,
        )

    def _chunks(self, epoch: int, start: ResumePoint | None, skip: int):
        """Epoch ``epoch``'s chunks from the one DataLoader iterator that runs across epochs
        (:class:`WorkersAcrossEpochs`); the first ``skip`` left undecoded (resuming)."""
        workers = max(1, self.workers)
        items = self.dataset.chunks_per_worker(epoch, workers) * workers

        def begin() -> None:  # shared memory: the workers read it on iter()
            self.dataset.epoch[0], self.dataset.skip[0] = epoch, skip

        chunks = self._epoch_items(epoch, items, begin, restart=start is not None)
        for item in chunks:
            if isinstance(item, SlotBatch):
                item = self._from_slot(item)
            images, labels, keys, skipped, e = item
            if e != epoch:  # the workers' turn guarantees this; a broken turn must not pass
                raise RuntimeError(f"wds: a chunk of epoch {e} arrived in epoch {epoch}")
            self._record_skipped(skipped)
            if len(images):
                yield images, labels, keys

    def _copied_out(self, batch: SlotBatch) -> bool:
        """A whole batch stays a view of its slot until its copy to the GPU; a shorter one (a
        worker's last of an epoch), waiting in :func:`rebatch` for others, is copied out and
        its slot handed back at once."""
        return super()._copied_out(batch) or batch.n != self.batch_size

    def _from_slot(self, chunk: SlotBatch):
        """A chunk in its slot as the workers' other chunks (:meth:`_copied_out`)."""
        assert self.slots is not None
        return (*self.slots.unpack(chunk, self._copied_out(chunk)), chunk.skipped, chunk.epoch)

    def _resume_skip(self, epoch: int, batches: int) -> int:
        """How many of the epoch's first chunks (in the workers' turn) only batches before
        ``batches`` use: rebatching depends on chunk sizes alone, so it is replayed on sizes."""
        workers = max(1, self.workers)
        plan = self.dataset._plan(epoch, workers)
        per_worker = self.dataset._chunks_in(plan)
        sizes = []
        for j in range(per_worker):
            for _, quota in plan:
                sizes.append(max(0, min(self.batch_size, quota - j * self.batch_size)))
        tags = [torch.full((n,), i, dtype=torch.int64) for i, n in enumerate(sizes) if n]
        later = itertools.islice(
            rebatch(((t, t, t) for t in tags), self.batch_size, self.drop_last, False),
            batches,
            None,
        )
        return min((int(b[0].min()) for b in later), default=len(sizes))

    def _epoch_batches(self, epoch: int, start: ResumePoint | None):
        skip = self._resume_skip(epoch, start.batches) if start and start.batches else 0
        chunks = self._chunks(epoch, start, skip)
        batches = rebatch(chunks, self.batch_size, self.drop_last, self.pin)
        if start is not None:
            batches = itertools.islice(batches, start.batches, None)
        yield from DevicePrefetcher(
            batches, self.device, self.output, slots=self.slots,
            decode=self._decoded if self.gpu_decoder is not None else None,
        )  # fmt: skip

    def dealt_per_rank(self) -> int:
        """Evaluation: the largest rank's whole shards (training: ``samples_per_rank``)."""
        if self.train or self.even_batches:
            return self.samples_per_rank
        per_shard, world = self.dataset.per_shard, self.info.world_size
        rank_of = np.arange(len(per_shard)) % world  # split_by_node: shard s goes to s mod W
        return int(np.bincount(rank_of, weights=per_shard, minlength=world).max())

    def _mark_repeats(self, keys: torch.Tensor, done: int, n: int):
        """A worker repeats its own shards after their samples, so a rank's repeats come
        between its workers' samples: each is marked in its key (:meth:`ShardStream._chunk`)."""
        valid = keys >= 0
        return torch.where(valid, keys, -1 - keys), valid

    def _backend_state(self) -> dict:
        # the order depends on them: the split over workers and the shuffle buffer
        return {"workers": max(1, self.workers), "shuffle_buffer": self.shuffle_buffer}

    def _extra_state(self, state: dict) -> dict:
        for key, value in self._backend_state().items():
            if state.get(key) != value:
                raise ValueError(
                    f"the loader state was saved with {key}={state.get(key)!r}, this loader has "
                    f"{key}={value!r}: the wds backend's order depends on it"
                )
        return {}
