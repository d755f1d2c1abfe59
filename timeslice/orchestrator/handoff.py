"""The handoff driver: moves the contexts on a group's nodes before a grant.

When the lock table grants a group that spans nodes to a job whose context is
not the loaded one, it says `SwitchStarted` (after the grant is journaled) and
waits. The driver then asks the agent of every node of the group, all at once,
to switch the group to that job (`SwitchGroup`: every other live context
snapshotted, then the job's restored if it was saved), each request carrying
the grant's fencing token and the switch's deadline, and feeds what they did
back as one `SwitchDone`: only then is the grant announced. Nothing polls: each
agent answers when its part is done.

A switch is idempotent on the agents (each works from where its contexts really
are), so an orchestrator that restarts with a switch in its journal simply
runs it again. An agent that cannot be reached is retried until the deadline;
then the switch fails and the grant goes to the next waiter.

Each request proves its token with the key the node's agent gave in its session
(`timeslice.fencing`), so that the agent takes the token without asking back. An
agent that keeps a session but has none open (this orchestrator has just started
or taken over, and the agent is still leaving the one before) is waited for a
little (`SESSION_WAIT`): unproven, the token would have the agent ask an
orchestrator whether it was issued, perhaps the frozen active it is leaving.

The job the table names as revoked (`Group.revoked_job`: it lost the group by
its lease, a hold limit, its workload going or a force release, not by
yielding) may be a frozen process that never answers its snapshot. Its
snapshot is bounded by the shorter `revoked_snapshot_timeout`, told to each
agent per job (`SwitchJob.snapshot_timeout_ms`): when it runs out the agent
faults that job, the switch goes on, and the job is quarantined here as for any
failed snapshot. A yielding holder's snapshot has the whole switch timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from timeslice._failpoints import SWITCH_JOURNALED, SWITCH_MOVED, failpoint
from timeslice.api.gen.snapshot_agent import v1alpha1 as apb
from timeslice.client.agent import AsyncSnapshotAgentClient
from timeslice.errors import ConflictError, LeaseLostError, TimeSliceError
from timeslice.fencing import token_proof
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.agents import AgentDirectory
from timeslice.orchestrator.events import Effect, Event
from timeslice.orchestrator.state import LockTable


class Journaled(Protocol):
    """What the driver needs of the orchestrator: its table, to read, and the way
    to hand it a switch's end."""

    @property
    def table(self) -> LockTable: ...

    def apply(self, event: Event) -> asyncio.Future[list[Effect]]: ...


log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class NodeResult:
    """One node's part of a switch, as `SwitchDone` needs it."""

    node: str
    restored: bool = False
    faults: tuple[tuple[str, str], ...] = ()
    moved_bytes: int = 0
    error: str = ""
    # (node, job, kind, seconds, bytes) of each operation the agent ran
    steps: tuple[tuple[str, str, str, float, int], ...] = ()


_Running = tuple[int, asyncio.Task[None], list[asyncio.Task[NodeResult]]]


def _cancel(running: _Running) -> None:
    """Drop a switch, and its nodes' calls with it (a call not begun never begins)."""
    _, task, calls = running
    task.cancel()
    for call in calls:
        call.cancel()


