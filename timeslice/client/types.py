"""The values the orchestrator clients return.

The first seven names keep the shape of the v1alpha1 Python client, so code
written against it reads the same results; what timeslice adds comes as
fields with defaults after the original ones.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from enum import Enum
from typing import TypeVar

from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb

E = TypeVar("E", bound=Enum)


class GroupLockState(str, Enum):
    """The lock state of a group."""

    UNSPECIFIED = "UNSPECIFIED"
    UNKNOWN = "UNKNOWN"
    IDLE = "IDLE"
    IDLE_YIELDED = "IDLE_YIELDED"
    LOCKED = "LOCKED"
    SWITCHING = "SWITCHING"


class AgentJobState(str, Enum):
    """Where a job's accelerator context is, as one node's agent sees it."""

    UNSPECIFIED = "UNSPECIFIED"
    IDLE = "IDLE"
    RUNNING = "RUNNING"
    TRANSITIONING = "TRANSITIONING"
    SAVED = "SAVED"
    FAULTED = "FAULTED"


class WatchEventKind(str, Enum):
    """What happened in a group, as `watch()` reports it."""

    UNSPECIFIED = "UNSPECIFIED"
    CURRENT = "CURRENT"
    QUEUED = "QUEUED"
    GRANTED = "GRANTED"
    YIELDED = "YIELDED"
    LEFT_QUEUE = "LEFT_QUEUE"
    REVOKED = "REVOKED"
    YIELD_REQUESTED = "YIELD_REQUESTED"
    SWITCH_STARTED = "SWITCH_STARTED"
    QUARANTINED = "QUARANTINED"
    RESET = "RESET"


@dataclass(frozen=True)
class GroupGrant:
    """One group of a grant of several groups at once (`acquire_groups`)."""

    group_id: str
    fencing_token: int
    lease_id: str
    lease_ttl_ms: int
    context_restored: bool


@dataclass(frozen=True)
class AcquireResult:
    """The answer to `acquire()`: the job holds the group's lock.

    `fencing_token` identifies this grant; `lease_ttl_ms` is 0 when the lease
    never expires by silence (no lease asked for, or an older server).
    """

    success: bool
    waited_ms: int
    context_restored: bool
    fencing_token: int = 0
    lease_id: str = ""
    lease_ttl_ms: int = 0
    lease_expires_at: datetime.datetime | None = None
    # With `acquire_groups`: every group's grant, the first group's first.
    grants: tuple[GroupGrant, ...] = ()


@dataclass(frozen=True)
class YieldResult:
    """The answer to `release()` (the Yield call)."""

    success: bool
    pending_waiters: int
    snapshot_deferred: bool
    next_job_id: str = ""


@dataclass(frozen=True)
class SnapshotAgentJobState:
    """One job's context state on one node."""

    agent: str
    job_id: str
    job_state: AgentJobState


@dataclass(frozen=True)
class GroupStatus:
    """One group's lock: holder, queue, and whose context is where."""

    group_id: str
    group_state: GroupLockState
    state_timestamp: datetime.datetime | None
    locking_job: str
    active_job: str
    waiter_queue_depth: int
    loaded_job: str
    fencing_token: int = 0
    waiting_jobs: tuple[str, ...] = ()
    epoch: int = 0
    # Jobs that may not hold the group until an operator resets them: job -> why.
    quarantined_jobs: dict[str, str] = field(default_factory=dict)
    # The nodes (agents) the group spans.
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class OrchestratorGroupStatus:
    """The answer to `get_status()`."""

    group: GroupStatus
    agent_job_states: list[SnapshotAgentJobState] = field(default_factory=list)


@dataclass(frozen=True)
class LeaseInfo:
    """A holder's lease after a `keep_alive()`. `ttl_ms` 0: it never expires by silence."""

    lease_id: str
    ttl_ms: int
    expires_at: datetime.datetime | None
    fencing_token: int
    # The group's hold limit is reached: yield, or be revoked after its grace period.
    yield_requested: bool = False


@dataclass(frozen=True)
class ForceReleaseResult:
    """The answer to `force_release()`."""

    released_job_id: str
    next_job_id: str


@dataclass(frozen=True)
class WatchEvent:
    """One event of a group, from `watch()`. `status` is the group right after it."""

    kind: WatchEventKind
    group_id: str
    job_id: str
    time: datetime.datetime | None
    fencing_token: int
    reason: str
    status: GroupStatus | None
    # For GRANTED: whether the job's context was restored, and what the switch moved.
    context_restored: bool = False
    switch_bytes: int = 0


@dataclass(frozen=True)
class KnownAgent:
    """An agent the orchestrator knows (`list_agents()`), asked for its Status just now.

    ``address`` is empty when no agent of that node has registered; ``error`` says
    why it did not answer when ``reachable`` is False.
    """

    node: str
    address: str
    in_session: bool
    groups: tuple[str, ...]
    reachable: bool
    version: str = ""
    error: str = ""


@dataclass(frozen=True)
class AgentList:
    """The answer to `list_agents()`: the agents, and the orchestrator's own version."""

    agents: tuple[KnownAgent, ...]
    version: str


