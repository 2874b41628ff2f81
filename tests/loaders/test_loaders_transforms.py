"""Transform options on every backend: crop scale and ratio, flip, mean/std, eval resize, dtype.

Each test compares a backend's output with itself under other options (the same samples by key),
so it checks what the option does, not one backend's resampling against another's.
"""

from __future__ import annotations

import pytest
import torch

from loaders import build_loader
from loaders.decode import center_crop_box
from tests.loaders.test_loaders import make_tiny

SIZE = 8
BACKENDS = [("torch", "tree"), ("wds", "shards"), ("dali", "tree")]
IDS = [b for b, _ in BACKENDS]
WHOLE = dict(crop_scale=(1.0, 1.0), crop_ratio=(0.01, 100.0))  # no aspect fits: the whole image


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("transforms"), n=16, per_shard=4)


def _images(tiny, backend, kind, epochs=1, **kw) -> list[dict[int, torch.Tensor]]:
    """Per epoch, every sample's output image by key."""
    if backend == "dali":
        pytest.importorskip("nvidia.dali", reason="needs NVIDIA DALI (the dali extra)")
    workers = 1 if backend == "dali" else 0
    loader = build_loader(
        tiny[kind], backend, 8, image_size=SIZE, device="cpu", return_keys=True, seed=1,
        workers=workers, **kw,
    )  # fmt: skip
    out = []
    for _ in range(epochs):
        epoch: dict[int, torch.Tensor] = {}
        for images, _, keys in loader:
            for image, key in zip(images, keys.tolist(), strict=True):
                epoch[key] = image.clone()  # DALI reuses its buffers
        out.append(epoch)
    loader.close()
    return out


@pytest.mark.parametrize(("backend", "kind"), BACKENDS, ids=IDS)
def test_crop_scale_and_ratio(tiny, backend, kind):
    """The default crop changes a lot between epochs; a crop of the whole area hardly (torch,
    wds: not at all; DALI may still shift it by a pixel where an aspect ratio rounds to fit)."""

    def change(epochs) -> float:
        return sum(float((epochs[0][k] - epochs[1][k]).abs().mean()) for k in epochs[0])

    default = change(_images(tiny, backend, kind, epochs=2, flip=False))
    whole = change(_images(tiny, backend, kind, epochs=2, flip=False, **WHOLE))
    assert whole < default / 4
    if backend != "dali":
        assert whole == 0
    with pytest.raises(ValueError, match="crop_scale takes"):
        build_loader(tiny[kind], backend, 8, crop_scale=(0.5, 0.2))


@pytest.mark.parametrize(("backend", "kind"), BACKENDS, ids=IDS)
def test_flip(tiny, backend, kind):
    """With flip, every image is the unflipped one or its mirror, and some are mirrored."""
    plain = _images(tiny, backend, kind, flip=False, **WHOLE)[0]
    flipped = _images(tiny, backend, kind, flip=True, **WHOLE)[0]
    mirrored = 0
    for key, image in flipped.items():
        if torch.equal(image, plain[key].flip(-1)):
            mirrored += 1
        else:
            assert torch.equal(image, plain[key])
    assert 0 < mirrored < len(flipped)


@pytest.mark.parametrize(("backend", "kind"), BACKENDS, ids=IDS)
def test_mean_and_std(tiny, backend, kind):
    """mean 0 and std 1 give pixels on 0…1: the default output, un-normalised."""
    default = _images(tiny, backend, kind, train=False)[0]
    raw = _images(tiny, backend, kind, train=False, mean=(0, 0, 0), std=(1, 1, 1))[0]
    m = torch.tensor((0.485, 0.456, 0.406)).view(3, 1, 1)
    s = torch.tensor((0.229, 0.224, 0.225)).view(3, 1, 1)
    for key, image in raw.items():
        assert image.min() >= 0 and image.max() <= 1
        torch.testing.assert_close(image, default[key] * s + m, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="mean and std take 3 values"):
        build_loader(tiny[kind], backend, 8, std=(1, 0, 1))


@pytest.mark.parametrize(("backend", "kind"), BACKENDS, ids=IDS)
def test_eval_resize_size(tiny, backend, kind):
    """A larger resize before the same center crop shows less of the image: other pixels."""
    default = _images(tiny, backend, kind, train=False)[0]
    closer = _images(tiny, backend, kind, train=False, resize_size=3 * SIZE)[0]
    assert default.keys() == closer.keys()
    assert all(not torch.equal(closer[k], default[k]) for k in default)
    with pytest.raises(ValueError, match="smaller than the output size"):
        build_loader(tiny[kind], backend, 8, image_size=SIZE, resize_size=SIZE - 1)


def test_center_crop_box_follows_the_resize():
    assert center_crop_box(400, 300, 224, 256) == center_crop_box(400, 300, 224)
    assert center_crop_box(400, 300, 224, 224) == (50, 0, 300, 300)  # the whole shorter side
    assert center_crop_box(400, 300, 100, 200) == (125, 75, 150, 150)


@pytest.mark.parametrize(("backend", "kind"), BACKENDS, ids=IDS)
def test_output_dtype(tiny, backend, kind):
    full = _images(tiny, backend, kind, train=False)[0]
    half = _images(tiny, backend, kind, train=False, dtype="bfloat16")[0]
    for key, image in half.items():
        assert image.dtype == torch.bfloat16
        torch.testing.assert_close(image.float(), full[key], atol=0.05, rtol=0.02)
