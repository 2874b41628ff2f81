"""What a user types, checked: one clear line for anything that is not what a flag takes."""

from __future__ import annotations

import pytest

from feedbench.core.choices import choose, key_value, option_value, parse_counts, parse_names
from feedbench.core.errors import FeedbenchError


def test_counts_are_sorted_and_unique():
    assert parse_counts("4,1,2,2", "--consumers") == (1, 2, 4)
    assert parse_counts(" 8 ", "--consumers") == (8,)


@pytest.mark.parametrize("bad", ["", "0", "0,1", "1,,2", "1,", "a,b", "-1", "1.5"])
def test_bad_counts_name_the_flag(bad):
    with pytest.raises(FeedbenchError, match=r"^--consumers takes"):
        parse_counts(bad, "--consumers")


def test_names_and_choices():
    assert parse_names("Cold, warm,cold", "--passes", ("cold", "warm")) == ("cold", "warm")
    with pytest.raises(FeedbenchError, match=r"--passes takes cold, warm \(got 'hot'\)"):
        parse_names("cold,hot", "--passes", ("cold", "warm"))
    with pytest.raises(FeedbenchError, match="comma-separated"):
        parse_names("cold,,warm", "--passes")
    assert choose(" Warm", ("cold", "warm"), "--passes") == "warm"


def test_key_values_are_typed():
    assert option_value("0.99") == 0.99 and option_value("4") == 4 and option_value("x") == "x"
    assert option_value("true") is True and option_value("off") is False
    assert key_value("bucket_cap_mb=8", "--ddp-option") == ("bucket_cap_mb", 8)
    for bad in ("novalue", "=3"):
        with pytest.raises(FeedbenchError, match="--ddp-option takes KEY=VALUE"):
            key_value(bad, "--ddp-option")
