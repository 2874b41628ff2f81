"""Your own transforms: ``batch_transform`` on uint8 batches (torch, wds) and ``dali_augment``
inside the DALI pipeline, each checked by what it does to the pixels of every batch."""

from __future__ import annotations

import pytest
import torch

from loaders import build_loader, denormalize
from tests.loaders.test_loaders import make_tiny

SIZE = 8
BATCH = 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("custom"), n=12, per_shard=3)


class Invert:
    """A batch transform that counts its calls (module level: picklable, were it ever sent to a
    worker; it is not, it runs in the training process)."""

    def __init__(self) -> None:
        self.calls = 0
        self.shapes: list[tuple[int, ...]] = []

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.shapes.append(tuple(images.shape))
        assert images.dtype == torch.uint8
        return 255 - images


def to_float(images: torch.Tensor) -> torch.Tensor:
    return images.float()


def _by_key(tiny, backend, kind, workers=0, **kw) -> tuple[dict[int, torch.Tensor], int]:
    loader = build_loader(
        tiny[kind], backend, BATCH, image_size=SIZE, device="cpu", train=False, workers=workers,
        return_keys=True, **kw,
    )  # fmt: skip
    out = {}
    for images, _, keys in loader:
        out.update(zip(keys.tolist(), images.clone(), strict=True))
    batches = len(loader)
    loader.close()
    return out, batches


@pytest.mark.parametrize(("backend", "kind"), [("torch", "tree"), ("wds", "shards")])
def test_batch_transform_runs_on_every_uint8_batch(tiny, backend, kind):
    """The callable sees every batch as uint8 N×3×H×W; its output is normalised, or (with
    normalize=False) yielded as it is. Loaders with a worker process: it runs in this one."""
    plain, _ = _by_key(tiny, backend, kind, normalize=False)
    assert all(v.dtype == torch.uint8 and v.shape == (3, SIZE, SIZE) for v in plain.values())
    invert = Invert()
    raw, batches = _by_key(tiny, backend, kind, workers=1, batch_transform=invert,
                           normalize=False)  # fmt: skip
    assert invert.calls == batches and raw.keys() == plain.keys() and len(plain) == 12
    assert {s[1:] for s in invert.shapes} == {(3, SIZE, SIZE)}
    assert all(torch.equal(raw[k], 255 - plain[k]) for k in plain)
    normed, _ = _by_key(tiny, backend, kind, workers=1, batch_transform=Invert())
    for k, image in normed.items():
        assert image.dtype == torch.float32
        back = denormalize(image[None])[0]
        torch.testing.assert_close(back, (255 - plain[k]).float(), atol=1e-3, rtol=0)
    with pytest.raises(ValueError, match="must return a uint8 N×3×H×W tensor"):
        _by_key(tiny, backend, kind, batch_transform=to_float)
    floats, _ = _by_key(tiny, backend, kind, batch_transform=to_float, normalize=False)
    assert all(torch.equal(floats[k], plain[k].float()) for k in plain)


def mirror(images):
    from nvidia.dali import fn

    return fn.flip(images, horizontal=1)


def darken(images):
    from nvidia.dali import fn

    return fn.brightness(images, brightness=0.0)


def test_dali_augment_runs_inside_a_real_cpu_pipeline(tiny):
    """A user's DALI operators, added through ``dali_augment``, change every image: a mirror
    in evaluation (after the center crop: exactly the plain output flipped), zero brightness in
    training (every pixel black: normalised to −mean/std). Other backends refuse the option."""
    pytest.importorskip("nvidia.dali", reason="needs NVIDIA DALI (the dali extra)")
    plain, _ = _by_key(tiny, "dali", "tree", workers=1)
    flipped, _ = _by_key(tiny, "dali", "tree", workers=1, dali_augment=mirror)
    assert flipped.keys() == plain.keys() and len(plain) == 12
    assert all(torch.equal(flipped[k], plain[k].flip(-1)) for k in plain)
    assert not all(torch.equal(flipped[k], plain[k]) for k in plain)
    loader = build_loader(tiny["shards"], "dali", BATCH, image_size=SIZE, device="cpu", workers=1,
                          dali_augment=darken)  # fmt: skip
    black = denormalize(next(iter(loader))[0])
    assert black.abs().max() < 1e-3
    loader.close()
    with pytest.raises(ValueError, match="must return the images as a DALI DataNode"):
        _by_key(tiny, "dali", "tree", workers=1, dali_augment=lambda images: None)
    with pytest.raises(ValueError, match="takes no option 'dali_augment'"):
        build_loader(tiny["tree"], "torch", BATCH, dali_augment=mirror)
    with pytest.raises(ValueError, match="takes no option 'batch_transform'"):
        build_loader(tiny["tree"], "dali", BATCH, batch_transform=Invert())
