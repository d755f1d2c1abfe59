"""One node's part of a switch: every other live context of the group out, then the
next holder's in.

The orchestrator sends one `SwitchGroup` per node when a group changes hands. The
agent works from its own job table, which says where each context really is and
decides each stage (`JobTable` answers `PlanSwitch`: what to wait for, what to
snapshot, whether to restore, whether it restored); this module only carries the
stages out, under the group's switch lock. So the same request sent again
(after an orchestrator restart, say) finishes what is left and changes nothing
that is done: a switch is idempotent. Each step is an ordinary operation of the
table, started with the group's fencing token and bounded by the switch's
deadline; a step that fails quarantines its job (FAULTED) and the switch goes
on with the others.

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

The restore starts once every snapshot has ended, unless the next job's backend
can bring its context back step by step (a workload that moves it tag by tag):
then it starts with the snapshots, and each step comes in once the snapshots
have freed room for it (`timeslice.agent.pipeline`), so that the two transfers
overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from timeslice.agent import state as st
from timeslice.agent.pipeline import Pace
from timeslice.agent.state import Job, JobState, JobTable, Operation
from timeslice.errors import TimeSliceError
from timeslice.kinds import OpKind


_E = TypeVar("_E", bound=st.Effect)


class SwitchHost(Protocol):
    """What a switch needs of the agent."""

    @property
    def table(self) -> JobTable: ...

    def switch_lock(self, group: str) -> contextlib.AbstractAsyncContextManager[Any]: ...

    async def start_operation(
        self,
        kind: OpKind,
        group: str,
        job: str,
        *,
        backend: str | None = None,
        config: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        token: int = 0,
        timeout: float | None = None,
        pace: Pace | None = None,
    ) -> str: ...

    def pipelines(self, group: str, job: str) -> bool: ...

    async def operation(self, op_id: str, wait: float = 0.0) -> Operation: ...

    async def ended(self, op_id: str, wait: float) -> None: ...

    async def flush(self) -> None: ...


@dataclass(frozen=True, kw_only=True)
class BackendChoice:
    """The backend a job registered with the orchestrator: name, job config and
    operation parameters, as `backend_of` decodes them."""

    backend: str | None
    config: dict[str, Any] | None
    params: dict[str, Any]
    # Why the agent may not act on this config for the job ("" it may): it names
    # processes the job's registrant does not own.
    refusal: str = ""


@dataclass(frozen=True, kw_only=True)
class SwitchStep:
    """One operation the switch ran (or tried to start: then `op` is None, and
    `refused` when the agent would not act on the job's registered backend)."""

    job: str
    kind: OpKind
    op: Operation | None
    error: str = ""
    refused: bool = False
    # Seconds it ran while the switch's snapshots were still under way (a restore
    # that came in with them).
    overlap: float = 0.0


@dataclass(frozen=True, kw_only=True)
class SwitchReport:
    """What a switch did on this node, and where it left the group's jobs."""

    steps: list[SwitchStep]
    restored: bool
    next_state: JobState | None
    faulted: list[Job]


async def switch_group(
    host: SwitchHost,
    group: str,
    next_job: str,
    token: int,
    timeout: float,
    jobs: Mapping[str, BackendChoice | None],
    snapshot_limits: Mapping[str, float] | None = None,
    *,
    epoch: int = 0,
) -> SwitchReport:
    """Snapshot every live context of `group` but `next_job`'s, then restore
    `next_job`'s if it is saved. `jobs` are the group's jobs the orchestrator
    knows, with the backend each registered (None: none registered);
    `snapshot_limits` the seconds a job's snapshot may take at most, for jobs
    whose snapshot must end before the switch's deadline; `epoch` the
    orchestrator's that sent it (the table refuses it, moving nothing, when a
    newer orchestrator has taken over)."""
    deadline = time.time() + timeout
    named = tuple(jobs)
    registered = tuple(j for j, c in jobs.items() if c is not None and c.backend is not None)

    def plan(stage: st.SwitchStage, expected: type[_E]) -> _E:
        [step] = host.table.handle(
            st.PlanSwitch(
                now=time.time(),
                group=group,
                job=next_job,
                token=token,
                stage=stage,
                jobs=named,
                registered=registered,
                epoch=epoch,
            )
        )
        if not isinstance(step, expected):
            raise TypeError(f"not a switch step: {step!r}")
        return step

    async def start_restore(pace: Pace | None) -> list[SwitchStep]:
        restore = plan(st.SwitchStage.RESTORE, st.StartOperations)
        choices = {job: jobs.get(job) for job in restore.jobs}
        return await _start_all(host, group, st.RESTORE, choices, token, deadline, pace=pace)

    async with host.switch_lock(group):
        for op_id in plan(st.SwitchStage.SETTLE, st.AwaitOperations).op_ids:
            await host.operation(op_id, max(0.0, deadline - time.time()))
        # The snapshots tell `pace` what they free; a restore that can go step by
        # step starts with them and comes in as fast as they make room, else it
        # starts once they have all ended.
        pace = Pace()
        evict = plan(st.SwitchStage.EVICT, st.StartOperations)
        limits = snapshot_limits or {}
        choices = {job: jobs.get(job) for job in evict.jobs}
        pipelined = host.pipelines(group, next_job)
        snapshots = await _start_all(
            host, group, st.SNAPSHOT, choices, token, deadline, limits, pace
        )
        restores = await start_restore(pace) if pipelined else []
        snapshots = await _wait_all(host, snapshots, deadline)
        pace.open()
        snapshots_ended = time.time()
        if not pipelined:
            # One job starts right here, in this turn of the loop: a restore started as
            # the snapshots end then shares their write of the job table.
            restores = await start_restore(None)
        restores = await _wait_all(host, restores, deadline)
        if pipelined:
            restores = [_overlapped(step, snapshots_ended) for step in restores]
        # The snapshots' ends are saved with the restore's start (one write for both,
        # unless pipelined); nothing is answered before all of it is saved.
        await host.flush()
        ended = plan(st.SwitchStage.REPORT, st.SwitchEnded)
        return SwitchReport(
            steps=snapshots + restores,
            restored=ended.restored,
            next_state=ended.next_state,
            faulted=[host.table.jobs[key] for key in ended.faulted],
        )


def _overlapped(step: SwitchStep, snapshots_ended: float) -> SwitchStep:
    """`step` with how long it ran before the snapshots had all ended."""
    if step.op is None:
        return step
    end = step.op.finished if step.op.finished is not None else snapshots_ended
    overlap = max(0.0, min(end, snapshots_ended) - step.op.started)
    return dataclasses.replace(step, overlap=overlap)


async def _start_all(
    host: SwitchHost,
    group: str,
    kind: OpKind,
    jobs: Mapping[str, BackendChoice | None],
    token: int,
    deadline: float,
    limits: Mapping[str, float] | None = None,
    pace: Pace | None = None,
) -> list[SwitchStep]:
    """Start `kind` for every job at once; a job in `limits` has its operation
    bounded by that many seconds too."""
    limits = limits or {}
    starts = [
        _start(host, group, kind, job, choice, token, deadline, limits.get(job), pace)
        for job, choice in jobs.items()
    ]
    if len(starts) == 1:  # in this very turn of the loop, no task in between
        return [await starts[0]]
    return list(await asyncio.gather(*starts))


async def _wait_all(
    host: SwitchHost, started: list[SwitchStep], deadline: float
) -> list[SwitchStep]:
    """Wait for every operation `started` to end; the steps as they ended."""
    for step in started:
        if step.op is not None:
            await host.ended(step.op.op_id, max(0.0, deadline - time.time()))
    return [
        SwitchStep(job=s.job, kind=s.kind, op=host.table.operations.get(s.op.op_id, s.op))
        if s.op
        else s
        for s in started
    ]


async def _start(
    host: SwitchHost,
    group: str,
    kind: OpKind,
    job: str,
    choice: BackendChoice | None,
    token: int,
    deadline: float,
    limit: float | None = None,
    pace: Pace | None = None,
) -> SwitchStep:
    left = deadline - time.time()
    if left <= 0:
        return SwitchStep(job=job, kind=kind, op=None, error="the switch's deadline passed first")
    # The operation's own deadline, not a wait: the table fails it when it passes
    # (and cancels the backend's call), whether or not the backend ever answers.
    if limit is not None:
        left = min(left, limit)
    known = host.table.find(group, job) is not None
    if not known and choice is not None and choice.refusal:
        return SwitchStep(job=job, kind=kind, op=None, error=choice.refusal, refused=True)
    try:
        op_id = await host.start_operation(
            kind,
            group,
            job,
            # A job the table knows keeps the backend it is known by.
            backend=None if known or choice is None else choice.backend,
            config=None if known or choice is None else choice.config,
            params=choice.params if choice is not None else None,
            token=token,
            timeout=left,
            pace=pace,
        )
    except TimeSliceError as exc:
        return SwitchStep(job=job, kind=kind, op=None, error=exc.message or type(exc).__name__)
    return SwitchStep(job=job, kind=kind, op=host.table.operations[op_id])
