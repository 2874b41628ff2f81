"""Credentials never leave the process: what is shown, written or drawn goes through here.

A URL's password and its query-string signatures and tokens (found by parsing, whatever quotes
a password holds: :mod:`loaders.data.redaction`), and the value of every environment variable
whose name says it is secret (``*SECRET*``, ``*TOKEN*``, ``*PASSWORD*``, ``*KEY*``,
``*CREDENTIAL*``; as written and as percent-encoded in a URL), are replaced by ``***`` in any
text; :func:`scrub` does it to every string of a results object.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, quote_plus

from feedbench.core.files import write_atomic
from loaders.data.redaction import MASK, redact_text

_SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|KEY|CREDENTIAL", re.I)
_MIN_SECRET = 4  # shorter values would mask ordinary words and digits


def secret_values(environ: dict[str, str] | None = None) -> list[str]:
    """Values of the secret-named variables, longest first (so a value inside another is masked
    after it)."""
    env = os.environ if environ is None else environ
    values = {v for k, v in env.items() if _SECRET_NAME.search(k) and len(v) >= _MIN_SECRET}
    values |= {quote(v, safe="") for v in values} | {quote_plus(v) for v in values}  # in URLs
    return sorted(values, key=len, reverse=True)


def scrub_text(text: str, secrets: list[str] | None = None) -> str:
    """``text`` with URL credentials and secret values masked."""
    if not text:
        return text
    out = redact_text(text)
    for value in secret_values() if secrets is None else secrets:
        out = out.replace(value, MASK)
    return out


def scrub(obj: Any, secrets: list[str] | None = None) -> Any:
    """A copy of ``obj`` (dataclasses, dicts, lists, tuples, strings) with every string
    scrubbed; other values as they are."""
    secrets = secret_values() if secrets is None else secrets
    return map_strings(obj, lambda text: scrub_text(text, secrets))


def map_strings(obj: Any, fn: Callable[[str], str], keep: tuple[type, ...] = ()) -> Any:
    """A copy of ``obj`` (dataclasses, dicts, lists, tuples, strings) with ``fn`` applied to
    every string, dict keys included; a string ``fn`` leaves equal stays the very object (a
    ``str`` enum stays an enum). Objects of the types in ``keep`` (ones that hold no strings)
    are taken as they are, not walked: the copy shares them."""
    if isinstance(obj, str):
        new = fn(obj)
        return obj if new == obj else new
    if keep and isinstance(obj, keep):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = dataclasses.fields(obj)
        changes = {f.name: map_strings(getattr(obj, f.name), fn, keep) for f in fields}
        return dataclasses.replace(obj, **changes)
    if isinstance(obj, dict):
        return {map_strings(k, fn, keep): map_strings(v, fn, keep) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_strings(v, fn, keep) for v in obj)
    return obj


def scrub_file(path: str) -> None:
    """Mask credentials in a text file written by another process (a log), in place."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return
    clean = scrub_text(text)
    if clean != text:
        write_atomic(path, clean)
