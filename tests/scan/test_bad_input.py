"""Bad input to scan (and the other commands' shared options): one `error:` line, exit 2, no
traceback, nothing measured."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--consumers", "1,,2"], r"--consumers takes a comma-separated list like 1,2,4,8"),
        (["--consumers", "0"], r"--consumers takes counts ≥ 1"),
        (["--max-consumers", "0", "--find-max", "--rate", "100"], r"--max-consumers must be at"),
        (["--warmup", "100"], r"--warmup 100 leaves nothing to measure: a consumer reads 6 batch"),
        (["--warmup-batches", "100"], r"--warmup 100 leaves nothing to measure"),  # old spelling
        (["--passes", "cold,,warm"], r"--passes takes a comma-separated list"),
        (["--passes", "hot"], r"--passes takes cold, warm \(got 'hot'\)"),
        (["--stages", "read,,decode"], r"--stages takes a comma-separated list"),
        (["--repeat", "0"], r"--repeat must be at least 1"),
        (["--emulate", "nap"], r"--emulate nap: choose auto, gpu or sleep"),
        (["--json", "/proc/self/no/r.json"], r"cannot write results to /proc/self/no/r.json"),
    ],
)
def test_bad_scan_options_are_one_line(cli, dataset, tmp_path, args, message):
    import re

    if "--json" not in args:
        args = [*args, "--json", str(tmp_path / "r.json")]
    r = cli("scan", str(dataset / "images"), "-b", "4", "--no-plots", *args)
    assert r.code == 2, r.out + r.err
    assert re.search(message, r.err), r.err
    assert len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err
    assert not (tmp_path / "r.json").exists()  # nothing was measured


def test_a_profile_with_another_batch_size_shows_the_step_of_that_batch(cli, dataset, tmp_path):
    out = tmp_path / "r.json"
    r = cli("scan", str(dataset / "images"), "-b", "4", "--profile", "resnet50-h200",
            "--no-plots", "--json", str(out))  # fmt: skip
    assert r.code == 0, r.err
    # the device's 4 / 4,700 s is 851 µs, but the host's 30.8 ms a step (the training thread
    # launching the kernels) is the longer: a batch of 4 is not 64× faster than one of 256
    assert "30.8 ms per batch of 4" in " ".join(r.out.split())


def test_verify_into_a_place_it_cannot_write_is_one_line(cli, dataset):
    r = cli("verify", str(dataset), "--json", "/proc/self/no/v.json")
    assert r.code == 2 and r.err.startswith("error: cannot write results to /proc/self/no/v.json")
    assert len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err


def test_outputs_get_the_mode_the_umask_gives(cli, dataset, tmp_path):
    import os
    import stat

    old = os.umask(0o022)
    try:
        out = tmp_path / "r.json"
        r = cli("scan", str(dataset / "images"), "-b", "4", "--json", str(out))
        assert r.code == 0, r.err
    finally:
        os.umask(old)
    written = [out, *tmp_path.glob("r-*.png")]
    assert len(written) >= 2
    for path in written:
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path


def test_profiles_say_where_their_figure_comes_from_inside_the_project():
    from feedbench.scan.profiles import PROFILES

    for p in PROFILES.values():
        assert "../" not in p.source and "BENCHMARKS.md" in p.source
