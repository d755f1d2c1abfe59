"""The orchestrator's view of the agents on its groups' nodes.

A group names the nodes it spans (configured, set through `SetGroupNodes`, or
joined by agents when they register). `GetGroupStatus` reports what each agent
says of the group's jobs, and the group as STATE_UNKNOWN when one of them cannot
be reached. Agents that keep a session with the orchestrator report their jobs'
states and liveness (workload channel open, processes running), kept here in
memory: a restarted orchestrator hears it again as soon as they reconnect.

`GetGroupStatus` is answered from those reports and from the agents' answers to
the switches and resets the orchestrator sent them (`NodeView`), so that however
often it is asked no agent is asked anything. Only an agent without a session (a
node named by its address whose agent does not report) is asked its Status, with
at most one question in flight to it, shared by every caller meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from timeslice.api.gen.snapshot_agent import v1alpha1 as apb
from timeslice.client.agent import AsyncSnapshotAgentClient
from timeslice.client.agent_types import StatusResponse, enum_name
from timeslice.errors import ConflictError, InvalidArgumentError, NotFoundError
from timeslice.ids import parse_target
from timeslice.kinds import Liveness
from timeslice.orchestrator.agent_views import NodeView
from timeslice.orchestrator.decisions import agent_joined, agent_lost
from timeslice.security.tls import ClientTls

log = logging.getLogger(__name__)

# How long a status question to one agent may take before it counts as unreachable.
STATUS_TIMEOUT = 1.0


@dataclass(frozen=True, kw_only=True)
class AgentJobView:
    """One agent's word on one job: its state as named on the wire ("SAVED", ...)."""

    agent: str
    job: str
    state: str


@dataclass(frozen=True, kw_only=True)
class KnownAgent:
    """An agent the orchestrator knows of: its node (a name, or an address a group
    names), where it is reached (None: not known), whether its session is open now,
    and the groups whose nodes include it."""

    node: str
    address: str | None
    in_session: bool
    groups: tuple[str, ...]


