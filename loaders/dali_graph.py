"""The DALI loader's pipeline graph, operator by operator: the readers (the dealt files of
training on a tree, the file reader of evaluation, the webdataset reader of shards), the decode
with its random crop, the resize, your augmentations, the normalisation. A mixin of
:class:`loaders.dali_backend.DaliLoader`, whose module docstring says why each is as it is; its
methods are called while the pipeline is defined and read the loader's settings."""

from __future__ import annotations

import numpy as np
import torch

from loaders.dali_feed import DealtFiles
from loaders.data.formats import IMAGE_MEMBER_EXTS, LABEL_EXTENSION
from loaders.wds_backend import shard_order

READER = "Reader"
LABEL_DIGITS = 12  # .cls members longer than this are not labels


class DaliGraph:
    """The operators of :class:`loaders.dali_backend.DaliLoader`'s pipeline."""

    def _reader_args(self) -> dict:
        return dict(
            shard_id=self.info.rank,  # the GLOBAL rank: the local rank only picks the GPU
            num_shards=self.info.world_size,
            pad_last_batch=True,
            random_shuffle=self.train,
            # evaluation: always this rank's own contiguous range (loaders.dist.eval_indices)
            stick_to_shard=not self.train,
            initial_fill=max(1, self.shuffle_buffer),
            prefetch_queue_depth=self.prefetch,
            dont_use_mmap=self.dont_use_mmap,
            name=READER,
        )

    def _read(self):
        """(encoded images, labels or keys or label digits, keys or None): the dealt files
        (ORDER; labels, then keys), or the file reader (evaluation on a tree: the index order;
        keys) or the webdataset reader (shards; label digits)."""
        from nvidia.dali import fn

        index = self.index
        if index.kind == "tree":
            assert index.paths is not None
            if self._dealt:
                return self._dealt_read()
            files = index.paths.tolist()
            labels = list(range(len(index)))  # the sample index: every batch's keys
            return *fn.readers.file(files=files, labels=labels, **self._reader_args()), None
        order = np.arange(len(index.shards))
        if self._per_epoch:  # ORDER: this epoch's shard order, the wds backend's
            assert self._built is not None
            order = shard_order(len(index.shards), self.seed, self._built)
        jpegs, cls = fn.readers.webdataset(
            paths=[index.shards[i] for i in order],
            index_paths=[self._index_paths[i] for i in order],
            ext=[";".join(IMAGE_MEMBER_EXTS), LABEL_EXTENSION],
            missing_component_behavior="error",
            **self._reader_args(),
        )
        digits = fn.slice(cls, 0, LABEL_DIGITS, axes=[0], out_of_bounds_policy="trim_to_shape")
        return jpegs, fn.pad(digits, fill_value=0, shape=[LABEL_DIGITS]), None

    def _dealt_read(self):
        """ORDER: the files of this rank's batches, from :class:`DealtFiles`, read by DALI's
        CPU threads (``fn.io.file.read``), with their labels (on the GPU in a GPU pipeline: DALI
        copies them with the batch, so handing a batch over launches nothing for them) and
        their indices as the keys."""
        from nvidia.dali import fn, types

        assert self.index.paths is not None and self._plan is not None
        i = self.info
        source = DealtFiles(
            self.index.paths, len(self.index), i.rank, i.world_size, self.seed,
            self.batch_size, len(self), self._plan, labels=self.index.labels, keys=self._keys_out,
        )  # fmt: skip
        outputs = fn.external_source(
            source=source,
            num_outputs=3 if self._keys_out else 2,
            batch=True,
            batch_info=True,  # the iteration: what a checkpoint restores
            dtype=[types.UINT8, types.INT64, types.INT64][: 3 if self._keys_out else 2],
        )
        paths, labels = outputs[0], outputs[-1]
        keys = outputs[1] if self._keys_out else None
        if self.gpu:
            labels = labels.gpu()
        return fn.io.file.read(paths, dont_use_mmap=self.dont_use_mmap), labels, keys

    def _decode_args(self) -> dict:
        if self.decode != "gpu":
            return {"device": "cpu"}
        return dict(
            device="mixed",
            hw_decoder_load=self.hw_decoder_load,
            preallocate_width_hint=5980,
            preallocate_height_hint=6430,
            device_memory_padding=211_025_920,
            host_memory_padding=140_544_512,
        )

    def _decode(self, jpegs):
        """(images at the output size or larger, mirror flag): train = RandomResizedCrop and a
        random flip; eval = resize the shorter side (:class:`loaders.transforms.TransformSpec`)."""
        from nvidia.dali import fn, types

        size = self.image_size
        if self.train:
            t = self.transform
            images = fn.decoders.image_random_crop(
                jpegs,
                output_type=types.RGB,
                random_area=list(t.scale),
                random_aspect_ratio=list(t.ratio),
                num_attempts=100,
                **self._decode_args(),
            )
            images = fn.resize(
                self._to_resize(images),
                resize_x=size,
                resize_y=size,
                interp_type=types.INTERP_LINEAR,
                antialias=True,
            )
            return images, fn.random.coin_flip(probability=0.5) if t.flip else 0
        images = fn.decoders.image(jpegs, output_type=types.RGB, **self._decode_args())
        images = fn.resize(
            self._to_resize(images),
            resize_shorter=self.transform.eval_resize(size),
            interp_type=types.INTERP_LINEAR,
            antialias=True,
        )
        return images, 0

    def _to_resize(self, images):
        """The decoded images where they are resized (RESIZE ON THE GPU: moved there)."""
        return images.gpu() if self.resize == "gpu" and images.device == "cpu" else images

    def _augment(self, images):
        """YOUR AUGMENTATIONS (``dali_augment``): called while the pipeline is defined, with the
        decoded uint8 HWC RGB images at the output size (train: after the random crop and the
        resize; eval: after the resize and the center crop, made here for it), before the
        random flip and the normalisation; returns DataNodes of the same kind. The nodes are
        on the GPU when DALI decodes there (``device="mixed"``), else on the CPU (``decode="cpu"``
        or no GPU); DALI's ``fn`` operators follow their input's device, and a CPU result is
        moved to the GPU for the normalisation."""
        from nvidia.dali import fn
        from nvidia.dali.data_node import DataNode

        if not self.train:
            size = self.image_size
            images = fn.crop(images, crop=(size, size))  # the center (crop_pos 0.5 by default)
        out = self.dali_augment(images)
        if not isinstance(out, DataNode):
            raise ValueError(
                f"dali_augment must return the images as a DALI DataNode, got {type(out).__name__}"
            )
        return out

    def _normalise(self, images, mirror):
        """Center crop to the output size, flip, mean/std, CHW (HWC: channels_last)."""
        from nvidia.dali import fn, types

        if self.gpu and images.device == "cpu":  # decode="cpu" (or a user's CPU augmentation)
            images = images.gpu()  # uint8, a quarter of the float batch's bytes
        size = self.image_size
        return fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT16 if self.dtype == torch.float16 else types.FLOAT,
            output_layout="HWC" if self.channels_last else "CHW",
            crop=(size, size),
            mean=[m * 255.0 for m in self.transform.mean],
            std=[s * 255.0 for s in self.transform.std],
            mirror=mirror,
        )

    def _source(self, jpegs):
        """Each sample's "shard:member" (shards), padded to a fixed length: its key."""
        from nvidia.dali import fn

        return fn.pad(fn.get_property(jpegs, key="source_info"), fill_value=0, shape=[1024])
