"""Where bytes come from: an image tree or tar shards on any mounted filesystem.

``detect(path)`` looks at what is there and returns a :class:`Source`; a source lists its units
(files or shards) once and yields :class:`RawSample` records, each read timed on its own.
"""

from feedbench.sources.base import RawSample, Source
from feedbench.sources.detect import IMAGE_EXTENSIONS, detect
from feedbench.sources.local import ShardSource, TreeSource

__all__ = ["IMAGE_EXTENSIONS", "RawSample", "ShardSource", "Source", "TreeSource", "detect"]
