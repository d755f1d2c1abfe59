"""Whom the agent acts for: the rules of each of its calls, on top of the roles of
`timeslice.security.principals`.

The agent can stop, copy and free other processes' device memory, so it acts
only for its own callers:

- The orchestrator's commands (`SwitchGroup`, `ResetJob`, and any Snapshot or
  Restore that carries a fencing token) are taken only from an operator: under
  an auth policy, an operator principal (the orchestrator dials agents with an
  operator's token or client certificate); without one, any TCP caller (the
  agent then listens on loopback only). Over the Unix socket: from an
  operator's token, or without an auth policy from the agent's own user or root
  (as privileged as the agent already); never from another local user.
- A caller on the agent's Unix socket is identified by its peer credentials
  (SO_PEERCRED: pid and uid), token or not. It may snapshot, restore and
  register workloads, and read the agent's status, but only on what its user
  owns: the processes of a `cuda` job (`check_pids`) and the workload channel
  of an `app_channel` job (`owner_of`).
- A TCP caller under an auth policy does what its principal's role allows, on
  its own job ids and groups (`authorize`).

Who may name which `cuda` pids (`check_pids`):

- pid 1 (the node's init) never; the agent's own pid never (`parse_pids`);
- an authenticated operator, or any TCP caller of an agent without an auth
  policy: any other process;
- a Unix socket peer: only processes of its own uid (root: any);
- a job principal with `uids` in the agent's auth file: only processes of
  those users;
- any other job principal over TCP: only processes of the agent's own user,
  and none when the agent runs as root (it would name root's daemons): such
  jobs use the Unix socket, where the kernel says who they are, or are given
  their `uids`.

A job registered through the orchestrator reaches the agent with the
orchestrator's `SwitchGroup`, which names the principal that registered it; the
agent checks its pids as if that principal had named them itself (`registrant`),
before it first acts on the job. A name the agent's auth file does not have, or
none (the orchestrator had no auth policy), is an anonymous caller's.

A `cuda` target may name a Kubernetes pod (`pod_uid`) instead of pids; its
processes are then the pod's (through the node's cgroups), whoever runs them,
so only a trusted caller (above) may name one, or the orchestrator's own
discovery from Kubernetes labels: a job it registered comes in an operator's
`SwitchGroup` with `registered_by` `DISCOVERY_REGISTRANT`, a name that no
principal of an auth file may have (`timeslice.security.principals`). Anyone
else naming a pod, or acting on a job known by one, is PERMISSION_DENIED.

A process is a user's when its real, effective and saved uids all are that user's
(`/proc/<pid>/status`), as the kernel's own rule for tracing it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from typing import Final

from timeslice.errors import NotFoundError, PermissionDeniedError
from timeslice.security.callers import CURRENT, Caller, authorize, refusal_fields
from timeslice.security.principals import AuthPolicy, Role, Verb

log = logging.getLogger(__name__)

# The init process: never a job's, whoever asks.
INIT_PID: Final = 1
# What a caller known only by its peer credentials may do.
LOCAL_VERBS: Final = frozenset({Verb.SNAPSHOT, Verb.WORKLOAD_CHANNEL, Verb.AGENT_STATUS})
# The orchestrator's commands.
ORCHESTRATOR_VERBS: Final = frozenset({Verb.SWITCH, Verb.RESET_JOB})


def refused(caller: Caller, verb: Verb, message: str) -> PermissionDeniedError:
    """A refusal, logged with the caller."""
    fields = refusal_fields(verb, caller)
    log.warning(
        "refused %s by %s from %s: %s", verb, caller.who, caller.peer, message, extra=fields
    )
    return PermissionDeniedError(message)


def authorize_call(verb: Verb, *, job: str = "", group: str = "") -> Caller:
    """Refuse the current call unless its caller may do `verb` on `job` and `group`
    (the rules above); return the caller."""
    caller = CURRENT.get()
    local = caller.peer_uid is not None
    if verb in ORCHESTRATOR_VERBS:
        if local and not caller.auth_required and caller.peer_uid in (0, os.getuid()):
            return caller  # as privileged as the agent itself already
        if local and caller.principal is None:
            raise refused(
                caller,
                verb,
                "the orchestrator's commands are taken over the agent's Unix socket only"
                " from an operator (or, without an auth policy, the agent's own user)",
            )
        return authorize(verb, job=job, group=group)
    if local and caller.principal is None:
        if verb not in LOCAL_VERBS:
            raise refused(caller, verb, f"a local caller may not {verb.replace('_', ' ')}")
        return caller
    return authorize(verb, job=job, group=group)


def is_trusted(caller: Caller) -> bool:
    """Whether the caller may act on anything: an authenticated operator, or a TCP
    caller of an agent without an auth policy."""
    if caller.auth_required:
        return caller.is_operator
    return caller.peer_uid is None


def owner_of(caller: Caller) -> str:
    """Whom a workload channel opened by `caller` belongs to: its uid over the Unix
    socket, its principal over TCP, "" for an anonymous TCP caller."""
    if caller.peer_uid is not None:
        return f"uid {caller.peer_uid}"
    if caller.principal is not None:
        return f"principal {caller.principal.name}"
    return ""


def may_replace_any(caller: Caller) -> bool:
    """Whether `caller`'s workload channel may take the place of anyone's (an
    authenticated operator's may; otherwise only a channel of the same owner)."""
    return caller.auth_required and caller.is_operator


def registrant(policy: AuthPolicy | None, name: str) -> Caller:
    """The caller a job's backend registered through the orchestrator is checked as:
    principal `name` as this agent's auth policy knows it (anonymous when it does
    not, or `name` is ""); without a policy, a trusted caller."""
    if policy is None:
        return Caller()
    where = f"the orchestrator (registered by {name or 'an anonymous caller'})"
    return Caller(principal=policy.by_name(name) if name else None, auth_required=True, peer=where)


def process_uids(pid: int) -> tuple[int, ...] | None:
    """The real, effective, saved and filesystem uids of process `pid`, or None if
    there is no such process."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Uid:"):
                    return tuple(int(uid) for uid in line.split()[1:])
    except (FileNotFoundError, ProcessLookupError):
        return None
    except (OSError, ValueError):
        pass
    return (os.stat(f"/proc/{pid}").st_uid,)  # no status to read: who owns its folder


def check_pids(
    caller: Caller,
    pids: Iterable[int],
    *,
    agent_uid: int | None = None,
    uids_of: Callable[[int], tuple[int, ...] | None] = process_uids,
) -> None:
    """Refuse (PERMISSION_DENIED, naming the pid) any of `pids` that `caller` may not
    name for a `cuda` job (the rules above); NOT_FOUND for a pid that does not exist."""
    pids = list(pids)
    if INIT_PID in pids:
        raise refused(caller, Verb.SNAPSHOT, "pid 1 is the node's init process, no job's")
    if caller.auth_required and caller.is_operator:
        return
    principal = caller.principal
    allowed: frozenset[int]
    if caller.peer_uid is not None:
        if caller.peer_uid == 0:
            return
        allowed, whose = frozenset({caller.peer_uid}), f"the caller's (uid {caller.peer_uid})"
    elif not caller.auth_required:
        return
    elif principal is not None and principal.role is Role.JOB and principal.uids:
        allowed = frozenset(principal.uids)
        whose = f"{caller.who}'s (uid {', '.join(map(str, sorted(allowed)))})"
    else:
        agent_uid = os.getuid() if agent_uid is None else agent_uid
        if agent_uid == 0:
            raise refused(
                caller,
                Verb.SNAPSHOT,
                f"pid {pids[0]}: {caller.who} may name no processes of an agent that runs"
                " as root (give it uids in the agent's auth file, or use its Unix socket)",
            )
        allowed, whose = frozenset({agent_uid}), f"the agent's user's (uid {agent_uid})"
    for pid in pids:
        uids = uids_of(pid)
        if uids is None:
            raise NotFoundError(f"no process {pid} on this node")
        # As the kernel's own rule for tracing a process: every uid of it must be
        # an allowed one (a setuid program run by the caller is not the caller's).
        other = next((uid for uid in uids if uid not in allowed), None)
        if other is not None:
            raise refused(caller, Verb.SNAPSHOT, f"pid {pid} is not {whose}: it is uid {other}'s")
