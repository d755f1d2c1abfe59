"""Several addresses for one service, and which of them a client tries next.

A client's orchestrator target may list several addresses (`"h1:50051,h2:50051"`)
and each host name may resolve to several: every one is a candidate. A standby
orchestrator refuses calls with UNAVAILABLE and names the active in the trailing
metadata (`ACTIVE_KEY`), with its leader lease (`LEASE_KEY`); the client tries that
one next if it is one of its own candidates, otherwise the next in its list, and
passes over one it gave up on for as long as a standby may name it still
(`shun_seconds`).

Why only its own: the redirect comes from whoever answers on a candidate's
address. Without TLS nothing proves who that is, and a client that followed any
address would send its calls (and its bearer token) wherever that party says.
The list is what the operator configured; the redirect only reorders it. (With
TLS the certificate would still be checked against the name dialled, but the
list rule holds with or without it.)

Pure: parsing and picking, no I/O (the client's `_connector` resolves names and
dials). Standard library and `timeslice.ids` only.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from timeslice.errors import InvalidArgumentError
from timeslice.ids import Target, parse_target

#: Addresses one target may list at most.
MAX_TARGETS: Final = 16
#: The longest target text read (every address with its commas).
MAX_TARGETS_TEXT: Final = 4096
#: Candidates at most once names are resolved (a DNS answer may be long).
MAX_ENDPOINTS: Final = 64
#: The trailing metadata key of a standby's refusal: the active's address.
ACTIVE_KEY: Final = "timeslice-active"
#: The longest value of `ACTIVE_KEY` read (a host name of 253, a port, brackets).
MAX_ACTIVE_TEXT: Final = 300
#: Beside it: the refusing standby's leader lease, in milliseconds. A standby names
#: an active (frozen or not) for at most a lease and a third of it (its reads of the
#: lease row are that far apart) after the active's last renewal, so a client that
#: gave up on the active need not pass it over for longer (`shun_seconds`).
LEASE_KEY: Final = "timeslice-leader-lease-ms"
#: The leases `LEASE_KEY` may name (the orchestrator's own bounds on a leader lease).
MIN_LEASE_MS, MAX_LEASE_MS = 100, 3_600_000


def _shown(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:80] + "...")


def parse_targets(text: str) -> tuple[Target, ...]:
    """Reads one target or several separated by commas, each as `parse_target` reads
    it; duplicates count once. Raises `InvalidArgumentError` for an empty entry,
    more than `MAX_TARGETS` addresses, or a text over `MAX_TARGETS_TEXT`."""
    if len(text) > MAX_TARGETS_TEXT:
        raise InvalidArgumentError(
            f"target {_shown(text)}: longer than {MAX_TARGETS_TEXT} characters"
        )
    parts = [part.strip() for part in text.split(",")]
    if len(parts) > MAX_TARGETS:
        raise InvalidArgumentError(
            f"target {_shown(text)}: {len(parts)} addresses, at most {MAX_TARGETS}"
        )
    if any(not part for part in parts):
        raise InvalidArgumentError(f"target {_shown(text)}: an empty address")
    return tuple(dict.fromkeys(parse_target(part) for part in parts))


def check_targets(text: str) -> str:
    """`text`, if `parse_targets` reads it (for configs that keep the text)."""
    parse_targets(text)
    return text


def format_target(target: Target) -> str:
    """The text `parse_target` reads back as `target`."""
    if target.path is not None:
        return f"unix:{target.path}"
    host = target.host or ""
    return f"[{host}]:{target.port}" if ":" in host else f"{host}:{target.port}"


def is_ip_literal(host: str) -> bool:
    """Whether `host` is an IPv4 or IPv6 address rather than a name to resolve."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_wildcard(host: str) -> bool:
    """Whether a server listening on `host` listens on every address (so that its
    own listening address tells nobody where to reach it)."""
    return host in ("", "0.0.0.0", "::", "*")


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """One candidate: the address dialled (`dial`, a resolved IP or as given) and
    the target it came from (`given`, whose host name TLS checks the certificate
    against)."""

    dial: Target
    given: Target

    def names(self, target: Target) -> bool:
        """Whether `target` names this candidate (its address or its given name)."""
        return target in (self.dial, self.given)


def next_candidate(
    endpoints: Sequence[Endpoint],
    current: int | None,
    redirect: Target | None,
    shunned: Collection[Target] = (),
) -> int:
    """The index of the candidate to try after `current` (None: none tried yet):
    the one `redirect` names if it is in the list, is not `current` and was not
    given up on a moment ago (`shunned`: a standby names the active until its lease
    runs out, also when the active is frozen and this client has just left it),
    otherwise the next one in order (wrapping around) that is not shunned, if any
    is not: a frozen candidate costs a whole ping timeout at each visit."""
    if not endpoints:
        raise ValueError("no candidates")

    def avoided(endpoint: Endpoint) -> bool:
        return endpoint.dial in shunned or endpoint.given in shunned

    if redirect is not None:
        for index, endpoint in enumerate(endpoints):
            if index != current and endpoint.names(redirect) and not avoided(endpoint):
                return index
    start = 0 if current is None else current + 1
    ring = [(start + step) % len(endpoints) for step in range(len(endpoints))]
    return next((i for i in ring if not avoided(endpoints[i])), ring[0])


def lease_from_metadata(values: Iterable[object]) -> float | None:
    """The leader lease, in seconds, from a refusal's `LEASE_KEY` values: the first
    one, if it is a whole number of milliseconds within the leases an orchestrator
    takes; None otherwise."""
    for value in values:
        if not isinstance(value, str) or not value.isascii() or not value.isdigit():
            return None
        if len(value) > 7 or not MIN_LEASE_MS <= int(value) <= MAX_LEASE_MS:
            return None
        return int(value) / 1000
    return None


def shun_seconds(lease: float | None, longest: float) -> float:
    """How long a candidate given up on is passed over when standbys follow a
    leader `lease` (None: not known): as long as a standby may name it after its
    last renewal, at most `longest`."""
    return longest if lease is None else min(longest, lease * 4 / 3)


def active_from_metadata(values: Iterable[object]) -> Target | None:
    """The active's address from a refusal's `ACTIVE_KEY` values: the first one, if it
    is a TCP target (`parse_target`) of at most `MAX_ACTIVE_TEXT` characters; None
    otherwise. A Unix socket is never followed: it would name a path on the client's
    own machine, which a remote server has no business choosing."""
    for value in values:
        if not isinstance(value, str) or len(value) > MAX_ACTIVE_TEXT:
            return None
        try:
            target = parse_target(value)
        except InvalidArgumentError:
            return None
        return target if target.path is None else None
    return None
