"""The orchestrator's gRPC servicer: decode, authorize, call the Orchestrator, encode.

It never looks at lock state to decide anything; the Orchestrator and its table
do. The edge (size limits, strict parsing, error statuses, who the caller is) is
`edge_mapping`'s.

Every call is authorized before it acts (`authorize`, under the server's auth
policy; without one every caller may do everything): Acquire, Yield and
KeepAlive as the job on each group named; RegisterJob as the job on the group;
GetGroupStatus and a Watch of one group on that group; ListGroups and a Watch of
every group show only the groups the caller may touch (a watch of every group by
a principal of a few groups is filtered, not refused); ForceRelease, ResetJob
and SetGroupNodes are an operator's, and logged with the principal; each report
of an AgentSession must come from an agent of the node it names, else the
session ends PERMISSION_DENIED and the report changes nothing. The principal
that acquires a grant is recorded with it, so that another principal acting as
the same job id is refused by the table. What anyone sees of a holder's lease
(status, watches) lacks its secret: only the Acquire that took the grant is told
the lease id a KeepAlive needs.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Protocol

import grpclib.const
from grpclib.exceptions import GRPCError

from timeslice.api.backend_config import backend_of, names_pod
from timeslice.api.gen.snapshot_agent import v1alpha1 as apb
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb
from timeslice.api import hot
from timeslice.api.serving import CallGate, EdgeCall, Encoded, edge_mapping
from timeslice.client.agent_types import StatusResponse
from timeslice.errors import (
    InvalidArgumentError,
    PermissionDeniedError,
    ResourceExhaustedError,
    TimeSliceError,
    UnavailableError,
)
from timeslice.ids import check_id
from timeslice.kinds import Liveness
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.agents import AgentDirectory, state_name
from timeslice.orchestrator.config import OrchestratorConfig
from timeslice.orchestrator.events import Effect
from timeslice.orchestrator.leadership import Leadership
from timeslice.orchestrator.leadership import Role as LeaseRole
from timeslice.orchestrator.membership import Membership
from timeslice.orchestrator.model import Group, GroupState
from timeslice.orchestrator.state import LockTable
from timeslice.orchestrator.watches import Notice, Render, Watch
from timeslice.security.callers import Caller, authorize, operator_fields, refusal_fields
from timeslice.security.principals import Role, Verb
from timeslice.versions import package_version
from timeslice.targets import ACTIVE_KEY, LEASE_KEY

log = logging.getLogger(__name__)


class OrchestratorApi(Protocol):
    """What the servicer calls: the `Orchestrator`'s methods, read and act."""

    config: OrchestratorConfig
    gate: CallGate
    agents: AgentDirectory
    membership: Membership

    @property
    def table(self) -> LockTable: ...

    @property
    def failure(self) -> BaseException | None: ...

    @property
    def epoch(self) -> int: ...

    def refusal(self) -> str | None: ...

    def leadership(self) -> Leadership: ...

    def active_address(self) -> str | None: ...

    def advertised(self) -> str: ...

    async def acquire_groups(
        self,
        groups: Sequence[str],
        job: str,
        *,
        request_id: str = "",
        lease_ttl: float | None = None,
        wait_timeout: float | None = None,
        priority: int = 0,
        principal: str = "",
    ) -> list[ev.Granted]: ...

    async def yield_(
        self,
        group: str,
        job: str,
        *,
        request_id: str = "",
        token: int | None = None,
        principal: str = "",
    ) -> ev.Yielded: ...

    async def keep_alive(
        self, group: str, job: str, lease_id: str, *, principal: str = ""
    ) -> ev.LeaseRenewed: ...

    async def force_release(self, group: str, job: str = "", reason: str = "") -> list[Effect]: ...

    async def register_job(
        self, group: str, job: str, node: str, backend: dict[str, Any] | None, by: str = ""
    ) -> None: ...

    async def reset_job(self, group: str, job: str) -> bool: ...

    async def set_group_nodes(self, group: str, nodes: tuple[str, ...]) -> None: ...

    def group(self, name: str) -> Group: ...

    def group_names(self) -> list[str]: ...

    def group_agents(self, group: str) -> list[tuple[str, str | None]]: ...

    def watch(self, group: str = "", render: Render | None = None) -> Watch[Any]: ...

    def until_closed(self, items: AsyncIterator[Any]) -> AsyncIterator[Any]: ...


