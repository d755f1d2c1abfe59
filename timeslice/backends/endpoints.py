"""Which HTTP servers the `app_endpoint` backend may call: an endpoint's URL,
checked and normalized, and the rule that it be on this node's loopback unless
the agent's configuration allows more.

A job's config names the URLs the agent will call, and the agent reports what
they answer; a caller must not make it call anything on its network. So an
endpoint must be on loopback (127.0.0.0/8, ::1, `localhost`), or start with a
prefix the agent allows (`--app-endpoint-allow http://10.0.0.5:8000`): the same
scheme, host and port, and the prefix's path on a segment boundary. A prefix is
a whole origin, never part of a host name, so `http://vllm.lab:8000` does not
allow `http://vllm.lab.example.com:8000` nor `http://vllm.lab:80001`.

Standard library only: the agent's configuration checks its prefixes with it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from typing import Final
from urllib.parse import urlsplit

from timeslice.errors import InvalidArgumentError, PermissionDeniedError

_HOST_NAME: Final = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_PATH: Final = re.compile(r"^[A-Za-z0-9._~/-]*$")
# At most this many prefixes allowed beyond loopback.
MAX_ALLOWED_PREFIXES: Final = 256


def normalize_endpoint(url: object) -> str:
    """`scheme://host:port[/prefix]`, lower-cased where case does not matter."""
    if not isinstance(url, str) or not url:
        raise InvalidArgumentError(f"endpoint {url!r} is not a URL")
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise InvalidArgumentError(f"endpoint {url!r}: {exc}") from exc
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in ("http", "https"):
        raise InvalidArgumentError(f"endpoint {url!r} must be an http:// or https:// URL")
    if parts.username is not None or parts.password is not None:
        raise InvalidArgumentError(f"endpoint {url!r} must not carry credentials")
    if parts.query or parts.fragment or not _PATH.match(parts.path):
        raise InvalidArgumentError(f"endpoint {url!r} may have a path prefix, no more")
    if not host:
        raise InvalidArgumentError(f"endpoint {url!r} has no host")
    if port is None or port == 0:
        raise InvalidArgumentError(f"endpoint {url!r} needs an explicit port")
    if ":" in host:
        try:
            host = f"[{ipaddress.IPv6Address(host).compressed}]"
        except ValueError as exc:
            raise InvalidArgumentError(f"endpoint {url!r}: bad IPv6 address") from exc
    elif not _HOST_NAME.match(host):
        raise InvalidArgumentError(f"endpoint {url!r}: bad host name {host!r}")
    return f"{scheme}://{host}:{port}{parts.path.rstrip('/')}"


def is_loopback(endpoint: str) -> bool:
    """Whether a normalized endpoint's host is this node's loopback."""
    host = (urlsplit(endpoint).hostname or "").lower()
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def is_allowed(endpoint: str, prefixes: Iterable[str]) -> bool:
    """Whether a normalized endpoint is on loopback or under one of `prefixes`
    (each normalized)."""
    if is_loopback(endpoint):
        return True
    return any(endpoint == p or endpoint.startswith(p + "/") for p in prefixes)


def check_allowed(endpoints: Iterable[str], prefixes: Iterable[str]) -> None:
    """Refuse (PERMISSION_DENIED, one line) the first endpoint that is neither on
    loopback nor under an allowed prefix."""
    allowed = tuple(prefixes)
    for endpoint in endpoints:
        if not is_allowed(endpoint, allowed):
            raise PermissionDeniedError(
                f"endpoint {endpoint} is not on this node's loopback and no"
                " --app-endpoint-allow prefix of the agent allows it"
            )


def normalize_prefixes(prefixes: Iterable[str]) -> tuple[str, ...]:
    """The agent's allowed prefixes, each checked and normalized as an endpoint."""
    normalized = tuple(normalize_endpoint(p) for p in prefixes)
    if len(normalized) > MAX_ALLOWED_PREFIXES:
        raise InvalidArgumentError(f"at most {MAX_ALLOWED_PREFIXES} allowed endpoint prefixes")
    return normalized
