"""URLs as they may be shown or recorded: no password, no signature or token in the query.

URLs are found and split by hand, not matched by one pattern: a password may hold any
character valid in a URL's userinfo, quotes and parentheses among them (``'`` and ``"`` are
taken unencoded by aiohttp and by users), and a pattern that stops at one shows the rest.
A URL runs from its scheme to the next whitespace; its userinfo ends at the LAST ``@`` before
the path (an unencoded ``@`` in a password is common); every query (and fragment) parameter
whose name says it is secret has its value replaced by ``***``.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

MASK = "***"
# Query names (a substring, any case) whose values are credentials: presigned S3 / GCS URLs
# (X-Amz-Signature, X-Amz-Credential, X-Amz-Security-Token, X-Goog-*), Azure SAS (sig),
# OAuth and API tokens (access_token, api_key), passwords. The one list of them.
SECRET_QUERY_NAMES = (
    "sig", "signature", "token", "secret", "key", "credential", "password", "passwd", "pwd",
    "auth", "session", "x-amz-", "x-goog-",
)  # fmt: skip
_SCHEME = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://")
_WHITESPACE = re.compile(r"\s")
_CLOSING = "'\")]>},;"  # after a URL in a sentence or a repr, not part of its last value


def secret_query_name(name: str) -> bool:
    """Whether a query parameter's name says its value is a credential."""
    low = unquote(name).lower()
    return any(s in low for s in SECRET_QUERY_NAMES)


def _mask_params(text: str) -> str:
    """``a=1&X-Amz-Signature=…`` with the secret values masked, the rest as written."""
    out = []
    for pair in text.split("&"):
        name, eq, _ = pair.partition("=")
        if eq and secret_query_name(name):
            closing = len(pair) - len(pair.rstrip(_CLOSING))
            pair = f"{name}={MASK}{pair[len(pair) - closing :] if closing else ''}"
        out.append(pair)
    return "&".join(out)


def redact_url(url: str) -> str:
    """``url`` (from its scheme to its end) without password and secret query values."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    head_end = min((i for i in (rest.find("?"), rest.find("#")) if i != -1), default=len(rest))
    at = rest.rfind("@", 0, head_end)  # the userinfo's end: the last '@' before any query
    slash = rest.find("/", at + 1, head_end)
    path_at = head_end if slash == -1 else slash
    authority, tail = rest[:path_at], rest[path_at:]
    if at != -1:
        userinfo, host = rest[:at], rest[at + 1 : path_at]
        user, colon, _ = userinfo.partition(":")
        authority = f"{user}:{MASK}@{host}" if colon else authority
    tail, hash_, fragment = tail.partition("#")
    path, q, query = tail.partition("?")
    return f"{scheme}://{authority}{path}{q}{_mask_params(query)}{hash_}{_mask_params(fragment)}"


def redact_text(text: str) -> str:
    """``text`` (an error message, a command line, a path) with every URL in it redacted."""
    out, pos = [], 0
    for m in _SCHEME.finditer(text):
        if m.start() < pos:
            continue  # inside the URL just redacted
        end = _WHITESPACE.search(text, m.end())
        stop = end.start() if end else len(text)
        out += [text[pos : m.start()], redact_url(text[m.start() : stop])]
        pos = stop
    return "".join(out) + text[pos:]


def secret_parts(url: str) -> list[tuple[str, str]]:
    """What :func:`redact_url` masks in ``url``, as (masked, real) pairs that give it back in
    any URL written with the same credentials: ``//user:***@`` for its userinfo, ``name=***``
    for each secret query value. A URL listed from ``url`` (a shard of its brace list, an object
    under its prefix) carries them alike."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return []
    head_end = min((i for i in (rest.find("?"), rest.find("#")) if i != -1), default=len(rest))
    at = rest.rfind("@", 0, head_end)
    pairs = []
    userinfo = rest[:at] if at != -1 else ""  # (as redact_url reads it)
    user, colon, _ = userinfo.partition(":")
    if colon:
        pairs.append((f"//{user}:{MASK}@", f"//{userinfo}@"))
    for pair in re.split("[&?#]", rest[head_end:]):
        name, eq, value = pair.partition("=")
        if eq and secret_query_name(name) and value != MASK:
            pairs.append((f"{name}={MASK}", pair))
    return pairs


def unmask(text: str, pairs: list[tuple[str, str]]) -> str:
    """``text`` with the credentials :func:`secret_parts` found put back where masked."""
    if MASK not in text:
        return text
    for masked, real in pairs:
        text = text.replace(masked, real)
    return text
