"""The agent's link to its orchestrator: it registers itself and reports its jobs.

One long-lived `AgentSession` stream: a report when it opens (node name, address,
groups to join, every job with its state and liveness) and another whenever what
the orchestrator acts on changes: a job appearing or leaving, or its liveness
(its workload channel closing, its processes exiting: each watched through a
pidfd, so an exit is reported at once, nothing polled). A change of a job's state
alone (a context moved) is reported too, `STATE_REPORT_DELAY` later with every
other such change meanwhile: the orchestrator answers GetGroupStatus from the
reports, and it has heard how each switch it asked for left the jobs already, in
the switch's answer. Every report carries the job table's version, so that the
orchestrator keeps the newest word whatever order they arrive in. A broken stream is opened again
with backoff, so that a restarted orchestrator hears from every agent within
about a second of its start. The target may list several orchestrators (an
active and its standbys): a session refused or broken is opened on the next one,
or on the active a standby names (`timeslice.client._connector`: the standby's
refusal comes while the first report is being sent, and its trailers are read
from the stream for the connector), and a frozen orchestrator is left once its
pings go unanswered.

Whether the orchestrator issued a fencing token (`issued`) is asked on the
session's own connection while one is open: the orchestrator that took the
session is the one whose tokens the agent is being sent, and a candidate the
agent left (frozen, deposed) is not waited on again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from grpclib.client import Channel, Stream
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from timeslice.agent.config import AgentConfig
from timeslice.agent.messages import job_status
from timeslice.agent.state import Job, JobTable
from timeslice.api.gen.snapshot_agent import v1alpha1 as apb
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as opb
from timeslice.backends import AcceleratorMemory
from timeslice.client._connector import Connector, answered, with_trailers
from timeslice.client._transport import backoff_cap, backoff_delays, in_own_task
from timeslice.client.orchestrator import AsyncTimeSliceOrchestratorClient
from timeslice.errors import NotFoundError
from timeslice.fencing import new_key
from timeslice.kinds import Liveness
from timeslice.security.tls import ClientTls
from timeslice.targets import parse_targets


@dataclass(frozen=True, kw_only=True)
class Issued:
    """What the orchestrator says it has issued for a group: its newest fencing
    token, and the epoch it serves in."""

    token: int
    epoch: int


class Reporting(Protocol):
    """What the link reports of the agent."""

    config: AgentConfig

    @property
    def address(self) -> str: ...

    @property
    def table(self) -> JobTable: ...

    def watch_changes(self, listener: Callable[[], None] | None) -> None: ...

    def liveness(self, job: Job) -> Liveness: ...

    async def accelerators(self) -> list[AcceleratorMemory]: ...


log = logging.getLogger(__name__)

AGENT_SESSION = "/timeslice_orchestrator.v1alpha1.TimeSliceOrchestratorService/AgentSession"
# A session that lasted this long was healthy: the next reconnect starts fast again.
HEALTHY_SESSION_SEC = 5.0
# How long a command with a fencing token (or orchestrator epoch) new to this
# agent waits for the orchestrator to say whether it issued that token.
TOKEN_CHECK_TIMEOUT_SEC = 5.0
# How long a change of job states alone waits to be reported, with those after it.
STATE_REPORT_DELAY = 0.05
# How long a closing agent waits for the orchestrator to take the end of its
# session (so that it is told the agent left, not that it was lost).
CLOSE_TIMEOUT_SEC = 1.0


class OrchestratorLink:
    """Keeps `agent` registered with the orchestrator at `target` while it runs."""

    def __init__(
        self,
        agent: Reporting,
        target: str,
        *,
        tls: ClientTls | None = None,
        token: str = "",
    ) -> None:
        self.agent = agent
        self.target = target
        self._targets = parse_targets(target)
        # The session's credentials (`AgentConfig.orchestrator_tls`, `orchestrator_token`).
        self.tls = tls
        self.token = token or None
        self._task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._pidfds: dict[int, int] = {}
        # While a session is open: set when a report is due; what the last one said
        # (see `_keys`); the timer of a report of changed states alone.
        self._report_due: asyncio.Event | None = None
        self._reported: tuple[tuple[object, ...], tuple[object, ...]] | None = None
        self._state_report: asyncio.TimerHandle | None = None
        self._accelerators: list[apb.AcceleratorStatus] = []
        #: Reports the orchestrator has accepted (tests and logs read it).
        self.reports_sent = 0
        self._client: AsyncTimeSliceOrchestratorClient | None = None
        # The open session's connection (its orchestrator took the session).
        self._session_channel: Channel | None = None
        #: This process's session key: the orchestrator proves its tokens with it.
        self.token_key = new_key()

    async def issued(self, group: str) -> Issued:
        """The newest fencing token the orchestrator has issued for `group`, and its
        epoch (both 0: it does not know the group). Asked on the open session's
        connection, or (none open, or that one failing) of the target's candidates
        in turn."""
        channel = self._session_channel
        if channel is not None:
            stub = opb.TimeSliceOrchestratorServiceStub(channel)
            request = opb.GetGroupStatusRequest(group_id=group, lock_only=True)
            try:
                answer = await in_own_task(
                    stub.get_group_status(request, timeout=TOKEN_CHECK_TIMEOUT_SEC)
                )
            except (GRPCError, StreamTerminatedError, OSError, TimeoutError) as exc:
                if isinstance(exc, GRPCError) and exc.status is Status.NOT_FOUND:
                    return Issued(token=0, epoch=0)
                log.info("asking the session's orchestrator about %r failed: %s", group, exc)
            else:
                if answer.group is None:
                    return Issued(token=0, epoch=0)
                return Issued(token=answer.group.fencing_token, epoch=answer.group.epoch)
        if self._client is None:
            self._client = AsyncTimeSliceOrchestratorClient(
                self.target,
                lease_ttl_sec=None,
                call_timeout_sec=TOKEN_CHECK_TIMEOUT_SEC,
                reconnect_timeout_sec=TOKEN_CHECK_TIMEOUT_SEC,
                tls=self.tls,
                token=self.token,
                credentials_from_env=False,
            )
        try:
            status = await self._client.get_status(
                group, timeout_sec=TOKEN_CHECK_TIMEOUT_SEC, lock_only=True
            )
        except NotFoundError:
            return Issued(token=0, epoch=0)
        return Issued(token=status.group.fencing_token, epoch=status.group.epoch)

    def start(self) -> None:
        self._closing.clear()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._task is not None:
            # End the session's stream first, as a clean leave; then stop trying.
            self._closing.set()
            await asyncio.wait({self._task}, timeout=CLOSE_TIMEOUT_SEC)
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for pid in list(self._pidfds):
            self._unwatch(pid)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        cap = backoff_cap(len(self._targets))
        delays = backoff_delays(cap)
        connector = Connector(self._targets, self.tls, self.token)
        try:
            while not self._closing.is_set():
                channel = await connector.channel()
                began = loop.time()
                ended: Exception | None = None
                try:
                    # In a task of its own: grpclib's cancellations when the
                    # connection drops stay with it (see `in_own_task`).
                    await in_own_task(self._session(channel))
                except Exception as exc:  # down, restarting, a standby, or it ended it
                    ended = exc
                    log.info("session with orchestrator %s ended: %s", self.target, exc)
                finally:
                    # A new connection for the next session: to the next candidate if
                    # there are several, or to the active a standby named.
                    connector.failed(channel, close=True, refused=answered(ended), error=ended)
                if loop.time() - began > HEALTHY_SESSION_SEC:
                    delays = backoff_delays(cap)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), next(delays))
        finally:
            connector.close()

    async def _session(self, channel: Channel) -> None:
        stream: Stream[opb.AgentReport, opb.AgentSessionEnd] | None = None
        try:
            async with channel.request(
                AGENT_SESSION, Cardinality.STREAM_UNARY, opb.AgentReport, opb.AgentSessionEnd
            ) as stream:
                await self._reporting(channel, stream)
        except GRPCError as exc:
            raise with_trailers(exc, stream) from None

    async def _reporting(
        self, channel: Channel, stream: Stream[opb.AgentReport, opb.AgentSessionEnd]
    ) -> None:
        """The session on `stream` (of `channel`): reports, until the orchestrator ends
        it or the agent leaves."""
        await stream.send_request()
        # Registration says which accelerators the node has (their ids and sizes).
        self._accelerators = [
            apb.AcceleratorStatus(
                id=m.id, memory_used_bytes=m.used_bytes, memory_total_bytes=m.total_bytes
            )
            for m in await self.agent.accelerators()
        ]
        # The orchestrator answers only when it ends the session (or the
        # connection breaks): waiting for that answer tells us.
        ended = asyncio.ensure_future(stream.recv_message())
        closing = asyncio.ensure_future(self._closing.wait())
        self._reported = None
        self._report_due = due = asyncio.Event()
        due.set()  # the first report goes at once
        self.agent.watch_changes(self._changed)
        self._session_channel = channel
        try:
            while True:
                waiting = asyncio.ensure_future(due.wait())
                try:
                    await asyncio.wait(
                        {ended, waiting, closing}, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    waiting.cancel()  # also when this task is cancelled
                if closing.done() and not ended.done():
                    await stream.end()  # the agent leaves: the orchestrator answers
                    await ended
                if ended.done():
                    ended.result()  # raises why the orchestrator ended it
                    return
                if due.is_set():
                    due.clear()
                    self._cancel_state_report()
                    jobs = self._jobs()
                    # Changes made while it is sent are weighed against it.
                    self._reported = _keys(jobs)
                    await stream.send_message(self._report(jobs))
                    self.reports_sent += 1
        finally:
            self._session_channel = None
            self.agent.watch_changes(None)
            self._report_due = None
            self._cancel_state_report()
            for left in (ended, closing):
                left.cancel()
            await asyncio.gather(ended, closing, return_exceptions=True)

    def _changed(self) -> None:
        """After every saved change of the job table, and when a watched process ends:
        a report is due at once when what the orchestrator acts on changed, and
        `STATE_REPORT_DELAY` later when only states did. Synchronous and cheap: it runs
        in the save's own callback, and wakes the session only to send."""
        due = self._report_due
        if due is None or due.is_set() or self._reported is None:
            return  # no session, or a report on its way that will say it all
        seen, states = _keys(self._jobs())
        reported_seen, reported_states = self._reported
        if seen != reported_seen:
            due.set()
        elif states == reported_states:
            self._cancel_state_report()  # back to what the orchestrator has heard
        elif self._state_report is None:
            self._state_report = asyncio.get_running_loop().call_later(STATE_REPORT_DELAY, due.set)

    def _cancel_state_report(self) -> None:
        if self._state_report is not None:
            self._state_report.cancel()
            self._state_report = None

    def _jobs(self) -> list[tuple[Job, Liveness]]:
        """Every job with its liveness now; the processes of the live ones watched
        from here on."""
        jobs = []
        watched: set[int] = set()
        for job in self.agent.table.jobs.values():
            liveness = self.agent.liveness(job)
            jobs.append((job, liveness))
            if liveness is Liveness.ALIVE:
                watched |= {int(c.removeprefix("pid:")) for c in job.claims if c.startswith("pid:")}
        self._watch(watched)
        return jobs

    def _report(self, jobs: list[tuple[Job, Liveness]]) -> opb.AgentReport:
        """The agent as the orchestrator should see it, with `jobs` (see `_jobs`)."""
        agent, config = self.agent, self.agent.config
        return opb.AgentReport(
            node_name=config.node_name,
            address=config.advertise or agent.address,
            groups=list(config.groups),
            jobs=[job_status(job, liveness) for job, liveness in jobs],
            accelerators=self._accelerators,
            token_key=self.token_key,
            table_version=agent.table.version,
        )

    # --- processes ending -------------------------------------------------------------

    def _watch(self, pids: set[int]) -> None:
        for pid in set(self._pidfds) - pids:
            self._unwatch(pid)
        for pid in pids - set(self._pidfds):
            try:
                fd = os.pidfd_open(pid)
            except (ProcessLookupError, OSError, AttributeError):
                continue  # gone already, or no pidfds here: liveness is read at each report
            self._pidfds[pid] = fd
            asyncio.get_running_loop().add_reader(fd, self._ended, pid)

    def _ended(self, pid: int) -> None:
        self._unwatch(pid)
        self._changed()

    def _unwatch(self, pid: int) -> None:
        fd = self._pidfds.pop(pid, None)
        if fd is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)


def _keys(jobs: list[tuple[Job, Liveness]]) -> tuple[tuple[object, ...], tuple[object, ...]]:
    """What of a report the orchestrator acts on (which jobs there are, with which
    liveness), and where each job's context is."""
    seen = tuple(sorted((job.group, job.job, liveness.value) for job, liveness in jobs))
    states = tuple(sorted((job.group, job.job, job.state.value) for job, _ in jobs))
    return seen, states