class AgentDirectory:
    """One client per agent address, made when first needed, and what the agents
    in session report."""

    def __init__(
        self,
        timeout: float = STATUS_TIMEOUT,
        *,
        tls: ClientTls | None = None,
        token: str = "",
        http2: str = "h2core",
    ) -> None:
        self.timeout = timeout
        # What the orchestrator calls every agent with (`OrchestratorConfig.agent_tls`,
        # `agent_token`): never this process's environment, which is a user's.
        self.tls = tls
        self.token = token
        self.http2 = http2  # the HTTP/2 client of the calls (`OrchestratorConfig.http2`)
        self._clients: dict[str, AsyncSnapshotAgentClient] = {}
        # The Status question in flight to each agent, shared by every caller that
        # asks meanwhile: however many ask, an agent has at most one at a time.
        self._asking: dict[str, asyncio.Future[StatusResponse]] = {}
        # Node name -> address, and the liveness of its jobs by (group, job), for
        # every agent in session now.
        self.addresses: dict[str, str] = {}
        self.accelerators: dict[str, dict[str, int]] = {}
        self._liveness: dict[str, dict[tuple[str, str], Liveness]] = {}
        self._sessions: dict[str, object] = {}
        self._views: dict[str, NodeView] = {}  # node name -> its jobs' states
        # Node name -> the key its agent checks the tokens of switches with.
        self._token_keys: dict[str, bytes] = {}
        self._arrived = asyncio.Event()

    def reported(
        self,
        session: object,
        node: str,
        address: str,
        liveness: dict[tuple[str, str], Liveness],
        accelerators: dict[str, int],
        token_key: bytes = b"",
        states: tuple[int, list[tuple[str, str, str]]] | None = None,
    ) -> None:
        """An agent in `session` reported its jobs (and its accelerators: id -> bytes,
        the key it checks the tokens of switches with, and `states`: its job table's
        version and (group, job, state) of every job)."""
        if self._sessions.get(node) is not session or self.addresses.get(node) != address:
            agent_joined(node, address)
        if self._sessions.get(node) is not session:
            self._views[node] = NodeView()
        if states is not None:
            self._views[node].report(*states)
        self._sessions[node] = session
        self._token_keys[node] = token_key
        self.addresses[node] = address
        self.accelerators[node] = accelerators
        self._liveness[node] = liveness
        self._arrived.set()
        self._arrived = asyncio.Event()

    def left(self, session: object, node: str, closed: bool = False) -> None:
        """An agent's `session` ended (`closed`: by either side, not broken off): what
        it said is no longer known (unless a newer session of the same node took over)."""
        if self._sessions.get(node) is session:
            del self._sessions[node]
            agent_lost(node, self.addresses.pop(node, ""), closed)
            self.accelerators.pop(node, None)
            self._liveness.pop(node, None)
            self._views.pop(node, None)
            self._token_keys.pop(node, None)

    def in_session(self, node: str) -> bool:
        """Whether the agent of `node` (a node name, or its address) keeps a session
        with the orchestrator now."""
        return node in self._sessions or node in self.addresses.values()

    def switched(self, group: str, answer: apb.SwitchGroupResponse) -> None:
        """An agent answered a switch of `group`: what it says of the group's jobs."""
        view = self._views.get(answer.node_name)
        if view is not None and answer.table_version:
            states = [(j.job_id, state_name(j.state)) for j in answer.jobs]
            view.group(group, answer.table_version, states)

    def _view_at(self, address: str) -> tuple[str, NodeView] | None:
        """The node name and view of the agent in session at `address` (or so named)."""
        for name, at in self.addresses.items():
            if (at == address or name == address) and (view := self._views.get(name)):
                return name, view
        return None

    async def statuses(self, addresses: Sequence[str]) -> dict[str, StatusResponse | Exception]:
        """Every agent's answer to Status now (or why it gave none), by address."""
        unique = list(dict.fromkeys(addresses))
        answers = await asyncio.gather(*(self.status(a) for a in unique), return_exceptions=True)
        out: dict[str, StatusResponse | Exception] = {}
        for address, answer in zip(unique, answers, strict=True):
            if isinstance(answer, BaseException) and not isinstance(answer, Exception):
                raise answer  # a cancellation, not the agent's answer
            out[address] = answer
        return out

    def token_key(self, node: str) -> bytes:
        """The key the agent of `node` (a node name, or the address of an agent in
        session) checks the tokens of switches with; empty when none is known."""
        if (key := self._token_keys.get(node)) is not None:
            return key
        named = next((name for name, address in self.addresses.items() if address == node), "")
        return self._token_keys.get(named, b"")

    async def reset(self, group: str, job: str, addresses: Sequence[str], *, epoch: int) -> None:
        """Clear the job's fault on every one of these agents that has it faulted, as
        the orchestrator of `epoch` (an agent that has seen a newer one refuses)."""

        async def reset_one(address: str) -> None:
            try:
                answer = await self.client(address).reset_job(job, group, orchestrator_epoch=epoch)
                if answer.table_version and (seen := self._view_at(address)):
                    state = answer.state.removeprefix("JOB_STATE_")
                    seen[1].job((group, job), answer.table_version, state)
            except NotFoundError:
                pass  # not known there
            except ConflictError as exc:  # not faulted there, or a newer epoch has taken over
                log.info("reset of %s/%s on agent %s: %s", group, job, address, exc.message)

        await asyncio.gather(*(reset_one(address) for address in addresses))

    def liveness(self, node: str, group: str, job: str) -> Liveness:
        """What the agent of `node` (a node name or its address) last said of the job
        (UNKNOWN: no signal, or no agent in session)."""
        if node not in self._liveness:
            node = next((n for n, a in self.addresses.items() if a == node), node)
        seen = self._liveness.get(node, {})
        return seen.get((group, job)) or seen.get(("", job), Liveness.UNKNOWN)

    def address(self, node: str, registered: Mapping[str, str]) -> str | None:
        """Where the agent of `node` is reached: as it says in session now, as it
        `registered` (journaled), or `node` itself when that is an address
        (HOST:PORT). None: not known yet."""
        address = self.addresses.get(node) or registered.get(node)
        if address is not None:
            return address
        try:
            parse_target(node)
        except InvalidArgumentError:
            return None
        return node

    async def wait_address(
        self, node: str, registered: Mapping[str, str], deadline: float
    ) -> str | None:
        """`address`, waiting until `deadline` (wall clock) for the agent to register."""
        await self._until(lambda: self.address(node, registered) is not None, deadline)
        return self.address(node, registered)

    async def wait_session(self, node: str, registered: Mapping[str, str], until: float) -> None:
        """Wait until `until` (wall clock) for the agent of `node` (a node name, or an
        agent's address) to be in session, if it keeps one: it has registered through
        a session before (`registered`, journaled) and has none open now. An agent
        only reached at its address reports nothing, and is not waited for."""
        if node in registered or node in registered.values():
            await self._until(lambda: self.in_session(node), until)

    async def _until(self, ready: Callable[[], bool], until: float) -> None:
        """Wait until `ready()`, asked again at each agent's report, or until `until`
        (wall clock)."""
        while not ready():
            left = until - time.time()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._arrived.wait()

    async def status(self, address: str) -> StatusResponse:
        """The agent's answer to Status: the question in flight to it if there is
        one (asked for someone else a moment ago), else a new one."""
        asking = self._asking.get(address)
        if asking is None:
            asking = asyncio.ensure_future(self.client(address).status(timeout_sec=self.timeout))
            self._asking[address] = asking
            asking.add_done_callback(lambda done: self._asked(address, done))
        # Shielded: a caller that gives up does not cancel the others' answer.
        return await asyncio.shield(asking)

    def _asked(self, address: str, done: asyncio.Future[StatusResponse]) -> None:
        if self._asking.get(address) is done:
            del self._asking[address]
        if not done.cancelled():
            done.exception()  # retrieved here too: its callers may all have gone

    def client(self, address: str) -> AsyncSnapshotAgentClient:
        """The client of the agent at `address`."""
        client = self._clients.get(address)
        if client is None:
            client = self.new_client(
                address, call_timeout_sec=self.timeout, reconnect_timeout_sec=0
            )
            self._clients[address] = client
        return client

    def new_client(
        self, address: str, *, call_timeout_sec: float = 10.0, reconnect_timeout_sec: float
    ) -> AsyncSnapshotAgentClient:
        """A client of the agent at `address`, with the orchestrator's credentials."""
        return AsyncSnapshotAgentClient(
            address,
            call_timeout_sec=call_timeout_sec,
            reconnect_timeout_sec=reconnect_timeout_sec,
            tls=self.tls,
            token=self.token or None,
            credentials_from_env=False,
            http2=self.http2,
        )

    async def job_states(
        self, group: str, addresses: Sequence[str]
    ) -> tuple[list[AgentJobView], bool]:
        """What every agent says of `group`'s jobs, and whether every agent answered:
        from its session for an agent in session, else from its answer to Status."""
        views: list[AgentJobView] = []
        asked = []
        for address in addresses:
            if (seen := self._view_at(address)) is not None:
                name, view = seen
                views += [AgentJobView(agent=name, job=j, state=s) for j, s in view.states(group)]
            else:
                asked.append(address)
        answers = await asyncio.gather(*(self.status(a) for a in asked), return_exceptions=True)
        for address, answer in zip(asked, answers, strict=True):
            if isinstance(answer, StatusResponse):
                agent = answer.node_name or address
                views += [
                    AgentJobView(agent=agent, job=job.job_id, state=_named(job.state))
                    for job in answer.job_statuses
                    if job.group in (group, "")
                ]
        return views, all(isinstance(a, StatusResponse) for a in answers)

    async def close(self) -> None:
        for asking in list(self._asking.values()):
            asking.cancel()
        clients, self._clients = self._clients, {}
        await asyncio.gather(*(c.close() for c in clients.values()), return_exceptions=True)


# The job states an agent may name ("IDLE", ... "FAULTED", and "UNSPECIFIED").
_STATES = frozenset(
    name.removeprefix("JOB_STATE_")
    for name in apb.JobState.betterproto_renamed_proto_names_to_value()
)


def state_name(state: apb.JobState) -> str:
    """A job state as `AgentJobView` names it ("SAVED", ...)."""
    return _named(enum_name(state))


def _named(proto_name: str) -> str:
    """A job state's proto name ("JOB_STATE_SAVED") as `AgentJobView` names it; a
    state this orchestrator does not know (a newer agent's, or one an agent made up)
    is "UNSPECIFIED", so that a status shows the job rather than fails."""
    state = proto_name.removeprefix("JOB_STATE_")
    return state if state in _STATES else "UNSPECIFIED"
