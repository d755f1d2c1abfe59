"""The checks of every name a caller gives: ids (job, group, node...) and server
addresses. Standard library only: the pure tables, the configs and the clients
all use it."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Final

from timeslice.api.bounds import id_problem
from timeslice.errors import InvalidArgumentError


def check_id(name: str, value: str) -> None:
    """Raise `InvalidArgumentError` unless `value` is a non-empty id (see
    `timeslice.api.bounds`); `name` says which field it is."""
    if not value:
        raise InvalidArgumentError(f"{name} must not be empty")
    if (problem := id_problem(value)) is not None:
        raise InvalidArgumentError(f"{name} {problem}")


_NODE_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")


def check_node(value: str) -> None:
    """A node is named as its agent registers (a host-like name) or by its agent's
    address (HOST:PORT, or unix:PATH)."""
    check_id("node", value)
    if _NODE_NAME.match(value):
        return
    if value != value.strip():
        raise InvalidArgumentError(f"node {value!r} begins or ends with white space")
    try:
        parse_target(value)
    except InvalidArgumentError:
        raise InvalidArgumentError(
            f"node {value!r} is neither a node name (letters, digits, '.', '_', '-')"
            " nor an agent address (HOST:PORT or unix:PATH)"
        ) from None


# A Kubernetes pod's metadata.uid: a UUID, or a static pod's hash (hex digits).
_POD_UID: Final = re.compile(r"[0-9a-f][0-9a-f-]{7,63}\Z")


def check_pod_uid(uid: object) -> str:
    """`uid` if it is a pod's uid (lower-case hex digits and dashes, 8 to 64): it
    becomes part of a cgroup path on the agent, so nothing else may pass."""
    if not isinstance(uid, str) or not _POD_UID.match(uid):
        raise InvalidArgumentError(
            "pod_uid must be a pod's metadata.uid (lower-case hex digits and '-', 8 to 64)"
        )
    return uid


def check_metrics_port(port: int, host: str | None) -> None:
    """A server's metrics port (0: off) and host (None: the server's own)."""
    if not 0 <= port <= 65535:
        raise InvalidArgumentError(f"metrics port {port} is out of range")
    if host is not None and (not host or host != host.strip() or len(host) > 255):
        raise InvalidArgumentError(f"metrics host {host!r} is not a host name or address")


@dataclass(frozen=True)
class Target:
    """Where a server listens: a TCP host and port, or a Unix socket path."""

    host: str | None = None
    port: int | None = None
    path: str | None = None


def parse_target(target: str) -> Target:
    """Reads `"host:port"`, `"[ipv6]:port"` or `"unix:/path"`.

    Raises `InvalidArgumentError` for anything else.
    """
    text = target.strip()
    if text.startswith("unix:"):
        path = text.removeprefix("unix:")
        if path.startswith("//"):
            path = path[2:]
        if not path:
            raise InvalidArgumentError(f"target {target!r}: the Unix socket path is empty")
        return Target(path=path)
    if text.startswith("["):
        inside, bracket, rest = text[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise InvalidArgumentError(f"target {target!r}: expected '[ipv6]:port'")
        try:
            ipaddress.IPv6Address(inside)
        except ValueError:
            raise InvalidArgumentError(
                f"target {target!r}: {inside!r} is not an IPv6 address"
            ) from None
        return Target(host=inside, port=_parse_port(target, rest[1:]))
    host, colon, port = text.rpartition(":")
    if not colon or not host:
        raise InvalidArgumentError(f"target {target!r}: expected 'host:port'")
    if any(c.isspace() or c in "/@?#" for c in host):
        raise InvalidArgumentError(f"target {target!r}: {host!r} is not a host name")
    if ":" in host:
        raise InvalidArgumentError(
            f"target {target!r}: write an IPv6 address in brackets, as '[{host}]:{port}'"
        )
    return Target(host=host, port=_parse_port(target, port))


def _parse_port(target: str, text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise InvalidArgumentError(f"target {target!r}: port {text!r} is not in 1..65535")
    return int(text)
