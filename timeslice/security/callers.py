"""Who is calling: each call's `Caller`, found once at the server's edge, and the
one check a servicer makes before it acts (`authorize`).

The edge (`timeslice.api.serving`) asks the server's `Authenticator` who the
caller of each call is, from what the call carries:

- a bearer token, in the `authorization` metadata (`Bearer <token>`);
- the subject of its client certificate, when the server verified one (mTLS);
- over a Unix socket, the peer's process and user ids (SO_PEERCRED).

and keeps the answer in `CURRENT` (a context variable) for the call's task. A
servicer then calls `authorize(verb, job=..., group=..., node=...)` before it
changes or shows anything: without an auth policy every caller may do
everything (the services then listen on loopback only, unless told otherwise);
with one, a caller without credentials is UNAUTHENTICATED and one whose role
does not cover the call is PERMISSION_DENIED, each refusal logged with the
principal. Code that calls the servers' methods in-process, not through the
wire, is trusted: its context has the default `Caller`, which is allowed.
"""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final, Protocol

from timeslice.errors import PermissionDeniedError, UnauthenticatedError
from timeslice.logs import decision_fields
from timeslice.security.principals import AuthPolicy, Principal, Role, Verb, check, subject_of

log = logging.getLogger(__name__)

BEARER: Final = "bearer "
# struct ucred of SO_PEERCRED (Linux): pid, uid, gid, each a 32-bit int.
_UCRED: Final = struct.Struct("3i")


@dataclass(frozen=True, kw_only=True)
class Caller:
    """One call's caller, as far as the server could tell."""

    # None: no credentials (or no auth policy).
    principal: Principal | None = None
    # Whether the server has an auth policy: without one, nothing is refused.
    auth_required: bool = False
    # The subject of the client certificate the TLS handshake verified ("" none).
    cert_subject: str = ""
    # Over a Unix socket: the peer process and its user (None over TCP).
    peer_pid: int | None = None
    peer_uid: int | None = None
    # Where the call came from, for logs ("HOST:PORT", or "unix:PATH").
    peer: str = ""

    @property
    def who(self) -> str:
        """The caller, as a log line names it."""
        if self.principal is not None:
            return f"principal {self.principal.name}"
        if self.peer_uid is not None:
            return f"uid {self.peer_uid} (pid {self.peer_pid})"
        return f"anonymous caller {self.peer}".rstrip()

    @property
    def is_operator(self) -> bool:
        """Whether the caller may do anything: an operator principal, or anyone
        when the server has no auth policy."""
        if not self.auth_required:
            return True
        return self.principal is not None and self.principal.role is Role.OPERATOR


CURRENT: ContextVar[Caller] = ContextVar("timeslice_caller", default=Caller())


class Stream(Protocol):
    """What the edge knows of a call (grpclib's server stream has these)."""

    @property
    def metadata(self) -> Mapping[str, Any] | None: ...

    @property
    def peer(self) -> Any: ...


class Authenticator:
    """Finds the `Caller` of a call from its credentials, under an auth policy (or
    none: every caller then passes, unnamed)."""

    def __init__(self, policy: AuthPolicy | None = None, what: str = "the server") -> None:
        self.policy = policy
        self.what = what

    def identify(self, stream: Stream) -> Caller:
        """The call's caller; `UnauthenticatedError` for a token or a certificate
        the policy does not know (no credentials at all is not refused here: what
        an anonymous caller may do is `authorize`'s to say)."""
        peer = stream.peer
        transport = getattr(peer, "_transport", None)
        cert = peer.cert() if peer is not None else None
        subject = subject_of(cert)
        pid, uid, where = _peer_of(transport)
        if self.policy is None:
            return Caller(cert_subject=subject, peer_pid=pid, peer_uid=uid, peer=where)
        principal: Principal | None = None
        token = _bearer_token(stream.metadata)
        if token is not None:
            principal = self.policy.by_token(token)
            if principal is None:
                log.warning(
                    "%s refused a call from %s: unknown token",
                    self.what,
                    where,
                    extra=decision_fields("refused", principal="unknown token", peer=where),
                )
                raise UnauthenticatedError("the token is not known to this server")
        elif subject:
            principal = self.policy.by_subject(subject)
            if principal is None:
                log.warning(
                    "%s refused a call from %s: certificate %s names no principal",
                    self.what,
                    where,
                    subject,
                    extra=decision_fields(
                        "refused", principal=f"certificate {subject}", peer=where
                    ),
                )
                raise UnauthenticatedError(f"the certificate subject {subject} names no principal")
        return Caller(
            principal=principal,
            auth_required=True,
            cert_subject=subject,
            peer_pid=pid,
            peer_uid=uid,
            peer=where,
        )


def authorize(verb: Verb, *, job: str = "", group: str = "", node: str = "") -> Caller:
    """Refuse the current call unless its caller may do `verb` on the job, group and
    node named; return the caller. Refusals are logged with the caller."""
    caller = CURRENT.get()
    if not caller.auth_required:
        return caller
    if caller.principal is None:
        fields = refusal_fields(verb, caller, group=group, job=job, node=node)
        log.warning("refused %s by %s: no credentials", verb, caller.who, extra=fields)
        raise UnauthenticatedError(
            "this server needs credentials: a bearer token or a client certificate"
        )
    try:
        check(caller.principal, verb, job=job, group=group, node=node)
    except PermissionDeniedError as exc:
        fields = refusal_fields(verb, caller, group=group, job=job, node=node)
        log.warning(
            "refused %s by %s from %s: %s", verb, caller.who, caller.peer, exc, extra=fields
        )
        raise
    return caller


def refusal_fields(
    verb: str, caller: Caller, *, group: str = "", job: str = "", node: str = ""
) -> dict[str, Any]:
    """The fields of a refusal's log line: what was refused, of whom, and from where."""
    return decision_fields(
        "refused",
        group=group,
        job=job,
        node=node,
        verb=str(verb),
        principal=caller.who,
        peer=caller.peer,
    )


def operator_fields(
    action: str,
    caller: Caller,
    *,
    group: str = "",
    job: str = "",
    token: int | None = None,
    node: str = "",
    **more: Any,
) -> dict[str, Any]:
    """The fields of an operator action's log line (`action`: force-release, reset-job,
    set-group-nodes), with the principal that took it."""
    return decision_fields(
        "operator",
        group=group,
        job=job,
        token=token,
        node=node,
        action=action,
        principal=caller.who,
        peer=caller.peer,
        **more,
    )


def _bearer_token(metadata: Mapping[str, Any] | None) -> str | None:
    """The bearer token of the call's `authorization` metadata, or None."""
    if not metadata:
        return None
    value = metadata.get("authorization")
    if value is None:
        return None
    if not isinstance(value, str) or not value.lower().startswith(BEARER):
        raise UnauthenticatedError("the authorization metadata must be 'Bearer <token>'")
    return value[len(BEARER) :].strip()


def _peer_of(transport: Any) -> tuple[int | None, int | None, str]:
    """(pid, uid, where) of the connection's peer: pid and uid over a Unix socket
    (SO_PEERCRED), None over TCP."""
    if transport is None:
        return None, None, ""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family == socket.AF_UNIX:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
        pid, uid, _gid = _UCRED.unpack(raw)
        return pid, uid, f"unix:{sock.getsockname() or '?'}"
    name = transport.get_extra_info("peername")
    if isinstance(name, tuple) and len(name) >= 2:
        host, port = name[0], name[1]
        return None, None, f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return None, None, ""
