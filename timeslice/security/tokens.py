"""New bearer tokens, and the auth file entry of the principal that holds one
(`timeslice auth add-token`).

A token is 32 random bytes, URL-safe base64 (43 characters): long enough that
guessing one is hopeless, short enough for an environment variable. The auth
file keeps only its SHA-256, so the token itself is shown once, to whoever made
it, and never again. The entry is built as TOML text and parsed back by the
same code that reads an auth file, so that what is printed is what the server
will accept.
"""

from __future__ import annotations

import json
import secrets
import tomllib
from collections.abc import Sequence
from typing import Final

from timeslice.errors import InvalidArgumentError
from timeslice.security.principals import Principal, Role, parse_auth, token_sha256

TOKEN_BYTES: Final = 32


def new_token() -> str:
    """A new random bearer token."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def principal_entry(
    name: str,
    role: Role | str,
    token: str,
    *,
    jobs: Sequence[str] = (),
    groups: Sequence[str] = (),
    nodes: Sequence[str] = (),
    uids: Sequence[int] = (),
) -> tuple[str, Principal]:
    """The `[[principal]]` lines of an auth file for the principal `name` with
    `role` and the patterns given, identified by `token` (its SHA-256 only), and
    the principal they read as; InvalidArgumentError, as an auth file would be
    refused, for an entry the server would not accept."""
    lines = [
        "[[principal]]",
        f"name = {_string(name)}",
        f"role = {_string(str(role))}",
        f'token_sha256 = "{token_sha256(token)}"',
    ]
    for key, values in (("jobs", jobs), ("groups", groups), ("nodes", nodes)):
        if values:
            lines.append(f"{key} = [{', '.join(_string(v) for v in values)}]")
    if uids:
        lines.append(f"uids = [{', '.join(str(int(uid)) for uid in uids)}]")
    text = "\n".join(lines) + "\n"
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        raise InvalidArgumentError(
            "a name or pattern holds characters an auth file cannot (control characters)"
        ) from None
    [principal] = parse_auth(data, "the new entry").principals
    return text, principal


def _string(value: str) -> str:
    # A JSON string is a TOML basic string (the same escapes, \uXXXX included).
    return json.dumps(value, ensure_ascii=False)