_STATE = {
    GroupState.IDLE: pb.GroupStatusState.IDLE,
    GroupState.IDLE_YIELDED: pb.GroupStatusState.IDLE_YIELDED,
    GroupState.LOCKED: pb.GroupStatusState.LOCKED,
    GroupState.SWITCHING: pb.GroupStatusState.SWITCHING,
}


_LIVENESS = {apb.Liveness.ALIVE: Liveness.ALIVE, apb.Liveness.GONE: Liveness.GONE}


class OrchestratorService(pb.TimeSliceOrchestratorServiceBase):
    """`TimeSliceOrchestratorService` over an `Orchestrator`."""

    def __init__(self, orchestrator: OrchestratorApi) -> None:
        self.orch = orchestrator

    # The replies of every handoff are encoded by hand (`timeslice.api.hot`) and sent
    # by the edge as they are.
    async def acquire(  # type: ignore[override]
        self, message: pb.AcquireRequest
    ) -> pb.AcquireResponse | Encoded:
        groups = [message.group_id, *message.more_group_ids]
        callers = [authorize(Verb.ACQUIRE, job=message.job_id, group=g) for g in groups]
        with _refusal_logged(Verb.ACQUIRE, callers[0], message.group_id, message.job_id):
            grants = await self.orch.acquire_groups(
                groups,
                message.job_id,
                request_id=message.request_id,
                lease_ttl=_seconds("lease_ttl_ms", message.lease_ttl_ms, positive=True),
                wait_timeout=_seconds("wait_timeout_ms", message.wait_timeout_ms, positive=False),
                priority=message.priority,
                principal=_name(callers[0]),
            )
        grant = grants[0]
        if not message.more_group_ids:
            return Encoded.of_body(
                hot.acquire_response(
                    waited_ms=round(grant.waited * 1000),
                    context_restored=grant.context_restored,
                    lease=_hot_lease(grant.lease),
                    fencing_token=grant.token,
                )
            )
        return pb.AcquireResponse(
            success=True,
            waited_ms=round(max(g.waited for g in grants) * 1000),
            context_restored=any(g.context_restored for g in grants),
            lease=_lease(grant.lease),
            fencing_token=grant.token,
            grants=[
                pb.GroupGrant(
                    group_id=g.group,
                    fencing_token=g.token,
                    lease=_lease(g.lease),
                    context_restored=g.context_restored,
                )
                for g in grants
            ]
            if message.more_group_ids
            else [],
        )

    async def yield_(self, message: pb.YieldRequest) -> Encoded:  # type: ignore[override]
        caller = authorize(Verb.YIELD, job=message.job_id, group=message.group_id)
        with _refusal_logged(Verb.YIELD, caller, message.group_id, message.job_id):
            answer = await self.orch.yield_(
                message.group_id,
                message.job_id,
                request_id=message.request_id,
                token=message.fencing_token,
                principal=_name(caller),
            )
        return Encoded.of_body(
            hot.yield_response(
                pending_waiters=answer.pending_waiters,
                snapshot_deferred=answer.snapshot_deferred,
                next_job_id=answer.next_job,
            )
        )

    async def list_groups(self, message: pb.ListGroupsRequest) -> pb.ListGroupsResponse:
        sees = _groups_seen(authorize(Verb.STATUS))
        names = self.orch.group_names()
        return pb.ListGroupsResponse(group_ids=[n for n in names if sees is None or sees(n)])

    async def get_group_status(
        self, message: pb.GetGroupStatusRequest
    ) -> pb.GetGroupStatusResponse:
        check_id("group_id", message.group_id)
        authorize(Verb.STATUS, group=message.group_id)
        status = self._status(self.orch.group(message.group_id))
        nodes = self.orch.group_agents(message.group_id)
        if not nodes or message.lock_only:
            return pb.GetGroupStatusResponse(group=status)
        addresses = [address for _, address in nodes if address is not None]
        views, everyone = await self.orch.agents.job_states(message.group_id, addresses)
        if not everyone or len(addresses) < len(nodes):
            status.group_state = pb.GroupStatusState.UNKNOWN
        states = [
            pb.SnapshotAgentJobState(
                agent=v.agent, job_state=pb.SnapshotAgentJobStateState[v.state], job_id=v.job
            )
            for v in views
        ]
        return pb.GetGroupStatusResponse(group=status, agent_job_states=states)

    async def keep_alive(self, message: pb.KeepAliveRequest) -> Encoded:  # type: ignore[override]
        caller = authorize(Verb.KEEP_ALIVE, job=message.job_id, group=message.group_id)
        with _refusal_logged(Verb.KEEP_ALIVE, caller, message.group_id, message.job_id):
            renewed = await self.orch.keep_alive(
                message.group_id, message.job_id, message.lease_id, principal=_name(caller)
            )
        return Encoded.of_body(
            hot.keep_alive_response(
                lease=_hot_lease(renewed.lease),
                fencing_token=renewed.token,
                yield_requested=renewed.yield_requested,
            )
        )

    # The edge sends `Encoded` replies as they are: the events every watcher
    # shares are encoded once, whatever the number of watchers.
    async def watch(  # type: ignore[override]
        self, message: pb.WatchRequest
    ) -> AsyncIterator[pb.WatchEvent | Encoded]:
        sees: _Sees | None = None
        if message.group_id:
            check_id("group_id", message.group_id)
            authorize(Verb.WATCH, group=message.group_id)
        else:
            sees = _groups_seen(authorize(Verb.WATCH))
        events = self.orch.watch(message.group_id, self._wire_event)
        try:
            known = self.orch.group_names()
            names = [message.group_id] if message.group_id else known
            now = datetime.now(UTC)
            for name in names:
                if name in known and (sees is None or sees(name)):
                    status = self._status(self.orch.group(name))
                    yield pb.WatchEvent(
                        kind=pb.WatchEventKind.CURRENT, group_id=name, time=now, status=status
                    )
            while batch := await events.batch():
                if sees is not None:
                    batch = [item for item in batch if sees(item.group)]
                    if not batch:
                        continue
                yield Encoded.join(batch)
            if events.lagged:
                raise ResourceExhaustedError(
                    f"the watcher fell {self.orch.config.watch_backlog} events behind"
                )
            if (failure := self.orch.failure) is not None:  # it stepped down: go elsewhere
                raise UnavailableError(f"the orchestrator stopped: {failure}")
        finally:
            events.close()

    async def force_release(self, message: pb.ForceReleaseRequest) -> pb.ForceReleaseResponse:
        caller = authorize(Verb.FORCE_RELEASE, job=message.job_id, group=message.group_id)
        effects = await self.orch.force_release(message.group_id, message.job_id, message.reason)
        revoked = next(e for e in effects if isinstance(e, ev.Revoked))
        granted = next((e for e in effects if isinstance(e, ev.Granted)), None)
        log.warning(
            "operator action by %s: force-released group %s from job %s (reason %r; next %s)",
            caller.who,
            message.group_id,
            revoked.job,
            message.reason,
            granted.job if granted else "nobody",
            extra=operator_fields(
                "force-release",
                caller,
                group=message.group_id,
                job=revoked.job,
                token=revoked.token,
                reason=message.reason,
                next_job=granted.job if granted else "",
            ),
        )
        return pb.ForceReleaseResponse(
            released_job_id=revoked.job, next_job_id=granted.job if granted else ""
        )

    async def register_job(self, message: pb.RegisterJobRequest) -> pb.RegisterJobResponse:
        # The node is where the job runs, not one the caller acts as: a job
        # principal names no nodes.
        caller = authorize(Verb.REGISTER_JOB, job=message.job_id, group=message.group_id)
        backend = message.backend_config
        if backend is not None:
            backend_of(backend, apb.Backend.UNSPECIFIED)  # refuses what no agent would take
        if names_pod(backend) and not caller.is_operator:
            # A pod's processes are whoever's the pod runs as: not a job's to name.
            raise PermissionDeniedError(
                f"{caller.who} may not name a pod: only an operator, or discovery, may"
            )
        # The agents check the processes it names against whoever registered it.
        await self.orch.register_job(
            message.group_id,
            message.job_id,
            message.node,
            backend.to_dict() if backend is not None else None,
            by=caller.principal.name if caller.principal is not None else "",
        )
        return pb.RegisterJobResponse()

    async def reset_job(self, message: pb.ResetJobRequest) -> pb.ResetJobResponse:
        caller = authorize(Verb.RESET_JOB, job=message.job_id, group=message.group_id)
        was = await self.orch.reset_job(message.group_id, message.job_id)
        log.warning(
            "operator action by %s: reset job %s on group %s (%s)",
            caller.who,
            message.job_id,
            message.group_id,
            "was quarantined" if was else "was not quarantined",
            extra=operator_fields(
                "reset-job",
                caller,
                group=message.group_id,
                job=message.job_id,
                was_quarantined=was,
            ),
        )
        return pb.ResetJobResponse(was_quarantined=was)

    async def set_group_nodes(self, message: pb.SetGroupNodesRequest) -> pb.SetGroupNodesResponse:
        caller = authorize(Verb.SET_GROUP_NODES, group=message.group_id)
        nodes = tuple(message.nodes)
        await self.orch.set_group_nodes(message.group_id, nodes)
        log.warning(
            "operator action by %s: group %s spans nodes %s",
            caller.who,
            message.group_id,
            ", ".join(nodes) or "none",
            extra=operator_fields(
                "set-group-nodes", caller, group=message.group_id, node=",".join(nodes)
            ),
        )
        return pb.SetGroupNodesResponse()

    async def agent_session(self, messages: AsyncIterator[pb.AgentReport]) -> pb.AgentSessionEnd:
        session, node, closed = object(), "", False
        try:
            async for report in self.orch.until_closed(messages):
                # Every report, not the first only: a session may not change nodes.
                authorize(Verb.AGENT_SESSION, node=report.node_name)
                liveness = {
                    (j.group, j.job_id): _LIVENESS.get(j.liveness, Liveness.UNKNOWN)
                    for j in report.jobs
                }
                accelerators = {a.id: a.memory_total_bytes for a in report.accelerators}
                self.orch.membership.reported(
                    session,
                    report.node_name,
                    report.address,
                    list(report.groups),
                    liveness,
                    accelerators,
                    report.token_key,
                    (report.table_version, _job_states(report)),
                )
                node = report.node_name
            closed = True
        finally:
            if node:
                self.orch.membership.left(session, node, closed)
        return pb.AgentSessionEnd()

    # --- encoding ---------------------------------------------------------------------

    async def get_leadership(self, message: pb.GetLeadershipRequest) -> pb.GetLeadershipResponse:
        authorize(Verb.STATUS)
        lead = self.orch.leadership()
        return pb.GetLeadershipResponse(
            role=lead.role.value,
            lease_epoch=lead.epoch,
            lease_ms=round(lead.lease * 1000),
            lease_left_ms=round(lead.left * 1000),
            holder=lead.holder,
            active_address=(
                self.orch.advertised()
                if lead.role is LeaseRole.ACTIVE
                else self.orch.active_address() or ""
            ),
            table_epoch=self.orch.epoch,
            version=package_version(),
        )

    async def list_agents(self, message: pb.ListAgentsRequest) -> pb.ListAgentsResponse:
        sees = _groups_seen(authorize(Verb.STATUS))
        known = [
            a
            for a in self.orch.membership.known_agents()
            if sees is None or any(sees(g) for g in a.groups)
        ]
        answers = await self.orch.agents.statuses([a.address for a in known if a.address])
        agents = []
        for a in known:
            answer = answers.get(a.address) if a.address else None
            agent = pb.KnownAgent(
                node=a.node,
                address=a.address or "",
                in_session=a.in_session,
                groups=list(a.groups),
            )
            if isinstance(answer, StatusResponse):
                agent.reachable, agent.version = True, answer.version
            elif answer is not None:
                agent.error = _why(answer)
            agents.append(agent)
        return pb.ListAgentsResponse(agents=agents, version=package_version())

    def _status(self, g: Group) -> pb.GroupStatus:
        return pb.GroupStatus(
            group_id=g.name,
            group_state=_STATE[g.state],
            state_timestamp=datetime.fromtimestamp(g.state_since, UTC) if g.state_since else None,
            locking_job=g.holder.job if g.holder else "",
            active_job=g.active_job,
            waiter_queue_depth=len(g.queue),
            loaded_job=g.loaded_job,
            fencing_token=g.token,
            waiting_jobs=list(g.queue),
            # Never the lease's secret: the status is anyone's to read.
            holder_lease=_lease(g.holder.shown_lease) if g.holder else None,
            epoch=self.orch.table.epoch,
            quarantined_jobs=[
                pb.QuarantinedJob(job_id=job, reason=why) for job, why in g.quarantined.items()
            ],
            nodes=list(self.orch.table.nodes.get(g.name, ())),
        )

    def _wire_event(self, notice: Notice) -> Encoded | None:
        """What every Watch stream sends of `notice`: built now (it carries the group's
        status as of now), encoded by the first stream to send it."""
        event = self._watch_event(notice)
        return _GroupEvent(event, notice.effect.group) if event is not None else None

    def _watch_event(self, notice: Notice) -> pb.WatchEvent | None:
        effect = notice.effect
        restored, moved = False, 0
        match effect:
            case ev.Queued():
                kind, token, reason = pb.WatchEventKind.QUEUED, 0, ""
            case ev.Granted(token=token, context_restored=restored, switch_bytes=moved):
                kind, reason = pb.WatchEventKind.GRANTED, ""
            case ev.SwitchStarted(token=token, previous=previous):
                kind = pb.WatchEventKind.SWITCH_STARTED
                reason = f"switching from {previous}" if previous else ""
            case ev.Quarantined(reason=reason):
                kind, token = pb.WatchEventKind.QUARANTINED, 0
            case ev.JobReset():
                kind, token, reason = pb.WatchEventKind.RESET, 0, ""
            case ev.Yielded(token=token):
                kind, reason = pb.WatchEventKind.YIELDED, ""
            case ev.LeftQueue():
                kind, token, reason = pb.WatchEventKind.LEFT_QUEUE, 0, effect.why
            case ev.Revoked(token=token):
                kind, reason = pb.WatchEventKind.REVOKED, effect.why
            case ev.YieldRequested(token=token, revoke_at=revoke_at):
                kind = pb.WatchEventKind.YIELD_REQUESTED
                when = datetime.fromtimestamp(revoke_at, UTC).isoformat()
                reason = f"hold limit reached: yield before {when}"
            case _:
                return None
        group = self.orch.table.groups.get(effect.group)
        return pb.WatchEvent(
            kind=kind,
            group_id=effect.group,
            job_id=effect.job,
            time=datetime.fromtimestamp(notice.time, UTC),
            fencing_token=token,
            reason=reason,
            status=self._status(group) if group else None,
            context_restored=restored,
            switch_bytes=moved,
        )

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        routes = edge_mapping(super().__mapping__(), self, self.orch.gate)
        return {
            # Every candidate says where it stands, a standby too.
            route: handler
            if route.endswith("/GetLeadership")
            else handler._replace(func=handler.func.behind(self._admit))
            for route, handler in routes.items()
        }

    def _admit(
        self, handle: Callable[[EdgeCall], Awaitable[None]]
    ) -> Callable[[EdgeCall], Awaitable[None]]:
        """`handle`, behind the orchestrator's refusal (a standby answers UNAVAILABLE)."""

        async def admitted(call: EdgeCall) -> None:
            if (why := self.orch.refusal()) is not None:
                if (active := self.orch.active_address()) is None:
                    raise GRPCError(grpclib.const.Status.UNAVAILABLE, why)
                # A standby that knows the active names it, for clients to go there.
                lease_ms = str(round(self.orch.config.leader_lease * 1000))
                await call.end(
                    grpclib.const.Status.UNAVAILABLE,
                    f"{why} (the active is at {active})",
                    {ACTIVE_KEY: active, LEASE_KEY: lease_ms},
                )
                return
            await handle(call)

        return admitted


