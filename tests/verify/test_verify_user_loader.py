"""``feedbench verify --loader FILE.py:FUNCTION``: the user's factory trained on beside the
synthetic ceiling. Its batches made (images, labels), its options and its errors are plain
functions tested in this process; one real CPU run (torchrun, gloo) with a torchvision
ImageFolder factory."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from feedbench.core.errors import FeedbenchError
from feedbench.scan.factory import UserCodeError, UserLoaderError
from feedbench.verify import results as verify_results
from feedbench.verify.loaders import UserLoader, file_label, loader_options, parse_loaders
from feedbench.verify.worker.loop import Epochs

FACTORIES = Path(__file__).resolve().parents[1] / "scan" / "factories"

FACTORY = """
import torch

def images_only(batch_size, epoch):  # a generator: one-shot, made anew per epoch
    for _ in range(2):
        yield torch.full((batch_size, 3, 8, 8), 255, dtype=torch.uint8)

def pairs(batch_size, offset=0):
    return [(torch.zeros(batch_size, 3, 8, 8), torch.arange(batch_size) + offset)]

def flat(batch_size):
    return [torch.zeros(batch_size, 8)]

def dicts(batch_size):
    return [{"image": torch.zeros(batch_size, 3, 8, 8)}]

def empty():
    return []

def hollow(batch_size):  # batches of no image: what a loader that skipped everything gives
    return [(torch.zeros(0, 3, 8, 8), torch.zeros(0, dtype=torch.long))] * 12

def needs(path, bucket):
    return []

def broken(batch_size):
    def batches():
        raise ValueError("shard 3 is truncated")
        yield
    return batches()
