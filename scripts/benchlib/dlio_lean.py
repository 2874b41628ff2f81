"""DLIO 2.0.0 without its per-sample debug formatting, then its usual entry (run by DLIO's Python,
under mpirun, with DLIO's hydra arguments; ``DFTRACER_ENABLE=0`` in the environment turns its
tracer off). Nothing else changes: the loader, reader, sampler, step and statistics are DLIO's.

Replaced, each by the same code without its ``logging.debug(f"...")`` lines (Python formats an
f-string before ``logging.debug`` sees that debug is off):

* ``FormatReader.read_index`` (reader/reader_handler.py): ``f"{self.global_index_map}"``, the
  whole sample→file map per sample, and ``f"{utcnow()} read_index {filename}, {sample_index}"``;
* ``TorchDataset.__getitem__`` (data_loader/torch_data_loader.py):
  ``f"{utcnow()} Rank {DLIOMPI.get_instance().rank()} reading {image_idx} sample"``.

The loader workers are forked (DLIO's default ``multiprocessing_context``), so they inherit this.
"""

import math

from dlio_benchmark.common.enumerations import ReadType
from dlio_benchmark.data_loader import torch_data_loader as tdl
from dlio_benchmark.reader import reader_handler as rh


def read_index(self, global_sample_idx, step):
    self.step = step
    self.image_idx = global_sample_idx
    filename, sample_index = self.global_index_map[global_sample_idx]
    rh.FormatReader.read_images += 1
    on_demand = self._args.read_type is ReadType.ON_DEMAND
    if on_demand or filename not in self.open_file_map or self.open_file_map[filename] is None:
        self.open_file_map[filename] = self.open(filename)
    self.get_sample(filename, sample_index)
    self.preprocess()
    if on_demand:
        self.close(filename)
        self.open_file_map[filename] = None
    return self._args.resized_image


@tdl.dlp.log
def getitem(self, image_idx):
    self.num_images_read += 1
    step = int(math.ceil(self.num_images_read / self.batch_size))
    tdl.dlp.update(step=step)
    return self.reader.read_index(image_idx, step)


rh.FormatReader.read_index = read_index
tdl.TorchDataset.__getitem__ = getitem

if __name__ == "__main__":
    from dlio_benchmark.main import main

    main()
