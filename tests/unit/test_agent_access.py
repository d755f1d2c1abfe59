"""Whom the agent acts for (`timeslice.agent.access`): the orchestrator's commands
only from an operator and never over the Unix socket; local callers known by
their uid; `cuda` pids only of the caller's own user; workload channels bound
to their owner."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import Any

import pytest

from timeslice.agent.access import (
    authorize_call,
    check_pids,
    is_trusted,
    may_replace_any,
    owner_of,
    process_uids,
    registrant,
)
from timeslice.agent.channels import Capabilities, WorkloadChannel, WorkloadChannels
from timeslice.agent.events import JobState
from timeslice.errors import NotFoundError, PermissionDeniedError, UnauthenticatedError
from timeslice.security.callers import Caller
from timeslice.security.principals import AuthPolicy, Principal, Role, Verb

JOB = Principal(name="trainer-a", role=Role.JOB, token_sha256="0" * 64, jobs=("a",), groups=("g",))
OPERATOR = Principal(name="orchestrator", role=Role.OPERATOR, token_sha256="1" * 64)

ANONYMOUS_TCP = Caller(peer="127.0.0.1:5000")  # an agent without an auth policy
LOCAL_OTHER = Caller(peer_uid=54321, peer_pid=4242, peer="unix:/run/a.sock")
LOCAL_ROOT = Caller(peer_uid=0, peer_pid=1234, peer="unix:/run/a.sock")
LOCAL_OTHER_AUTH = Caller(auth_required=True, peer_uid=54321, peer_pid=4242)
JOB_TCP = Caller(principal=JOB, auth_required=True, peer="10.0.0.9:4000")
OPERATOR_TCP = Caller(principal=OPERATOR, auth_required=True, peer="10.0.0.1:4000")
NOBODY_TCP = Caller(auth_required=True, peer="10.0.0.9:4000")

# pid -> (real, effective, saved, fs) uids
PROCESSES = {100: (54321,) * 4, 200: (2000,) * 4, 300: (54321, 0, 0, 0), 400: (0,) * 4}


def uids_of(pid: int) -> tuple[int, ...] | None:
    return PROCESSES.get(pid)


# --- the orchestrator's commands -------------------------------------------------------


@pytest.mark.parametrize("verb", [Verb.SWITCH, Verb.RESET_JOB])
def test_the_orchestrators_commands_come_only_from_an_operator(as_caller: Any, verb: Verb) -> None:
    as_caller(OPERATOR_TCP)
    assert authorize_call(verb, group="g") is OPERATOR_TCP
    as_caller(ANONYMOUS_TCP)  # no auth policy: TCP on loopback is trusted
    assert authorize_call(verb, group="g") is ANONYMOUS_TCP
    as_caller(JOB_TCP)
    with pytest.raises(PermissionDeniedError, match="trainer-a"):
        authorize_call(verb, job="a", group="g")
    as_caller(NOBODY_TCP)
    with pytest.raises(UnauthenticatedError):
        authorize_call(verb, group="g")


@pytest.mark.parametrize(
    "caller", [LOCAL_OTHER, LOCAL_OTHER_AUTH, Caller(auth_required=True, peer_uid=0, peer_pid=7)]
)
def test_the_orchestrators_commands_are_not_taken_from_other_local_users(
    as_caller: Any, caller: Caller, caplog: pytest.LogCaptureFixture
) -> None:
    as_caller(caller)
    with caplog.at_level(logging.WARNING), pytest.raises(PermissionDeniedError, match="Unix"):
        authorize_call(Verb.SWITCH, group="g")
    assert f"uid {caller.peer_uid}" in caplog.text  # logged with the caller


def test_the_orchestrators_commands_over_the_unix_socket(as_caller: Any) -> None:
    # Without an auth policy: from root, or the agent's own user.
    as_caller(LOCAL_ROOT)
    assert authorize_call(Verb.SWITCH, group="g") is LOCAL_ROOT
    own = as_caller(Caller(peer_uid=os.getuid(), peer_pid=9))
    assert authorize_call(Verb.RESET_JOB, group="g") is own
    # Under one: an operator's token.
    operator = as_caller(Caller(principal=OPERATOR, auth_required=True, peer_uid=54321))
    assert authorize_call(Verb.SWITCH, group="g") is operator


@pytest.mark.parametrize("verb", [Verb.SNAPSHOT, Verb.WORKLOAD_CHANNEL, Verb.AGENT_STATUS])
def test_a_local_caller_is_known_by_its_peer_credentials(as_caller: Any, verb: Verb) -> None:
    # Under an auth policy too: the kernel says who it is.
    as_caller(LOCAL_OTHER_AUTH)
    assert authorize_call(verb, job="anything", group="g") is LOCAL_OTHER_AUTH


def test_a_tcp_caller_does_what_its_role_allows(as_caller: Any) -> None:
    as_caller(JOB_TCP)
    assert authorize_call(Verb.SNAPSHOT, job="a", group="g") is JOB_TCP
    with pytest.raises(PermissionDeniedError, match="may not act as job b"):
        authorize_call(Verb.SNAPSHOT, job="b", group="g")
    with pytest.raises(PermissionDeniedError, match="may not touch group h"):
        authorize_call(Verb.WORKLOAD_CHANNEL, job="a", group="h")
    as_caller(NOBODY_TCP)
    with pytest.raises(UnauthenticatedError):
        authorize_call(Verb.AGENT_STATUS)


# --- cuda pids ---------------------------------------------------------------------------


def test_pid_1_is_refused_whoever_asks() -> None:
    for caller in (OPERATOR_TCP, ANONYMOUS_TCP, LOCAL_ROOT, LOCAL_OTHER, JOB_TCP):
        with pytest.raises(PermissionDeniedError, match="pid 1 "):
            check_pids(caller, [100, 1], uids_of=uids_of, agent_uid=54321)


def test_a_local_caller_names_only_its_own_users_processes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    check_pids(LOCAL_OTHER, [100], uids_of=uids_of)
    with caplog.at_level(logging.WARNING), pytest.raises(PermissionDeniedError, match="pid 200"):
        check_pids(LOCAL_OTHER, [100, 200], uids_of=uids_of)
    assert "uid 54321" in caplog.text and "pid 200" in caplog.text
    # A setuid program the user started is not the user's.
    with pytest.raises(PermissionDeniedError, match="pid 300 .* uid 0"):
        check_pids(LOCAL_OTHER, [300], uids_of=uids_of)
    with pytest.raises(PermissionDeniedError, match="pid 400"):
        check_pids(LOCAL_OTHER_AUTH, [400], uids_of=uids_of)
    with pytest.raises(NotFoundError, match="no process 999"):
        check_pids(LOCAL_OTHER, [999], uids_of=uids_of)
    check_pids(LOCAL_ROOT, [100, 200, 300, 400], uids_of=uids_of)  # root may trace anyone


def test_a_job_principal_over_tcp_names_only_the_agents_users_processes() -> None:
    check_pids(JOB_TCP, [100], uids_of=uids_of, agent_uid=54321)
    with pytest.raises(PermissionDeniedError, match="pid 200"):
        check_pids(JOB_TCP, [200], uids_of=uids_of, agent_uid=54321)
    # An agent that runs as root would let it name root's daemons: none then.
    with pytest.raises(PermissionDeniedError, match="Unix socket"):
        check_pids(JOB_TCP, [400], uids_of=uids_of, agent_uid=0)


def test_a_job_principal_with_uids_names_only_those_users_processes() -> None:
    owner = Caller(principal=replace(JOB, uids=(2000,)), auth_required=True, peer="10.0.0.9:4000")
    check_pids(owner, [200], uids_of=uids_of, agent_uid=0)  # of a root agent too
    with pytest.raises(
        PermissionDeniedError, match="pid 100 is not principal trainer-a's .*uid 54321"
    ):
        check_pids(owner, [200, 100], uids_of=uids_of, agent_uid=54321)
    with pytest.raises(PermissionDeniedError, match="pid 400"):
        check_pids(owner, [400], uids_of=uids_of)


def test_a_registered_backend_is_checked_as_its_registrant() -> None:
    policy = AuthPolicy((replace(JOB, uids=(2000,)), OPERATOR))
    assert is_trusted(registrant(None, "anyone"))  # an agent without an auth policy
    assert is_trusted(registrant(policy, "orchestrator"))
    check_pids(registrant(policy, "trainer-a"), [200], uids_of=uids_of, agent_uid=0)
    with pytest.raises(PermissionDeniedError, match="pid 100 is not principal trainer-a's"):
        check_pids(registrant(policy, "trainer-a"), [100], uids_of=uids_of, agent_uid=0)
    # A name this agent does not know, or none: an anonymous caller's rule.
    for name in ("stranger", ""):
        caller = registrant(policy, name)
        assert caller.principal is None and caller.auth_required
        assert "registered by" in caller.who
        check_pids(caller, [100], uids_of=uids_of, agent_uid=54321)
        with pytest.raises(PermissionDeniedError, match="pid 200"):
            check_pids(caller, [200], uids_of=uids_of, agent_uid=54321)
        with pytest.raises(PermissionDeniedError, match="runs as root"):
            check_pids(caller, [100], uids_of=uids_of, agent_uid=0)


def test_an_operator_and_an_agent_without_auth_name_any_process() -> None:
    for caller in (OPERATOR_TCP, ANONYMOUS_TCP):
        check_pids(caller, [100, 200, 300, 400, 999], uids_of=uids_of, agent_uid=0)


def test_process_uids_reads_the_kernels_answer() -> None:
    uids = process_uids(os.getpid())
    assert uids is not None and uids[:2] == (os.getuid(), os.geteuid())
    assert process_uids(2**22 + 12345) is None  # above the kernel's pid_max


# --- workload channels ----------------------------------------------------------------------


def test_owners_and_who_may_replace_them() -> None:
    assert owner_of(LOCAL_OTHER) == owner_of(LOCAL_OTHER_AUTH) == "uid 54321"
    assert owner_of(JOB_TCP) == "principal trainer-a"
    assert owner_of(ANONYMOUS_TCP) == ""
    # Only an authenticated operator takes anyone's place; without an auth policy
    # a TCP caller is nobody in particular, and replaces only its likes.
    assert may_replace_any(OPERATOR_TCP)
    assert not any(map(may_replace_any, (ANONYMOUS_TCP, LOCAL_ROOT, LOCAL_OTHER_AUTH, JOB_TCP)))
    assert is_trusted(OPERATOR_TCP) and is_trusted(ANONYMOUS_TCP)
    assert not any(map(is_trusted, (LOCAL_ROOT, LOCAL_OTHER, JOB_TCP, NOBODY_TCP)))


def channel_of(caller: Caller) -> WorkloadChannel:
    channel = WorkloadChannel("g", "a", Capabilities())
    channel.owner, channel.owner_trusted = owner_of(caller), may_replace_any(caller)
    channel.peer = caller.who
    return channel


def test_a_channel_of_another_owner_is_refused_and_the_first_stays() -> None:
    channels = WorkloadChannels()
    first = channel_of(LOCAL_OTHER)
    channels.attach(first)
    for other in (LOCAL_ROOT, JOB_TCP, ANONYMOUS_TCP):
        with pytest.raises(PermissionDeniedError, match="another user"):
            channels.attach(channel_of(other))
        assert channels.get("g", "a") is first and not first.closed


def test_a_channel_of_the_same_owner_replaces_the_first_which_is_told() -> None:
    channels = WorkloadChannels()
    first, second = channel_of(LOCAL_OTHER), channel_of(LOCAL_OTHER_AUTH)
    channels.attach(first)
    channels.attach(second)
    assert channels.get("g", "a") is second
    assert "replaced by a newer registration" in first.closed
    assert first.failure is not None and "took this one's place" in str(first.failure)
    # An operator may take anyone's place.
    third = channel_of(OPERATOR_TCP)
    channels.attach(third)
    assert channels.get("g", "a") is third and second.closed


async def test_the_owner_of_a_job_holds_across_an_agent_restart(tmp_path: Any) -> None:
    """A job's channel owner is kept in the agent's job table: after a restart, before
    its workload reconnects, another user cannot register the job as theirs."""
    from timeslice.agent.server import Agent

    db = str(tmp_path / "agent.db")
    async with Agent(node_name="n1", db=db) as agent:
        await agent.register(channel_of(LOCAL_OTHER), JobState.RUNNING)
        assert agent.table.jobs[("g", "a")].owner == owner_of(LOCAL_OTHER)
    async with Agent(node_name="n1", db=db) as agent:
        assert agent.channels.get("g", "a") is None  # nothing open yet
        for other in (LOCAL_ROOT, JOB_TCP, ANONYMOUS_TCP):
            with pytest.raises(PermissionDeniedError, match="before the agent restarted"):
                await agent.register(channel_of(other), JobState.RUNNING)
        assert agent.table.jobs[("g", "a")].owner == owner_of(LOCAL_OTHER)
        await agent.register(channel_of(LOCAL_OTHER_AUTH), JobState.SAVED)  # the same uid
        assert agent.channels.get("g", "a") is not None
