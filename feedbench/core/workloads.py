"""MLPerf-Storage-shaped workloads: the data each one reads and what each accelerator asks of it.

A :class:`Shape` is the dataset (format, samples per file, sample size and its spread), what
``feedbench sample --workload`` writes; a :class:`Row` is one workload on one accelerator (batch,
read threads, step time, AU threshold), what ``feedbench scan --workload --accelerator`` takes.
Every figure cites where it comes from. DLIO's configs live in the ``argonne-lcf/dlio_benchmark``
repository under ``dlio_benchmark/configs/workload/``; a commit is named where its versions
differ. Rows for other accelerators come only from our own measurements.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from feedbench.core.errors import FeedbenchError

DLIO = "DLIO dlio_benchmark/configs/workload/"


@dataclass(frozen=True)
class Shape:
    name: str
    fmt: str  # a record format of loaders.data.records
    samples_per_file: int
    sample_bytes: float  # mean
    sample_bytes_std: float
    source: str


@dataclass(frozen=True)
class Row:
    workload: str
    accelerator: str  # short name, as --accelerator takes it
    accelerator_name: str
    batch_size: int
    read_threads: int  # DLIO's reader.read_threads: loader workers per rank
    step_s: float  # emulated compute per batch (DLIO's train.computation_time)
    target_au: float
    source: str

    def as_dict(self) -> dict:
        return asdict(self)


SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape("resnet50", "tfrecord", 1251, 114660.07, 136075.82,
              DLIO + "resnet50_h100.yaml (dataset: 1,251 samples per file, record_length "
              "114660.07, record_length_std 136075.82, format tfrecord; commit 499a4dc)"),
        Shape("unet3d", "npz", 1, 146600628, 68341808,
              DLIO + "unet3d_h100.yaml and unet3d_a100.yaml (dataset: npz, 1 sample per file, "
              "record_length_bytes 146600628, record_length_bytes_stdev 68341808)"),
        Shape("cosmoflow", "tfrecord", 1, 2828486, 71311,
              DLIO + "cosmoflow_h100.yaml and cosmoflow_a100.yaml (dataset: tfrecord, 1 sample "
              "per file, record_length 2828486, record_length_stdev 71311)"),
    )
}  # fmt: skip

_MLPERF_AU = "AU threshold from MLPerf Storage's rules (the DLIO config names none)"

ROWS: list[Row] = [
    Row("resnet50", "h100", "NVIDIA H100", 64, 8, 0.103, 0.90,
        DLIO + f"resnet50_h100.yaml (batch_size 64, read_threads 8, computation_time 0.103; "
        f"commit 499a4dc); {_MLPERF_AU}"),
    Row("resnet50", "a100", "NVIDIA A100", 64, 8, 0.151, 0.90,
        DLIO + f"resnet50_a100.yaml (batch_size 64, read_threads 8, computation_time 0.151; "
        f"commit 6027937, whose dataset is png files: the data here is the h100 config's); "
        f"{_MLPERF_AU}"),
    Row("resnet50", "h200", "NVIDIA H200", 256, 8, 256 / 4700.0, 0.90,
        "our measurement: profile resnet50-h200 (4,700 img/s at batch 256, bf16, one H200; "
        "feedbench/scan/profiles.py); read threads as DLIO's resnet50 rows"),
    Row("unet3d", "h100", "NVIDIA H100", 7, 4, 0.323, 0.90,
        DLIO + "unet3d_h100.yaml (batch_size 7, read_threads 4, computation_time 0.323, "
        "metric au 0.90)"),
    Row("unet3d", "a100", "NVIDIA A100", 7, 4, 0.636, 0.90,
        DLIO + "unet3d_a100.yaml (batch_size 7, read_threads 4, computation_time 0.636, "
        "metric au 0.90)"),
    Row("cosmoflow", "h100", "NVIDIA H100", 1, 4, 0.0035, 0.70,
        DLIO + f"cosmoflow_h100.yaml (batch_size 1, read_threads 4, computation_time 0.00350); "
        f"{_MLPERF_AU}"),
    Row("cosmoflow", "a100", "NVIDIA A100", 1, 4, 0.00551, 0.70,
        DLIO + f"cosmoflow_a100.yaml (batch_size 1, read_threads 4, computation_time 0.00551); "
        f"{_MLPERF_AU}"),
]  # fmt: skip

MIN_SAMPLES = 32  # `feedbench sample --workload` writes at least this many, however small --size
DEFAULT_ACCELERATOR = "h100"  # the MLPerf Storage reference accelerator of every workload


def get_shape(name: str) -> Shape:
    try:
        return SHAPES[name.lower()]
    except KeyError:
        raise FeedbenchError(
            f"unknown workload {name!r}: choose one of {', '.join(SHAPES)} (--list-workloads)"
        ) from None


def get_row(workload: str, accelerator: str | None = None) -> Row:
    """The row of ``workload`` on ``accelerator`` (default: h100)."""
    shape = get_shape(workload)
    acc = (accelerator or DEFAULT_ACCELERATOR).lower()
    rows = [r for r in ROWS if r.workload == shape.name]
    for r in rows:
        if r.accelerator == acc:
            return r
    raise FeedbenchError(
        f"no {acc} row for workload {shape.name}: choose --accelerator "
        f"{' or '.join(r.accelerator for r in rows)} (--list-workloads)"
    )