@dataclass(frozen=True)
class Leadership:
    """The answer to `get_leadership()`: where one orchestrator stands among the
    candidates on its journal.

    `role` is "active", "standby" or "stepped_down"; `lease_epoch` the leader
    lease's (0: no lease, the only writer); `lease_sec` its length and
    `lease_left_sec` what it has left as last known; `holder` the candidate
    holding it; `active_address` where the active is reached ("" unknown);
    `table_epoch` the epoch the agents are commanded with."""

    role: str
    lease_epoch: int
    lease_sec: float
    lease_left_sec: float
    holder: str
    active_address: str
    table_epoch: int
    version: str


def leadership(message: pb.GetLeadershipResponse) -> Leadership:
    """A `Leadership` from the wire message."""
    return Leadership(
        role=message.role,
        lease_epoch=message.lease_epoch,
        lease_sec=message.lease_ms / 1000,
        lease_left_sec=message.lease_left_ms / 1000,
        holder=message.holder,
        active_address=message.active_address,
        table_epoch=message.table_epoch,
        version=message.version,
    )


def _enum_by_name(cls: type[E], value: object, default: E) -> E:
    # Generated enums and ours share member names; a value this client does not
    # know (a newer server) reads as the default rather than failing.
    name = getattr(value, "name", None)
    return cls.__members__.get(name, default) if isinstance(name, str) else default


def acquire_result(message: pb.AcquireResponse) -> AcquireResult:
    """An `AcquireResult` from the wire message."""
    lease = message.lease
    return AcquireResult(
        success=message.success,
        waited_ms=message.waited_ms,
        context_restored=message.context_restored,
        fencing_token=message.fencing_token,
        lease_id=lease.lease_id if lease else "",
        lease_ttl_ms=lease.ttl_ms if lease else 0,
        lease_expires_at=lease.expires_at if lease else None,
        grants=tuple(
            GroupGrant(
                group_id=g.group_id,
                fencing_token=g.fencing_token,
                lease_id=g.lease.lease_id if g.lease else "",
                lease_ttl_ms=g.lease.ttl_ms if g.lease else 0,
                context_restored=g.context_restored,
            )
            for g in message.grants
        ),
    )


def yield_result(message: pb.YieldResponse) -> YieldResult:
    """A `YieldResult` from the wire message."""
    return YieldResult(
        success=message.success,
        pending_waiters=message.pending_waiters,
        snapshot_deferred=message.snapshot_deferred,
        next_job_id=message.next_job_id,
    )


def group_status(message: pb.GroupStatus) -> GroupStatus:
    """A `GroupStatus` from the wire message."""
    return GroupStatus(
        group_id=message.group_id,
        group_state=_enum_by_name(GroupLockState, message.group_state, GroupLockState.UNSPECIFIED),
        state_timestamp=message.state_timestamp,
        locking_job=message.locking_job,
        active_job=message.active_job,
        waiter_queue_depth=message.waiter_queue_depth,
        loaded_job=message.loaded_job,
        fencing_token=message.fencing_token,
        waiting_jobs=tuple(message.waiting_jobs),
        epoch=message.epoch,
        quarantined_jobs={q.job_id: q.reason for q in message.quarantined_jobs},
        nodes=tuple(message.nodes),
    )


def orchestrator_group_status(
    message: pb.GetGroupStatusResponse, group_id: str
) -> OrchestratorGroupStatus:
    """An `OrchestratorGroupStatus` from the wire message (an absent group reads as unknown)."""
    group = message.group if message.group is not None else pb.GroupStatus(group_id=group_id)
    return OrchestratorGroupStatus(
        group=group_status(group),
        agent_job_states=[
            SnapshotAgentJobState(
                agent=state.agent,
                job_id=state.job_id,
                job_state=_enum_by_name(AgentJobState, state.job_state, AgentJobState.UNSPECIFIED),
            )
            for state in message.agent_job_states
        ],
    )


def lease_info(message: pb.KeepAliveResponse) -> LeaseInfo:
    """A `LeaseInfo` from the wire message."""
    lease = message.lease
    return LeaseInfo(
        lease_id=lease.lease_id if lease else "",
        ttl_ms=lease.ttl_ms if lease else 0,
        expires_at=lease.expires_at if lease else None,
        fencing_token=message.fencing_token,
        yield_requested=message.yield_requested,
    )


def force_release_result(message: pb.ForceReleaseResponse) -> ForceReleaseResult:
    """A `ForceReleaseResult` from the wire message."""
    return ForceReleaseResult(
        released_job_id=message.released_job_id, next_job_id=message.next_job_id
    )


def watch_event(message: pb.WatchEvent) -> WatchEvent:
    """A `WatchEvent` from the wire message."""
    return WatchEvent(
        kind=_enum_by_name(WatchEventKind, message.kind, WatchEventKind.UNSPECIFIED),
        group_id=message.group_id,
        job_id=message.job_id,
        time=message.time,
        fencing_token=message.fencing_token,
        reason=message.reason,
        status=group_status(message.status) if message.status is not None else None,
        context_restored=message.context_restored,
        switch_bytes=message.switch_bytes,
    )


def agent_list(message: pb.ListAgentsResponse) -> AgentList:
    """An `AgentList` from the wire message."""
    return AgentList(
        agents=tuple(
            KnownAgent(
                node=a.node,
                address=a.address,
                in_session=a.in_session,
                groups=tuple(a.groups),
                reachable=a.reachable,
                version=a.version,
                error=a.error,
            )
            for a in message.agents
        ),
        version=message.version,
    )
