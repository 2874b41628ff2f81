"""The data layer's remote clients: one per process and configuration."""

from __future__ import annotations

from loaders.data import remote


def test_a_new_s3_endpoint_gets_a_new_client(monkeypatch):
    """A process that points AWS_ENDPOINT_URL elsewhere (a notebook, the next test) must not
    keep talking to the old endpoint through a cached client."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    first = remote.filesystem("s3://bucket/key")
    assert remote.filesystem("s3://other/key") is first  # same configuration: reused
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:2")
    second = remote.filesystem("s3://bucket/key")
    assert second is not first
    assert remote.filesystem("http://127.0.0.1:3/x") is remote.filesystem("http://127.0.0.1:4/y")