class _GroupEvent(Encoded):
    """A watch event encoded once for every watcher, and the group it is of, so that
    a watch of every group can leave out those its caller may not see."""

    __slots__ = ("group",)

    def __init__(self, message: pb.WatchEvent, group: str) -> None:
        super().__init__(message)
        self.group = group


_Sees = Callable[[str], bool]


def _job_states(report: pb.AgentReport) -> list[tuple[str, str, str]]:
    """(group, job, state) of every job an agent reports ("SAVED", ...)."""
    return [(j.group, j.job_id, state_name(j.state)) for j in report.jobs]


def _groups_seen(caller: Caller) -> _Sees | None:
    """Which groups `caller` may see of a list or a watch of them all (None: every
    one, without asking each)."""
    p = caller.principal
    if p is None or p.role in (Role.OPERATOR, Role.AGENT) or "*" in p.groups:
        return None
    return p.may_touch


@contextmanager
def _refusal_logged(verb: Verb, caller: Caller, group: str, job: str) -> Iterator[None]:
    """Log what the table refuses for want of ownership (a grant acquired by another
    principal, a yield of a grant not held), as `authorize` logs its refusals."""
    try:
        yield
    except PermissionDeniedError as exc:
        log.warning(
            "refused %s by %s from %s: %s",
            verb,
            caller.who,
            caller.peer,
            exc,
            extra=refusal_fields(verb, caller, group=group, job=job),
        )
        raise


