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
