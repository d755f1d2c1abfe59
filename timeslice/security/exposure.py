"""Safe by default: a service without TLS and an auth policy listens on loopback only.

Without both, anyone who can reach the port may act as any job, force-release
any group and (on an agent) have any process's memory checkpointed, so a
service refuses a non-loopback host unless told `insecure`, and then says at
every start what it leaves open. The configs call `check_exposure` when they
are made, so that a program embedding an Orchestrator or an Agent is held to
the same rule as `timeslice serve`.

Pure: no I/O.
"""

from __future__ import annotations

import ipaddress

from timeslice.errors import InvalidArgumentError

LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    """Whether `host` can only be reached from this machine: 127.0.0.0/8, ::1 or
    "localhost". Any other name, and "" (every interface), is not."""
    bare = host.strip().strip("[]").lower()
    if bare in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


def open_parts(*, tls: bool, auth: bool) -> list[str]:
    """What a service leaves open: "TLS", "authentication", both or none."""
    return [name for name, present in (("TLS", tls), ("authentication", auth)) if not present]


def check_exposure(what: str, host: str, *, tls: bool, auth: bool, insecure: bool) -> None:
    """Refuse to serve `what` on a non-loopback `host` without both TLS and an auth
    policy, unless `insecure` says to anyway."""
    missing = open_parts(tls=tls, auth=auth)
    if not missing or insecure or is_loopback(host):
        return
    raise InvalidArgumentError(
        f"{what} refuses to listen on {host or 'every interface'} without "
        f"{' and '.join(missing)}: give --tls-cert/--tls-key and --auth FILE,"
        " bind to 127.0.0.1, or accept the risk with --insecure"
    )


def left_open(what: str, address: str, *, host: str, tls: bool, auth: bool) -> str | None:
    """The warning of a service that serves `address` open to the network (None
    when it does not): what anyone who reaches it may do."""
    missing = open_parts(tls=tls, auth=auth)
    if not missing or is_loopback(host):
        return None
    risks = []
    if not auth:
        risks.append(
            "call every RPC as any job, agent or operator (acquire, yield, force release,"
            " reset jobs, register agents and nodes)"
        )
    if not tls:
        risks.append("read and alter every call on the way, tokens included")
    return (
        f"{what} is serving on {address} without {' and without '.join(missing)}"
        f" (--insecure): anyone who can reach it may {'; and '.join(risks)}"
    )
