"""Each call's caller, found at the edge from its token, certificate or socket peer,
and `authorize`: nothing refused without an auth policy; with one, no credentials
is UNAUTHENTICATED and a role that does not cover the call PERMISSION_DENIED,
each refusal logged with the caller."""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

import pytest

from timeslice.errors import Code, PermissionDeniedError, UnauthenticatedError
from timeslice.security.callers import CURRENT, Authenticator, Caller, authorize
from timeslice.security.principals import AuthPolicy, Principal, Role, Verb, token_sha256

JOB = Principal(
    name="trainer-a",
    role=Role.JOB,
    token_sha256=token_sha256("s3cret"),
    jobs=("trainer-a",),
    groups=("g",),
)
AGENT = Principal(name="gpu-1", role=Role.AGENT, cert_subject="CN=gpu-1", nodes=("gpu-1",))
POLICY = AuthPolicy((JOB, AGENT))


class Transport:
    def __init__(self, sock: socket.socket | None = None, peer: Any = ("10.0.0.9", 4242)) -> None:
        self.sock, self.peer = sock, peer

    def get_extra_info(self, name: str) -> Any:
        return {"socket": self.sock, "peername": self.peer}.get(name)


class Peer:
    def __init__(self, cert: dict[str, Any] | None = None, transport: Transport | None = None):
        self._cert, self._transport = cert, transport or Transport()

    def cert(self) -> dict[str, Any] | None:
        return self._cert


class Stream:
    def __init__(self, metadata: dict[str, str] | None = None, peer: Peer | None = None) -> None:
        self.metadata, self.peer = metadata, peer or Peer()


def test_without_a_policy_every_caller_passes_unnamed(as_caller: Any) -> None:
    caller = Authenticator(None).identify(Stream({"authorization": "Bearer whatever"}))
    assert caller.principal is None and not caller.auth_required and caller.is_operator
    assert caller.peer == "10.0.0.9:4242"
    as_caller(caller)
    authorize(Verb.FORCE_RELEASE, group="g")  # nothing refused


def test_in_process_calls_are_trusted() -> None:
    assert CURRENT.get() == Caller()
    authorize(Verb.SWITCH, group="g", job="anyone")


def test_a_token_names_its_principal_and_an_unknown_one_is_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    auth = Authenticator(POLICY, "the orchestrator")
    caller = auth.identify(Stream({"authorization": "Bearer s3cret"}))
    assert caller.principal is JOB and caller.auth_required
    with caplog.at_level(logging.WARNING), pytest.raises(UnauthenticatedError) as refused:
        auth.identify(Stream({"authorization": "Bearer guess"}))
    assert refused.value.code is Code.UNAUTHENTICATED
    assert "guess" not in str(refused.value) and "guess" not in caplog.text
    assert "unknown token" in caplog.text and "10.0.0.9:4242" in caplog.text
    with pytest.raises(UnauthenticatedError, match="Bearer <token>"):
        auth.identify(Stream({"authorization": "Basic czNjcmV0"}))


def test_a_verified_certificate_names_its_principal() -> None:
    auth = Authenticator(POLICY)
    cert = {"subject": ((("commonName", "gpu-1"),),)}
    assert auth.identify(Stream(peer=Peer(cert))).principal is AGENT
    with pytest.raises(UnauthenticatedError, match="CN=gpu-2 names no principal"):
        auth.identify(Stream(peer=Peer({"subject": ((("commonName", "gpu-2"),),)})))


def test_no_credentials_is_unauthenticated_and_logged(
    as_caller: Any, caplog: pytest.LogCaptureFixture
) -> None:
    as_caller(Authenticator(POLICY).identify(Stream()))
    with caplog.at_level(logging.WARNING), pytest.raises(UnauthenticatedError):
        authorize(Verb.ACQUIRE, job="trainer-a", group="g")
    assert "no credentials" in caplog.text


def test_a_role_that_does_not_cover_the_call_is_denied_and_logged(
    as_caller: Any, caplog: pytest.LogCaptureFixture
) -> None:
    as_caller(Authenticator(POLICY).identify(Stream({"authorization": "Bearer s3cret"})))
    assert authorize(Verb.ACQUIRE, job="trainer-a", group="g").principal is JOB
    with caplog.at_level(logging.WARNING), pytest.raises(PermissionDeniedError):
        authorize(Verb.YIELD, job="alice", group="g")
    assert "principal trainer-a" in caplog.text and "alice" in caplog.text
    with pytest.raises(PermissionDeniedError):
        authorize(Verb.FORCE_RELEASE, group="g")


def test_over_a_unix_socket_the_peer_process_and_user_are_known(tmp_path: Any) -> None:
    server, client = socket.socketpair(socket.AF_UNIX)
    with server, client:
        caller = Authenticator(POLICY).identify(Stream(peer=Peer(transport=Transport(server))))
    assert (caller.peer_pid, caller.peer_uid) == (os.getpid(), os.getuid())
    assert caller.principal is None and caller.who.startswith(f"uid {os.getuid()}")
