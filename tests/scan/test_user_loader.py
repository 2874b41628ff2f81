"""The user's own loader: ``feedbench scan --loader FILE.py:FUNCTION`` and ``feedbench.measure``.

The pieces (spec, keywords, options, sample counting, the user's frames) are plain functions
tested in this process; a few scans run real third-party loaders (torchvision, Hugging Face
``datasets``, MosaicML Streaming, LitData) from the factory files in ``factories/``, end to end."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import time
import uuid
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from feedbench.core.errors import FeedbenchError
from feedbench.scan import factory
from feedbench.scan.batches import IoMeter, TrainingLoader, count_samples
from feedbench.scan.factory import UserCodeError, UserLoaderError

FACTORIES = Path(__file__).parent / "factories"
OURS = os.path.join("feedbench", "scan")  # a frame of feedbench's own code


def spec(name: str, function: str = "make_loader") -> str:
    return f"{FACTORIES / name}:{function}"


class _NoLen:
    pass


@pytest.mark.parametrize(
    ("batch", "samples"),
    [
        (torch.zeros(4, 3, 8, 8), 4),
        (np.zeros((5, 2)), 5),
        ((torch.zeros(6, 3), torch.arange(6)), 6),  # (images, labels)
        ([torch.zeros(2, 3), torch.arange(2)], 2),  # default_collate of tuples: a list
        ({"image": torch.zeros(3, 1), "label": torch.arange(3)}, 3),
        ({"text": ["a", "b", "c", "d"], "id": [1, 2, 3, 4]}, 4),  # dict of lists (datasets.iter)
        ({"meta": "x", "x": np.zeros(7)}, 7),  # the first countable value
        ([_NoLen(), _NoLen()], 2),  # a list of uncountable samples (PIL images): its length
        ((["p", "q"], torch.arange(2)), 2),
        (torch.tensor(3.0), None),  # a 0-d tensor
        ("abcd", None),
        ({"a": 1, "b": "x"}, None),
        (_NoLen(), None),
        (range(9), 9),  # anything with len()
    ],
)
def test_samples_are_counted_from_the_batch(batch, samples):
    assert count_samples(batch) == samples


@pytest.mark.parametrize(
    ("text", "value"),
    [("3", 3), ("-2", -2), ("0.5", 0.5), ("1e-3", 1e-3), ("true", True), ("False", False),
     ("resnet", "resnet"), ("", "")],
)  # fmt: skip
def test_loader_option_values_are_typed(text, value):
    got = factory.parse_value(text)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(
    ("items", "message"),
    [(["size"], "give KEY=VALUE"), (["1x=2"], "give KEY=VALUE"), (["a=1", "a=2"], "twice")],
)
def test_bad_loader_options_are_one_clear_error(items, message):
    with pytest.raises(FeedbenchError, match=message):
        factory.parse_options(items)


def test_factory_gets_only_the_keywords_it_takes(tmp_path):
    src = tmp_path / "kw_factory.py"
    src.write_text(
        "def narrow(rank, batch_size, size=1):\n    return [rank, batch_size, size]\n"
        "def wide(path, **kw):\n    return [path, kw]\n"
    )
    standard = dict(rank=1, world_size=2, local_rank=1, batch_size=8, workers=0, seed=0,
                    epoch=0, path="d")  # fmt: skip
    narrow = factory.resolve(f"{src}:narrow")
    factory.check_options(narrow, {"size": 3})
    assert factory.make(narrow, factory.call_kwargs(narrow, standard, {"size": 3})) == [1, 8, 3]
    wide = factory.resolve(f"{src}:wide")
    path, kw = factory.make(wide, factory.call_kwargs(wide, standard, {"extra": True}))
    assert path == "d" and kw == {k: v for k, v in standard.items() if k != "path"} | {
        "extra": True
    }
    assert narrow.describe()["sha256"] == wide.describe()["sha256"]  # one file, one hash
    assert narrow.describe()["function"] == "narrow"


@pytest.mark.parametrize(
    ("given", "options", "message"),
    [
        ("nowhere/none.py:make", {}, r"no such file: nowhere/none\.py"),
        ("fb_unequal.py:absent", {}, r"no 'absent' in .*fb_unequal\.py"),
        ("no_such_module_xyz:make", {}, "no module named 'no_such_module_xyz'"),
        ("ffcv", {}, "unknown loader 'ffcv': choose torch, dali or wds, or give FILE.py"),
        ("fb_unequal.py:make_loader", {"depth": 2}, r"depth: make_loader takes rank, batch_size"),
        ("fb_unequal.py:make_loader", {"rank": 2}, "feedbench passes rank itself"),
        ("fb_hf_parquet.py:make_loader", {}, None),
    ],
)
def test_a_spec_that_does_not_resolve_is_one_clear_error(given, options, message):
    if given.startswith("fb_"):
        given = str(FACTORIES / given)
    if message is None:  # resolves: its options are fine
        factory.check_options(factory.resolve(given), options)
        return
    with pytest.raises(FeedbenchError, match=message):
        factory.check_options(factory.resolve(given), options)


@pytest.mark.parametrize(
    ("loader", "options", "message"),
    [
        ("wds", {"bogus": 1}, "--loader-option bogus: the wds loader takes prefetch, shuffle_buf"),
        (None, {"size": 1}, "--loader-option needs --loader"),
        ("torch", {"decoder": "gpu"}, "--loader-option for torch: decoder takes auto, simplej"),
        ("wds", {"shuffle_buffer": -1}, "shuffle_buffer takes a whole number ≥ 0, not -1"),
        ("dali", {"resize": "cpu"}, "--loader-option for dali: resize takes auto or gpu"),
    ],
)
def test_loader_options_are_checked_before_anything_runs(loader, options, message):
    from feedbench.scan.config import ScanConfig, check

    with pytest.raises(FeedbenchError, match=message):
        check(ScanConfig("unused", loader=loader, loader_options=options))


def test_a_required_keyword_of_the_user_needs_an_option(tmp_path):
    src = tmp_path / "needs_factory.py"
    src.write_text("def make(path, bucket):\n    return []\n")
    with pytest.raises(FeedbenchError, match="make needs 'bucket': pass --loader-option bucket="):
        factory.check_options(factory.resolve(f"{src}:make"), {})


def test_the_users_exception_shows_their_frames_only():
    f = factory.resolve(spec("fb_raising.py"))
    with pytest.raises(UserCodeError) as caught:
        factory.make(f, {"path": "/data/x", "batch_size": 4})
    e = caught.value
    assert str(e).startswith(f"the loader factory {f.spec} raised ValueError: no index.json in")
    assert e.details.count('fb_raising.py"') == 2  # make_loader, then open_index
    assert "open_index" in e.details and OURS not in e.details
    assert e.details.splitlines()[-1] == "ValueError: no index.json in /data/x"


def test_a_factory_returning_nothing_iterable_is_named(tmp_path):
    src = tmp_path / "none_factory.py"
    src.write_text("def make():\n    pass\n")
    f = factory.resolve(f"{src}:make")
    with pytest.raises(UserLoaderError, match=r"none_factory\.py:make returned NoneType, not an"):
        factory.make(f, {})


def test_exit_handlers_run_and_one_that_hangs_is_left(tmp_path):
    """What a consumer of a user loader does before os._exit (in a process of its own: here
    they would be pytest's handlers): the loader's clean-up runs, a hanging one is cut off."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    done = tmp_path / "cleaned"
    code = (
        "import atexit, pathlib, time\n"
        "from feedbench.scan.factory import run_exit_handlers\n"
        "atexit.register(time.sleep, 600)\n"  # runs last (LIFO): joins what never ends
        f"atexit.register(pathlib.Path({str(done)!r}).write_text, 'cleaned')\n"
        "run_exit_handlers(3, timeout_s=1)\n"
    )
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 3, proc.stderr  # the guard's exit, with the code it was given
    assert done.read_text() == "cleaned" and time.monotonic() - t0 < 30


def test_uncountable_batches_are_named():
    loader = TrainingLoader([object()], "my.py:make")
    with pytest.raises(UserLoaderError, match="my.py:make yields batches of type object without"):
        list(loader.batches())


def test_a_one_shot_loader_is_made_anew_per_epoch_and_a_sampler_moved():
    made: list[int] = []

    def remake(epoch):
        made.append(epoch)
        return iter([torch.zeros(2, 1)] * (epoch + 1))

    def samples(loader):  # per batch (a tail of bytes read at the end is no batch)
        return [t.samples for _, t in loader.batches() if t.samples]

    loader = TrainingLoader(remake(0), "gen", remake=remake)
    assert samples(loader) == [2]
    loader.set_epoch(1)
    assert samples(loader) == [2, 2] and made == [0, 1] and loader.yielded == 2

    sampler = torch.utils.data.DistributedSampler(range(4), num_replicas=1, rank=0)
    TrainingLoader(torch.utils.data.DataLoader(range(4), sampler=sampler), "dl").set_epoch(5)
    assert sampler.epoch == 5


def test_io_meter_counts_storage_reads_of_this_process_and_its_children(tmp_path):
    from feedbench.core.proctree import descendants
    from feedbench.scan.cache import evict, file_residency

    data = tmp_path / "blob.bin"
    data.write_bytes(os.urandom(4 << 20))
    evict([str(data)])
    if file_residency(str(data))[0] > 0:
        pytest.skip("this filesystem keeps the file cached after eviction: nothing to read cold")
    meter = IoMeter(every_s=0)
    done_r, done_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()  # a child reads it, as a loader worker would, then waits to be let go
    if pid == 0:
        with open(data, "rb") as f:
            while f.read(1 << 20):
                pass
        os.write(done_w, b"x")
        os.read(go_r, 1)
        os._exit(0)
    os.read(done_r, 1)
    assert pid in descendants(os.getpid())
    meter.t_listed = 0.0  # list the children now, not a second after the last listing
    assert meter.delta() >= 4 << 20  # in the live child's counters
    os.write(go_w, b"x")
    os.waitpid(pid, 0)
    assert meter.delta() == 0  # reaped: its counts moved into ours, not counted twice
    for fd in (done_r, done_w, go_r, go_w):
        os.close(fd)


def test_scan_times_a_torchvision_imagefolder_loader(dataset, cli, tmp_path):
    out = tmp_path / "r.json"
    given = spec("fb_imagefolder.py")
    r = cli("scan", str(dataset / "images"), "--loader", given, "--loader-option",
            "image_size=32", "--consumers", "1,2", "--step-time", "0.01", "-b", "4",
            "--workers", "1", "--json", str(out), "--no-plots")  # fmt: skip
    assert r.code == 0, r.err
    res = json.loads(out.read_text())
    cfg = res["config"]
    assert cfg["loader"] == given and cfg["loader_options"] == {"image_size": 32}
    code = cfg["loader_code"]
    assert code["file"] == str(FACTORIES / "fb_imagefolder.py")
    assert code["function"] == "make_loader"
    assert re.fullmatch("[0-9a-f]{64}", code["sha256"])
    assert [m["consumers"] for m in res["measurements"]] == [1, 2]
    for m in res["measurements"]:
        assert m["samples"] == 24 and m["cache"]["mode"] == "cold"
        if m["cache"]["resident_before"] < 0.05:  # read from the disk: counted in the worker
            assert m["read_bytes"] >= 0.9 * res["dataset"]["bytes"]
        assert [s["name"] for s in m["stages"]] == [f"loader:{given}"]
        per = m["per_consumer"]
        assert {c["loader_batches"] for c in per} == {6 // m["consumers"]}
        assert all(c["au"] is not None for c in per)
    assert res["dataset"]["format"] == "files" and res["dataset"]["files"] == 24
    assert res["verdict"]["bound"] in ("loader", "accelerator", "sync")
    assert f"loader: {given} with image_size=32" in r.out
    assert not any(w.startswith("unequal batches") for w in res["warnings"])


def test_a_raising_factory_shows_the_users_frame_and_exits_2(dataset, cli, tmp_path):
    given = spec("fb_raising.py")
    r = cli("scan", str(dataset / "images"), "--loader", given, "--workers", "0",
            "--json", str(tmp_path / "r.json"), "--no-plots")  # fmt: skip
    assert r.code == 2
    lines = r.err.strip().splitlines()
    assert lines[-1] == (
        f"error: the loader factory {given} raised ValueError: no index.json in "
        f"{dataset / 'images'}"
    )
    assert "Traceback (your code, most recent call last):" in r.err
    assert re.search(r'fb_raising\.py", line \d+, in open_index', r.err)
    assert OURS not in r.err and "Traceback (most recent" not in r.err


def _marked(name: str, mark: str, within_s: float = 5.0) -> list[str]:
    """Live processes other than this one whose environment has ``name=mark`` (waiting up to
    ``within_s`` for those on their way out)."""
    deadline = time.monotonic() + within_s
    while True:
        left = []
        for p in psutil.process_iter(["pid", "name"]):
            with contextlib.suppress(psutil.Error):
                if (p.pid != os.getpid() and p.environ().get(name) == mark
                        and p.status() != psutil.STATUS_ZOMBIE):  # fmt: skip
                    left.append(f"{p.pid} {p.info['name']}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


@pytest.mark.slow
def test_a_hanging_loader_ends_by_the_stall_timeout(dataset, cli, tmp_path, monkeypatch):
    """Its worker delivers 2 batches, then hangs: the scan stops after --stall-timeout, names
    the loader, marks the measurement failed (no rate), exits 3 and leaves no process (the
    consumer, its loader worker) behind."""
    from multiprocessing import resource_tracker

    from feedbench.scan.run import start_consumer_server

    # both serve this whole test session: started unmarked (alone, this test started them)
    resource_tracker.ensure_running()
    start_consumer_server()
    mark = uuid.uuid4().hex
    monkeypatch.setenv("FEEDBENCH_TEST_MARK", mark)  # inherited by every process of the scan
    given, out = spec("fb_hanging.py"), tmp_path / "r.json"
    t0 = time.monotonic()
    r = cli("scan", str(dataset / "images"), "--loader", given, "--loader-option", "after=8",
            "--consumers", "1", "-b", "4", "--workers", "1", "--step-time", "0.01",
            "--stall-timeout", "5", "--json", str(out), "--no-plots")  # fmt: skip
    assert r.code == 3, r.out + r.err
    assert time.monotonic() - t0 < 90  # start-up, 2 batches, 5 s of silence, the stop
    last = r.err.strip().splitlines()[-1]
    said = re.fullmatch(
        rf"error: 1 consumer, cold pass: (stalled: no consumer took a batch from the loader "
        rf"{re.escape(given)} for (\d+) s \(consumer 0 the longest\): the loader, or the "
        rf"storage it reads, hangs \(--stall-timeout 5\))", last)  # fmt: skip
    # the watchdog looks twice a second; on a loaded 2-core host (a fresh-clone CI run at load
    # average 8) it and the consumer's last batch stamp came 4 s late: 9 s said
    assert said and 5 <= int(said[2]) <= 15, r.err
    assert "Traceback" not in r.err
    doc = json.loads(out.read_text())
    assert doc["partial"] and doc["failure"].endswith(said[1])
    (m,) = doc["measurements"]
    assert m["failed"] == said[1] and m["consumers"] == 1 and doc["curve"] == []
    assert not _marked("FEEDBENCH_TEST_MARK", mark), "processes of the scan left behind"


@pytest.mark.slow
def test_consumers_that_hang_after_their_last_measurement_leave_it_whole(dataset, tmp_path):
    """The one consumer writes its measurement, then hangs in its loader's exit handler (for
    good: see fb_hangs_on_exit.py). The watch ends it after --stall-timeout with a warning on the
    count, adds no failed measurement beside the complete one, and the scan goes on to 2
    consumers (which leave cleanly) and ends as done (exit 0): commit 8196260."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    mark = uuid.uuid4().hex
    given, out = spec("fb_hangs_on_exit.py"), tmp_path / "r.json"
    cmd = [sys.executable, "-m", "feedbench", "scan", str(dataset / "images"), "--loader", given,
           "--consumers", "1,2", "-b", "2", "--step-time", "0.01", "--stall-timeout", "1",
           "--json", str(out), "--no-plots"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT), FEEDBENCH_TEST_MARK=mark)
    # ~15 s on a busy 2-core host: start-up, 2 counts, 1 s of silence + the watch's 2 s look at
    # the sockets; a hang the watch missed would run into the timeout
    t0 = time.monotonic()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert time.monotonic() - t0 < 90
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    assert not doc["partial"] and doc["stopped_by"] is None and doc["failure"] is None
    ms = [(m["consumers"], m["pass_name"], m["repeat"], m["failed"]) for m in doc["measurements"]]
    assert ms == [(1, "cold", 1, None), (2, "cold", 1, None)]
    assert all(m["samples"] == 6 * m["consumers"] for m in doc["measurements"])  # 3 batches of 2
    assert [p["consumers"] for p in doc["curve"]] == [1, 2]
    (ended,) = [w for w in doc["warnings"] if "ended by the watch" in w]
    assert re.fullmatch(
        rf"1 consumer: ended by the watch after their last measurement \(stalled: no consumer "
        rf"took a batch from the loader {re.escape(given)} for \d+ s \(consumer 0 the longest\): "
        rf"the loader, or the storage it reads, hangs \(--stall-timeout 1\)\)", ended)  # fmt: skip
    assert f"warning: {ended}" in " ".join(r.stdout.split()), r.stdout  # shown too
    assert "Traceback" not in r.stderr and "error:" not in r.stderr
    assert not _marked("FEEDBENCH_TEST_MARK", mark), "processes of the scan left behind"


def test_unequal_batch_counts_across_ranks_are_named(cli, tmp_path):
    """Through feedbench.measure with a spec and no data path (the page cache left alone)."""
    import feedbench
    from feedbench.core.envelope import save

    r = feedbench.measure(spec("fb_unequal.py"), consumers=2, step_time_s=0.01, batch_size=2,
                          warmup_batches=0)  # fmt: skip
    (m,) = r.measurements
    assert [(c.rank, c.batches, c.loader_batches) for c in m.per_consumer] == [
        (0, 2, 3),  # stopped with its peer (a synced step), then counted to its end
        (1, 2, 2),
    ]
    (warning,) = [w for w in r.warnings if w.startswith("unequal batches")]
    assert "(2 consumers, cold pass): rank 0 3, rank 1 2" in warning and "hang" in warning
    assert m.cache.resident_before is None and r.dataset.files == 0
    assert any(w.startswith("no data path given: the page cache was left") for w in r.warnings)
    save(r, tmp_path / "r.json")
    shown = cli("report", str(tmp_path / "r.json"))
    assert "(loader: 3)" in shown.out and warning in " ".join(shown.out.split())


def test_measure_hf_datasets_over_parquet_from_python(tmp_path, cli, monkeypatch):
    if importlib.util.find_spec("datasets") is None:  # not imported here: only the consumers do
        pytest.skip("Hugging Face datasets is not installed (pip install -e '.[test]')")
    import pyarrow as pa
    import pyarrow.parquet as pq

    import feedbench
    from feedbench.core.envelope import save

    data = tmp_path / "table.parquet"
    pq.write_table(pa.table({"x": np.arange(24), "y": np.random.rand(24)}), data, row_group_size=8)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.syspath_prepend(str(FACTORIES))
    from fb_hf_parquet import make_loader

    result = feedbench.measure(make_loader, data, consumers=2, step_time_s=0.01,
                               batch_size=4, workers=0, options={"columns": "x"})  # fmt: skip
    assert result.config["loader"] == "fb_hf_parquet:make_loader"
    assert result.config["loader_options"] == {"columns": "x"}
    (m,) = result.measurements
    assert (m.consumers, m.samples, m.errors) == (2, 24, 0)
    assert [c.loader_batches for c in m.per_consumer] == [3, 3]  # 12 rows each, batches of 4
    assert result.dataset.files == 1 and result.verdict is not None
    target = tmp_path / "measured.json"
    save(result, target)
    r = cli("report", str(target))
    assert r.code == 0 and "loader: fb_hf_parquet:make_loader with columns='x'" in r.out


def test_measure_names_a_factory_it_cannot_hand_to_consumers():
    import feedbench

    with pytest.raises(FeedbenchError, match="not a module-level function"):
        feedbench.measure(lambda: [], consumers=1)


def _images_and_labels(dataset: Path) -> list[tuple[bytes, int]]:
    """The sample dataset's 24 JPEGs with their class index, in a fixed order."""
    images = sorted((dataset / "images").rglob("*.jpg"))
    classes = sorted({p.parent.name for p in images})
    return [(p.read_bytes(), classes.index(p.parent.name)) for p in images]


def _litdata_item(item: tuple[bytes, int]) -> dict:
    image, label = item
    return {"image": image, "label": label}


def _scan_at_one_and_two(cli, data: Path, given: str, out: Path, samples: int) -> dict:
    """One scan at 1 and 2 consumers, cold then warm, 1 loader worker each, batches of 4; each
    consumer must read only its share: every pass counts the dataset once, whatever the count."""
    r = cli("scan", str(data), "--loader", given, "--loader-option", "shuffle=true",
            "--consumers", "1,2", "--passes", "cold,warm", "--step-time", "0.01", "-b", "4",
            "--workers", "1", "--json", str(out), "--no-plots")  # fmt: skip
    assert r.code == 0, r.err
    res = json.loads(out.read_text())
    cfg = res["config"]
    assert cfg["loader"] == given and cfg["loader_options"] == {"shuffle": True}
    assert cfg["loader_code"]["file"] == given.rpartition(":")[0]
    assert f"loader: {given} with shuffle=True" in r.out
    got = [(m["consumers"], m["pass_name"], m["samples"]) for m in res["measurements"]]
    assert got == [(n, p, samples) for n in (1, 2) for p in ("cold", "warm")]
    for m in res["measurements"]:
        n = m["consumers"]
        assert [c["loader_batches"] for c in m["per_consumer"]] == [samples // 4 // n] * n
        assert not m["failed"] and all(c["au"] is not None for c in m["per_consumer"])
    return res


def _shared_memory() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.mark.slow
def test_scan_mosaicml_streaming_over_a_local_mds_directory(dataset, cli, tmp_path, monkeypatch):
    if importlib.util.find_spec("streaming") is None:
        pytest.skip("MosaicML Streaming is not installed (pip install -e '.[streaming]')")
    from streaming import MDSWriter

    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where Streaming keeps its file locks
    mds = tmp_path / "mds"
    items = _images_and_labels(dataset)
    with MDSWriter(out=str(mds), columns={"image": "bytes", "label": "int"},
                   size_limit=1 << 20) as writer:  # fmt: skip
        for image, label in items:
            writer.write({"image": image, "label": label})
    before = _shared_memory()
    res = _scan_at_one_and_two(cli, mds, spec("fb_mds.py"), tmp_path / "r.json", len(items))
    assert res["dataset"]["files"] == len(list(mds.iterdir())) > 2  # index.json and shards
    # Streaming unlinks its shared memory at exit: the consumers ran their exit handlers
    assert not {n for n in _shared_memory() - before if re.match(r"\d{6}_", n)}


@pytest.mark.slow
def test_scan_litdata_over_an_optimized_local_directory(dataset, cli, tmp_path, monkeypatch):
    if importlib.util.find_spec("litdata") is None:
        pytest.skip("LitData is not installed (pip install -e '.[test]')")
    import litdata

    monkeypatch.setenv("LITDATA_CACHE_DIR", str(tmp_path / "litdata-cache"))
    monkeypatch.setenv("DATA_OPTIMIZER_NUM_WORKERS", "1")  # optimize sets it: restored after
    optimized = tmp_path / "optimized"
    items = _images_and_labels(dataset)
    litdata.optimize(fn=_litdata_item, inputs=items, output_dir=str(optimized), chunk_size=6,
                     num_workers=1, start_method="fork")  # fmt: skip
    res = _scan_at_one_and_two(cli, optimized, spec("fb_litdata.py"), tmp_path / "r.json",
                               len(items))  # fmt: skip
    assert res["dataset"]["files"] == 5  # index.json and 4 chunks of 6


@pytest.mark.parametrize("option", ["decode", "resize"])
def test_dali_on_the_gpu_without_one_is_refused_before_anything_runs(option, monkeypatch):
    """DALI asked to decode or resize on a GPU the machine lacks: one line up front, not every
    consumer failing after the scan started (exit 3, partial results)."""
    pytest.importorskip("nvidia.dali", reason="needs NVIDIA DALI (the dali extra)")
    from feedbench.scan import config as scan_config
    from feedbench.scan.config import ScanConfig, check

    monkeypatch.setattr(scan_config, "_cuda", lambda: False)
    given = ScanConfig("/nonexistent", loader="dali", loader_options={option: "gpu"})
    with pytest.raises(FeedbenchError, match=f"--loader-option {option}=gpu: no CUDA device"):
        check(given)
    monkeypatch.setattr(scan_config, "_cuda", lambda: True)
    check(given)  # with a GPU: nothing to refuse here


def test_torch_decoding_on_the_gpu_without_one_is_refused_before_anything_runs(monkeypatch):
    from feedbench.scan import config as scan_config
    from feedbench.scan.config import ScanConfig, check

    monkeypatch.setattr(scan_config, "_cuda", lambda: False)
    given = ScanConfig("/nonexistent", loader="torch", loader_options={"decode": "gpu"})
    with pytest.raises(FeedbenchError, match="--loader-option decode=gpu: no CUDA device"):
        check(given)
    monkeypatch.setattr(scan_config, "_cuda", lambda: True)
    check(given)


def test_the_wds_loader_scans_a_sample_roots_shards(dataset):
    """On a sample root (images/ and shards/) the format "auto" lists the image tree, which the
    wds loader cannot read (its consumers failed, exit 3): with --loader wds it lists the shards,
    and a tree alone is one line before anything runs."""
    from feedbench.scan.config import ScanConfig
    from feedbench.scan.run import validate

    config = ScanConfig(str(dataset), loader="wds")
    source, _notes, _plan = validate(config)
    assert source.kind == "shards" and config.fmt == "shards"
    assert validate(ScanConfig(str(dataset), loader="torch"))[0].kind == "tree"
    with pytest.raises(FeedbenchError, match=r"format 'shards': no \.tar shards in .*images"):
        validate(ScanConfig(str(dataset / "images"), loader="wds"))
