"""Remote sources: the torch and wds backends over s3:// and http:// on real loopback servers
(rclone, the scan tests' fixtures) read exactly what they read from the same files on disk.

Each case builds rank 0 and rank 1 of a world of 2 (explicit rank and world size, no process
group; rank 0 from the URL, rank 1 from its index pickled, as README suggests for many ranks)
over a URL and over the local folder it serves, and compares every batch of two training
epochs and of evaluation: keys, labels and pixels. That carries the local DDP guarantees (tested
in test_loaders.py) over to the network; the equal lengths, the exact-once evaluation and the new
order of the second epoch are asserted here too.
"""

from __future__ import annotations

import collections
import pickle
import re

import pytest
import torch

from loaders import LoaderError, build_loader, open_index
from tests.scan import conftest as servers

served, s3_env = servers.served, servers.s3_env  # the scan tests' servers, as fixtures here

pytestmark = pytest.mark.net

WORLD = 2
KW = dict(batch_size=4, image_size=16, device="cpu", return_keys=True, seed=3)
# how each case names the remote data: a glob on S3, a brace list or the folder's index page
# on HTTP (a glob there needs index pages too; rclone serves them)
URLS = {
    ("s3", "shards"): "{s3}/shards/*.tar",
    ("http", "shards"): "{http}/shards/shard-{{00000..00003}}.tar",
    ("s3", "images"): "{s3}/images",
    ("http", "images"): "{http}/images/",
}
CASES = [  # (scheme, backend, layout, training workers)
    pytest.param("s3", "wds", "shards", 0, id="s3-wds"),
    # a worker process, which opens its own client after the fork (an S3 one there costs ~1 s
    # more a process: botocore's models; scan's tests fork S3 readers)
    pytest.param("http", "wds", "shards", 1, id="http-wds"),
    pytest.param("s3", "torch", "shards", 0, id="s3-torch-shards"),  # a ranged GET per sample
    pytest.param("http", "torch", "shards", 0, id="http-torch-shards"),
    pytest.param("s3", "torch", "images", 0, id="s3-torch-tree"),  # a GET per object
    pytest.param("http", "torch", "images", 0, id="http-torch-tree"),
]


def _epochs(source, backend: str, rank: int, workers: int) -> list[list[tuple]]:
    """Two training epochs (with ``workers``) and one evaluation epoch (in this process) of
    rank ``rank``: every batch's keys, labels and images."""
    out = []
    for train, epochs in ((True, 2), (False, 1)):
        loader = build_loader(source, backend, rank=rank, world_size=WORLD, train=train,
                              workers=workers if train else 0, **KW)  # fmt: skip
        for _ in range(epochs):
            out.append([(k.tolist(), y.tolist(), x.clone()) for x, y, k in loader])
        loader.close()
    return out


@pytest.mark.parametrize(("scheme", "backend", "layout", "workers"), CASES)
def test_a_url_yields_what_the_local_files_yield_at_world_2(s3_env, scheme, backend, layout,
                                                             workers):  # fmt: skip
    url = URLS[scheme, layout].format(s3=s3_env["s3"], http=s3_env["http"])
    local = s3_env["root"] / layout
    # rank 0 lists the URL itself; rank 1 is given an index listed once and pickled (README)
    sources = [url, pickle.loads(pickle.dumps(open_index(url)))]
    counts, seen = collections.Counter(), set()
    lengths = set()
    for rank in range(WORLD):
        got = _epochs(sources[rank], backend, rank, workers)
        want = _epochs(local, backend, rank, workers)
        assert len(got) == len(want) == 3
        for g, w in zip(got, want, strict=True):
            assert [b[:2] for b in g] == [b[:2] for b in w]  # keys and labels, batch by batch
            assert all(torch.equal(gb[2], wb[2]) for gb, wb in zip(g, w, strict=True))
        first, second, evaluation = ([k for b in epoch for k in b[0]] for epoch in got)
        assert first != second  # a new order each epoch
        lengths.add(len(got[0]))
        seen |= set(first)
        counts.update(evaluation)
    assert len(lengths) == 1  # training: the same number of batches on both ranks
    assert seen == set(range(24))  # training: every sample in the epoch, on one rank or other
    assert counts == collections.Counter(range(24))  # evaluation: every sample exactly once


def test_credentials_in_a_url_never_reach_a_message(tmp_path):
    """A URL's password shows as *** in the error that names it (no server: port 1 refuses)."""
    url = "http://reader:s3cr3t@127.0.0.1:1/data/shard-{0..1}.tar"
    with pytest.raises(LoaderError) as err:
        build_loader(url, "wds", workers=0, device="cpu")
    message = str(err.value)
    assert "s3cr3t" not in message and "reader:***@127.0.0.1:1" in message, message
    assert message == "http://reader:***@127.0.0.1:1/data/shard-0.tar: connection refused"


@pytest.mark.parametrize(
    ("path", "named"),
    [("/data/", "/data/"), ("/x.tar", "/x.tar"), ("/x-{000..003}.tar", "/x-000.tar")],
)
def test_a_dead_endpoint_is_a_loader_error_naming_the_url_and_the_refusal(path, named):
    """Nothing listening on the port: the connection's refusal, not "not a readable tar file"."""
    root = f"http://127.0.0.1:{servers.closed_port()}"
    with pytest.raises(LoaderError) as err:
        build_loader(root + path, "wds", workers=0, device="cpu")
    assert str(err.value) == f"{root}{named}: connection refused"


def test_an_http_error_status_is_a_loader_error_naming_the_url_and_the_status():
    with servers.failing_http(403, "Forbidden") as root, pytest.raises(LoaderError) as err:
        build_loader(root + "/x-{0..1}.tar", "torch", workers=0, device="cpu")
    assert str(err.value) == f"{root}/x-0.tar: HTTP 403 Forbidden"


def test_dali_says_it_reads_local_files(s3_env):
    pytest.importorskip("nvidia.dali", reason="needs NVIDIA DALI (the dali extra)")
    with pytest.raises(LoaderError, match=r"the dali backend reads local files .* use backend"):
        build_loader(s3_env["http"] + "/images/", "dali", workers=1, device="cpu")


def test_a_shard_gone_after_listing_is_counted_and_the_epoch_still_full(s3_env):
    """A shard deleted from the server after the listing: its stream fails, it is counted in
    ``loader.skipped`` with the server's answer, and the rank's other shards fill the epoch."""
    url = s3_env["http"] + "/shards/"
    loader = build_loader(url, "wds", workers=0, train=True, **KW)
    gone = s3_env["root"] / "shards" / "shard-00001.tar"
    saved = gone.read_bytes()
    gone.unlink()
    try:
        keys = [k for _, _, ks in loader for k in ks.tolist()]
    finally:
        gone.write_bytes(saved)
    assert len(keys) == 24  # the epoch's length holds: other shards' samples repeat instead
    assert not {6, 7, 8, 9, 10, 11} & set(keys)  # shard 1's samples
    skips = [s for s in loader.skipped if s.path.endswith("shard-00001.tar")]
    assert skips and len(skips) == len(loader.skipped)  # once per attempt to read it
    assert all(re.fullmatch(r"tar read error: [^\n]+", s.reason) for s in skips), skips[0]
