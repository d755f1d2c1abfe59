"""One node's part of a switch: every other live context of the group out, then the
next holder's in.

The orchestrator sends one `SwitchGroup` per node when a group changes hands. The
agent works from its own job table, which says where each context really is, so
the same request sent again (after an orchestrator restart, say) finishes what
is left and changes nothing that is done: a switch is idempotent. Each step is
an ordinary operation of the table, started with the group's fencing token and
bounded by the switch's deadline; a step that fails quarantines its job (FAULTED)
and the switch goes on with the others.

A job the orchestrator gives a snapshot limit of its own (a holder that lost the
group without yielding: its process may be frozen) has its snapshot started
with that shorter timeout. When it runs out the table fails the operation and
faults the job like any operation past its deadline, and the next job is
restored without waiting for the rest of the switch. The frozen workload may
still carry the command out when it wakes: its answer then comes too late for
the operation and changes nothing in the table (the job stays FAULTED, so no
switch moves it), while its channel learns where the context went, so that a
reset reconciles the job to where it really is; until the workload answers, a
reset leaves it FAULTED, its state unknown.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from timeslice.agent import state as st
from timeslice.agent.state import Job, JobState, Operation, OpStatus
from timeslice.errors import LeaseLostError, TimeSliceError

if TYPE_CHECKING:
    from timeslice.agent.server import Agent


@dataclass(frozen=True)
class BackendChoice:
    """The backend a job registered with the orchestrator: name, job config and
    operation parameters, as `backend_of` decodes them."""

    backend: str | None
    config: dict[str, Any] | None
    params: dict[str, Any]


@dataclass(frozen=True)
class SwitchStep:
    """One operation the switch ran (or tried to start: then `op` is None)."""

    job: str
    kind: str
    op: Operation | None
    error: str = ""


@dataclass(frozen=True)
class SwitchReport:
    """What a switch did on this node, and where it left the group's jobs."""

    steps: list[SwitchStep]
    restored: bool
    next_state: JobState | None
    faulted: list[Job]


async def switch_group(
    agent: Agent,
    group: str,
    next_job: str,
    token: int,
    timeout: float,
    jobs: Mapping[str, BackendChoice | None],
    snapshot_limits: Mapping[str, float] | None = None,
) -> SwitchReport:
    """Snapshot every live context of `group` but `next_job`'s, then restore
    `next_job`'s if it is saved. `jobs` are the group's jobs the orchestrator
    knows, with the backend each registered (None: none registered);
    `snapshot_limits` the seconds a job's snapshot may take at most, for jobs
    whose snapshot must end before the switch's deadline."""
    deadline = time.time() + timeout
    async with agent.switch_lock(group):
        newest = agent.table.tokens.get(group, 0)
        if token < newest:
            raise LeaseLostError(
                f"stale fencing token {token} for group {group!r} (newest seen {newest})"
            )
        await _settle(agent, group, jobs, deadline)
        steps = await _evict(agent, group, next_job, token, jobs, deadline, snapshot_limits or {})
        target = agent.table.find(group, next_job) if next_job else None
        if target is not None and target.state is JobState.SAVED:
            choice = jobs.get(next_job)
            steps += await _run_all(agent, group, st.RESTORE, {next_job: choice}, token, deadline)
            target = agent.table.find(group, next_job)
        # The snapshots' ends are saved with the restore's start (one write for both);
        # nothing is answered before all of it is saved.
        await agent.flush()
    restored = False
    if target is not None:
        op = agent.table.operations.get(target.operation)
        restored = (
            target.state is JobState.RUNNING
            and op is not None
            and op.kind == st.RESTORE
            and op.token == token
            and op.status is OpStatus.COMPLETE
        )
    faulted = [j for j in _members(agent, group, jobs) if j.state is JobState.FAULTED]
    return SwitchReport(steps, restored, target.state if target else None, faulted)


def _members(agent: Agent, group: str, jobs: Mapping[str, object]) -> list[Job]:
    """The group's jobs on this node: those registered in it, and those registered
    without a group that the orchestrator names as the group's."""
    return [
        j
        for j in agent.table.jobs.values()
        if j.group == group or (j.group == "" and j.job in jobs)
    ]


async def _settle(agent: Agent, group: str, jobs: Mapping[str, object], deadline: float) -> None:
    """Wait for operations already moving the group's jobs (a switch sent before
    an orchestrator restart, a caller's own snapshot) to finish."""
    for job in _members(agent, group, jobs):
        if job.state is JobState.TRANSITIONING:
            await agent.operation(job.operation, max(0.0, deadline - time.time()))


async def _evict(
    agent: Agent,
    group: str,
    next_job: str,
    token: int,
    jobs: Mapping[str, BackendChoice | None],
    deadline: float,
    limits: Mapping[str, float],
) -> list[SwitchStep]:
    live = {
        j.job: jobs.get(j.job)
        for j in _members(agent, group, jobs)
        if j.state is JobState.RUNNING and j.job != next_job
    }
    # A job registered with a backend but not known here yet (a plain process
    # never moved) holds its context on the accelerators from its start.
    for job, choice in jobs.items():
        if job != next_job and choice is not None and choice.backend is not None:
            if agent.table.find(group, job) is None:
                live[job] = choice
    return await _run_all(agent, group, st.SNAPSHOT, live, token, deadline, limits)


async def _run_all(
    agent: Agent,
    group: str,
    kind: str,
    jobs: Mapping[str, BackendChoice | None],
    token: int,
    deadline: float,
    limits: Mapping[str, float] | None = None,
) -> list[SwitchStep]:
    """Start `kind` for every job at once, then wait for all of them to end; a job
    in `limits` has its operation bounded by that many seconds too."""
    limits = limits or {}
    starts = [
        _start(agent, group, kind, job, choice, token, deadline, limits.get(job))
        for job, choice in jobs.items()
    ]
    # One job starts right here, in this turn of the loop: a restore started as the
    # snapshots end then shares their write of the job table.
    started = [await starts[0]] if len(starts) == 1 else await asyncio.gather(*starts)
    for step in started:
        if step.op is not None:
            await agent.ended(step.op.op_id, max(0.0, deadline - time.time()))
    return [
        SwitchStep(s.job, s.kind, agent.table.operations.get(s.op.op_id, s.op)) if s.op else s
        for s in started
    ]


async def _start(
    agent: Agent,
    group: str,
    kind: str,
    job: str,
    choice: BackendChoice | None,
    token: int,
    deadline: float,
    limit: float | None = None,
) -> SwitchStep:
    left = deadline - time.time()
    if left <= 0:
        return SwitchStep(job, kind, None, "the switch's deadline passed first")
    # The operation's own deadline, not a wait: the table fails it when it passes
    # (and cancels the backend's call), whether or not the backend ever answers.
    if limit is not None:
        left = min(left, limit)
    known = agent.table.find(group, job) is not None
    try:
        op_id = await agent.start_operation(
            kind,
            group,
            job,
            # A job the table knows keeps the backend it is known by.
            backend=None if known or choice is None else choice.backend,
            config=None if known or choice is None else choice.config,
            params=choice.params if choice is not None else None,
            token=token,
            timeout=left,
        )
    except TimeSliceError as exc:
        return SwitchStep(job, kind, None, exc.message or type(exc).__name__)
    return SwitchStep(job, kind, agent.table.operations[op_id])