class HandoffDriver:
    """Runs the switches the lock table starts, one task per group."""

    def __init__(
        self,
        journaled: Journaled,
        agents: AgentDirectory,
        timeout: float,
        revoked_snapshot_timeout: float | None = None,
    ) -> None:
        self.journaled = journaled
        self.agents = agents
        self.timeout = timeout
        # None: a revoked holder's snapshot has the whole switch, as any other.
        self.revoked_snapshot_timeout = revoked_snapshot_timeout
        # Per group, the switch running: its token, its task, and its nodes' calls.
        self._running: dict[str, _Running] = {}
        self._clients: dict[str, AsyncSnapshotAgentClient] = {}
        # Each job's SwitchJob as it was last sent, encoded, by what it is made of.
        self._encoded_jobs: dict[tuple[str, str, int, str], bytes] = {}

    def start(self, switch: ev.SwitchStarted) -> None:
        """Run `switch`; one still running for an older grant of the group is dropped
        (the table ignores its result, and each agent finishes one before the next)."""
        running = self._running.get(switch.group)
        if running is not None:
            if running[0] == switch.token:
                return
            _cancel(running)
        failpoint(SWITCH_JOURNALED)
        began = time.time()
        deadline = began + self.timeout
        # Read from the table, not the effect: a switch run again after a restart
        # is started without one.
        g = self.journaled.table.groups.get(switch.group)
        revoked = g.revoked_job if g is not None else ""
        loop = asyncio.get_running_loop()
        # A task per node, started here rather than by the switch's own task: the
        # agents are asked in the next turn of the loop, ahead of the answers that
        # turn writes (the Yield's that started the switch among them).
        calls = [
            loop.create_task(self._node(node, switch, deadline, revoked))
            for node in self.journaled.table.nodes.get(switch.group, ())
        ]
        task = loop.create_task(self._switch(switch, began, calls))
        self._running[switch.group] = (switch.token, task, calls)
        task.add_done_callback(lambda _: self._forget(switch.group, task))

    def _forget(self, group: str, task: asyncio.Task[None]) -> None:
        if (running := self._running.get(group)) is not None and running[1] is task:
            del self._running[group]

    async def close(self) -> None:
        running = list(self._running.values())
        for switch in running:
            _cancel(switch)
        await asyncio.gather(*(task for _, task, _ in running), return_exceptions=True)
        clients, self._clients = self._clients, {}
        await asyncio.gather(*(c.close() for c in clients.values()), return_exceptions=True)

    async def _switch(
        self, switch: ev.SwitchStarted, began: float, calls: list[asyncio.Task[NodeResult]]
    ) -> None:
        """Wait for every node's part of `switch` (`calls`), then journal its end.
        Cancelled (a newer grant of the group), it cancels the calls."""
        results = await asyncio.gather(*calls)
        if any(r.error == _SUPERSEDED for r in results):
            return  # a newer grant of the group took over; its switch does the work
        failpoint(SWITCH_MOVED)
        errors = [f"{r.node}: {r.error}" for r in results if r.error]
        faults = dict(f for r in results for f in r.faults)  # one reason per job
        done = ev.SwitchDone(
            now=time.time(),
            group=switch.group,
            token=switch.token,
            restored=any(r.restored for r in results),
            faults=tuple(faults.items()),
            error="; ".join(errors),
            moved_bytes=sum(r.moved_bytes for r in results),
            began=began,
            steps=tuple(step for r in results for step in r.steps),
        )
        try:
            self.journaled.apply(done)
        except TimeSliceError as exc:  # the orchestrator stopped meanwhile
            log.info("switch of %s ended without effect: %s", switch.group, exc)

    async def _node(
        self, node: str, switch: ev.SwitchStarted, deadline: float, revoked: str
    ) -> NodeResult:
        registered = self.journaled.table.agents
        address = await self.agents.wait_address(node, registered, deadline)
        if address is None:
            return NodeResult(node=node, error="no agent registered for this node in time")
        now = time.time()
        await self.agents.wait_session(
            node, registered, now + min(SESSION_WAIT, (deadline - now) / 2)
        )
        left = deadline - time.time()
        # This orchestrator's epoch: an agent that has seen a newer one (this one was
        # deposed) refuses the switch and moves nothing.
        epoch = self.journaled.table.epoch
        try:
            key = self.agents.token_key(node)
            proof = token_proof(key, switch.group, switch.token, epoch=epoch) if key else b""
            answer = await self._client(address).switch_group(
                switch.group,
                switch.job,
                switch.token,
                jobs=list(self._jobs(switch.group, node, revoked)),
                timeout_sec=max(left, 0.001),
                token_proof=proof,
                orchestrator_epoch=epoch,
            )
        except LeaseLostError:
            return NodeResult(node=node, error=_SUPERSEDED)
        except ConflictError as exc:  # refused: a newer orchestrator, a token it never saw
            log.warning(
                "switch of %s to %s (token %d, epoch %d) refused by agent %s of %s: %s",
                switch.group,
                switch.job or "nobody",
                switch.token,
                epoch,
                address,
                node,
                exc.message,
            )
            return NodeResult(node=node, error=f"agent {address}: {exc.message}")
        except TimeSliceError as exc:
            return NodeResult(
                node=node, error=f"agent {address}: {exc.message or type(exc).__name__}"
            )
        self.agents.switched(switch.group, answer)
        return _node_result(node, switch.job, answer, revoked, self._revoked_limit())

    def _revoked_limit(self) -> float | None:
        """The revoked job's snapshot limit, when it is shorter than the switch."""
        limit = self.revoked_snapshot_timeout
        return limit if limit is not None and limit < self.timeout else None

    def _jobs(self, group: str, node: str, revoked: str) -> Iterable[bytes]:
        """The group's jobs the table knows, each with the backend it registered
        (and the revoked one with its shorter snapshot limit): `SwitchJob`s,
        encoded (each once for as long as it stays the same)."""
        table = self.journaled.table
        g = table.groups.get(group)
        registered = table.job_backends.get(group, {})
        known = set(registered) | ({revoked} if revoked else set())
        if g is not None:
            known |= {*g.queue, *g.last_served, *g.quarantined}
            if g.holder is not None:
                known.add(g.holder.job)
        limit = self._revoked_limit()
        limit_ms = max(1, round(limit * 1000)) if limit is not None else 0
        for job in sorted(known):
            config = registered.get(job, {})
            where = node if node in config else ""
            chosen = config.get(where)
            by = table.registrant(group, job, where) if chosen is not None else ""
            job_limit = limit_ms if job == revoked else 0
            key = (job, json.dumps(chosen, sort_keys=True), job_limit, by)
            if (encoded := self._encoded_jobs.get(key)) is None:
                backend = apb.BackendConfig.from_dict(chosen) if chosen is not None else None
                message = apb.SwitchJob(
                    job_id=job,
                    backend_config=backend,
                    snapshot_timeout_ms=job_limit,
                    registered_by=by,
                )
                if len(self._encoded_jobs) >= _ENCODED_JOBS:
                    self._encoded_jobs.clear()
                encoded = self._encoded_jobs[key] = bytes(message)
            yield encoded

    def _client(self, address: str) -> AsyncSnapshotAgentClient:
        client = self._clients.get(address)
        if client is None:
            # Retried while unreachable for as long as a switch may take.
            client = self.agents.new_client(address, reconnect_timeout_sec=self.timeout)
            self._clients[address] = client
        return client