# The most of an agent's error a ListAgents answer repeats.
_MAX_ERROR_CHARS = 300


def _why(error: Exception) -> str:
    """An agent's failure to answer, in one bounded line."""
    text = error.message if isinstance(error, TimeSliceError) else str(error)
    text = " ".join((text or type(error).__name__).split())
    return text[:_MAX_ERROR_CHARS]


def _name(caller: Caller) -> str:
    """The caller's principal name, as the table binds grants to it ("" unnamed)."""
    return caller.principal.name if caller.principal is not None else ""


def _seconds(name: str, millis: int | None, *, positive: bool) -> float | None:
    if millis is None:
        return None
    if millis < 0 or (positive and millis == 0):
        raise InvalidArgumentError(f"{name} must be {'positive' if positive else 'at least 0'}")
    return millis / 1000


def _hot_lease(lease: ev.LeaseInfo) -> bytes:
    """`_lease`, encoded by hand."""
    return hot.lease(lease.lease_id, round(lease.ttl * 1000), lease.expires_at)


def _lease(lease: ev.LeaseInfo) -> pb.Lease:
    expires = (
        datetime.fromtimestamp(lease.expires_at, UTC) if lease.expires_at is not None else None
    )
    return pb.Lease(lease_id=lease.lease_id, ttl_ms=round(lease.ttl * 1000), expires_at=expires)