"""


@pytest.fixture
def factory_file(tmp_path) -> Path:
    src = tmp_path / "verify_factories.py"
    src.write_text(FACTORY)
    return src


def _loader(src: Path, function: str, **options) -> UserLoader:
    return UserLoader(f"{src}:{function}", str(src.parent), 4, rank=0, world_size=1,
                      local_rank=0, workers=0, seed=0, device=torch.device("cpu"),
                      num_classes=10, options=options)  # fmt: skip


def test_images_alone_get_labels_made_up_and_integers_scaled(factory_file):
    loader = _loader(factory_file, "images_only")
    first = list(loader)
    assert len(first) == 2 and loader.synthesised and loader.image_hw == (8, 8)
    images, labels = first[0]
    assert images.dtype == torch.float32 and images.shape == (4, 3, 8, 8)
    assert torch.all(images == 1.0)  # uint8 255 → 1.0
    assert labels.dtype == torch.int64 and labels.shape == (4,)
    assert int(labels.min()) >= 0 and int(labels.max()) < 10
    loader.set_epoch(1)  # a used generator is made anew
    assert len(list(loader)) == 2
    again = _loader(factory_file, "images_only")  # the same seed and rank: the same labels
    assert torch.equal(next(iter(again))[1], labels)
    with pytest.raises(TypeError):
        len(loader)  # a generator has no length: epochs are counted as they end


def test_labels_beyond_the_classes_wrap_and_len_is_the_loaders(factory_file):
    loader = _loader(factory_file, "pairs", offset=8)
    (images, labels), = list(loader)  # fmt: skip
    assert labels.tolist() == [8, 9, 0, 1] and not loader.synthesised and len(loader) == 1


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("flat", r"yields images of shape \(4, 8\): verify trains on N×3×H×W tensors"),
        ("dicts", r"yields dict batches: verify trains on \(images, labels\) or on images alone"),
    ],
)
def test_batches_verify_cannot_train_on_are_named(factory_file, function, message):
    with pytest.raises(UserLoaderError, match=rf"the loader .*:{function} {message}"):
        list(_loader(factory_file, function))


def test_the_users_errors_show_their_frames(factory_file):
    with pytest.raises(UserCodeError) as caught:
        list(_loader(factory_file, "broken"))
    e = caught.value
    assert str(e).endswith(":broken (next()) raised ValueError: shard 3 is truncated")
    assert re.search(r'verify_factories\.py", line \d+, in batches', e.details)
    assert "feedbench" not in e.details.replace(str(factory_file.parent), "")


def test_an_epoch_without_a_batch_stops_the_run(factory_file):
    with pytest.raises(FeedbenchError, match=r":empty: epoch 0 yielded no batch"):
        next(Epochs(_loader(factory_file, "empty")))


def test_options_reach_the_factory_that_takes_them(factory_file):
    pairs, needs = f"{factory_file}:pairs", f"{factory_file}:needs"
    got = loader_options(["offset=3", "torch:prefetch=2"], ["baseline", "torch", pairs])
    assert got == {"torch": {"prefetch": 2}, pairs: {"offset": 3}}
    with pytest.raises(FeedbenchError, match="no loader of this run takes 'seed'"):
        loader_options(["seed=1"], [pairs])  # feedbench passes seed itself
    with pytest.raises(FeedbenchError, match="needs 'bucket': pass --loader-option bucket="):
        loader_options([], [needs])


def test_loader_names_keep_a_factorys_case():
    assert parse_loaders("Baseline, /Data/My.py:make,baseline") == ("baseline", "/Data/My.py:make")
    assert file_label("/Data/My loaders.py:make") == "My-loaders.py-make"


@pytest.mark.parametrize(
    ("loader", "message"),
    [
        ("nowhere/none.py:make", r"--loader nowhere/none\.py:make: no such file"),
        ("fastest", r"unknown loader 'fastest': choose from .*, or give FILE\.py:FUNCTION"),
    ],
)
def test_a_factory_that_does_not_resolve_is_one_line(cli, dataset, tmp_path, loader, message):
    r = cli("verify", str(dataset), "--device", "cpu", "--loader", loader,
            "--json", str(tmp_path / "v.json"))  # fmt: skip
    assert r.code == 2 and re.search(message, r.err) and "Traceback" not in r.err, r.err


def test_a_loader_whose_batches_are_empty_fails_the_run(cli, dataset, factory_file, tmp_path):
    """A rank that trained on no image measured nothing: the run fails (exit 3) and says so,
    rather than being stored as ok with 0 images (a loader without ``skipped`` says no more)."""
    given = f"{factory_file}:hollow"
    out = tmp_path / "v.json"
    r = cli("verify", str(dataset / "images"), "-c", "1", "--loader", given, "--no-synthetic",
            "--device", "cpu", "--steps", "6", "--warmup", "2", "-b", "4", "--workers", "1",
            "--json", str(out), "--no-plots")  # fmt: skip
    assert r.code == 3, r.out + r.err
    (run,) = verify_results.load(out).runs
    assert run.status == "failed" and run.images == 0, (run.status, run.images)
    assert run.error == (f"{given} on 1 process: rank 0 trained on no image in its 6 measured "
                         "steps: every batch it gave was empty"), run.error  # fmt: skip
    assert "Traceback" not in r.err


@pytest.mark.slow
def test_verify_trains_with_an_imagefolder_factory_beside_the_ceiling(cli, dataset, tmp_path):
    given = f"{FACTORIES / 'fb_imagefolder.py'}:make_loader"
    out = tmp_path / "v.json"
    r = cli("verify", str(dataset / "images"), "-c", "1", "--loader", given, "-o",
            "image_size=32", "--image-size", "32", "--device", "cpu", "--steps", "6",
            "--warmup", "2", "-b", "4", "--workers", "1", "--json", str(out),
            "--no-plots")  # fmt: skip
    assert r.code == 0, r.out + r.err
    res = verify_results.load(out)
    assert [(x.loader, x.gpus, x.status) for x in res.runs] == [("synthetic", 1, "ok"),
                                                                (given, 1, "ok")]  # fmt: skip
    assert res.config["loaders"] == ["synthetic", given]
    assert res.config["options_per_loader"] == {given: {"image_size": 32}}
    code = res.config["loader_code"][given]
    assert code["file"] == str(FACTORIES / "fb_imagefolder.py") and len(code["sha256"]) == 64
    assert res.config["sources"][given] == str(dataset / "images")
    (mine,) = [x for x in res.runs if x.loader == given]
    assert mine.steps == 6 and mine.images == 24 and mine.workers == 1
    assert mine.ceiling_fraction == pytest.approx(mine.images_per_s / res.runs[0].images_per_s)
    assert [(s.image_height, s.image_width) for s in mine.ranks] == [(32, 32)]
    assert [s.batches_per_epoch for s in mine.ranks] == [6]  # 24 images, batches of 4
    assert not any(s.labels_synthesised for s in mine.ranks)  # ImageFolder gives labels
    assert not [w for w in res.warnings if given in w]
    (verdict,) = [v for v in res.verdicts if v.loader == given]
    assert verdict.text.startswith(f"{given}: ") and "of the ceiling" in verdict.text
    assert (out.parent / "v-logs" / "fb_imagefolder.py-make_loader-1.log").exists()


def test_notes_on_made_up_labels_and_a_size_unlike_the_ceilings():
    from feedbench.verify.config import Plan
    from feedbench.verify.results import StepSeries, VerifyRun
    from feedbench.verify.run import user_loader_notes

    p = Plan("cpu", "gloo", "CPU process", "smallcnn", 64, 4, 1, 0, ["synthetic", "my.py:make"],
             {}, {}, None)  # fmt: skip
    ranks = [StepSeries(0, labels_synthesised=True, image_height=32, image_width=48),
             StepSeries(1, image_height=32, image_width=48)]  # fmt: skip
    labels, size = user_loader_notes(VerifyRun("my.py:make", 2, 4, 8, ranks=ranks), p, 10)
    assert labels.startswith("my.py:make yields images without labels: verify made them up "
                             "(random, 10 classes)")  # fmt: skip
    assert size.startswith("my.py:make yields 32×48 images, the synthetic ceiling 64×64")
    same = [StepSeries(0, image_height=64, image_width=64)]
    assert user_loader_notes(VerifyRun("my.py:make", 1, 4, 4, ranks=same), p, 10) == []