_SUPERSEDED = "superseded by a newer grant"
# How long a switch waits for a node's agent that keeps a session to open one,
# when it has none open (this orchestrator has just started or taken over, and the
# agent is still leaving the one before): at most this, and at most half the
# switch's time. Its session brings the key the switch proves its token with;
# without one the agent must ask an orchestrator whether the token was issued, and
# it may ask the frozen active it has not given up on yet (2 s of unanswered pings).
SESSION_WAIT = 3.0
# Encoded SwitchJobs kept at most (then dropped all at once, and made again).
_ENCODED_JOBS = 4096
_FAILED = apb.OperationStatus.FAILED


def _node_result(
    node: str,
    target: str,
    answer: apb.SwitchGroupResponse,
    revoked: str = "",
    revoked_limit: float | None = None,
) -> NodeResult:
    faults: list[tuple[str, str]] = []
    for step in answer.steps:
        if step.operation_id and step.status == _FAILED:
            reason = f"{step.kind} failed on {node}: {step.error or '?'}"
            if step.job_id == revoked and step.kind == "snapshot" and revoked_limit:
                # Say why it had so little time: an operator resets it once it runs.
                reason += f" (revoked holder: its snapshot had {revoked_limit:g} s)"
            faults.append((step.job_id, reason))
        elif step.operation_id and step.status != apb.OperationStatus.COMPLETE:
            faults.append((step.job_id, f"{step.kind} did not finish in time on {node}"))
        elif step.refused:
            faults.append((step.job_id, f"{step.kind} refused on {node}: {step.error or '?'}"))
        elif not step.operation_id:
            log.info("switch on %s: no %s of %s: %s", node, step.kind, step.job_id, step.error)
    for job in answer.faulted:
        if job.job_id == target:  # its context cannot be made live here
            faults.append((target, f"faulted on {node}: {job.fault or 'no reason given'}"))
    moved = sum(step.storage_bytes for step in answer.steps)
    steps = tuple(
        (node, s.job_id, s.kind, s.elapsed_ms / 1000, s.storage_bytes)
        for s in answer.steps
        if s.operation_id
    )
    return NodeResult(
        node=node, restored=answer.restored, faults=tuple(faults), moved_bytes=moved, steps=steps
    )
