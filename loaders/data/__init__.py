"""The data layer: where samples are, and reading them. Used by the loader backends and by
feedbench's scan alike, so both see the same samples.

* :mod:`~loaders.data.formats`: what an image, a label and a shard are (extensions, member keys);
* :mod:`~loaders.data.patterns`: brace lists and globs, for paths and URLs;
* :mod:`~loaders.data.remote`: ``s3://`` and ``http(s)://`` through fsspec, with timeouts and
  credentials kept out of anything shown;
* :mod:`~loaders.data.layout`: what is at a path or URL (tree, shards or data files), listed once;
* :mod:`~loaders.data.readers` and :mod:`~loaders.data.tar`: timed reads and THE tar reader;
* :mod:`~loaders.data.records` and :mod:`~loaders.data.tfrecord`: data files that are not
  images (raw files, npy/npz, TFRecord): their sample table, bounded reads, decode;
* :mod:`~loaders.data.index`: the sample index the backends read.

A new source format goes here: a layout kind in ``layout``, its reader beside ``tar``.
"""

from loaders.data.formats import IMAGE_EXTENSIONS, is_image, is_shard, split_member_name
from loaders.data.index import SampleIndex, StringTable, open_index
from loaders.data.layout import FORMATS, Layout, Skipped, locate, locate_files
from loaders.data.patterns import expand, has_pattern
from loaders.data.readers import FileReader, read_file
from loaders.data.records import RECORD_FORMATS, RecordTable
from loaders.data.remote import StreamReader, is_url, redact_url
from loaders.data.tar import RawSample, TarFormatError, iter_shard

__all__ = [
    "FORMATS",
    "IMAGE_EXTENSIONS",
    "FileReader",
    "Layout",
    "RECORD_FORMATS",
    "RawSample",
    "RecordTable",
    "SampleIndex",
    "Skipped",
    "StreamReader",
    "StringTable",
    "TarFormatError",
    "expand",
    "has_pattern",
    "is_image",
    "is_shard",
    "is_url",
    "iter_shard",
    "locate",
    "locate_files",
    "open_index",
    "read_file",
    "redact_url",
    "split_member_name",
]
