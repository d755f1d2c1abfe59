"""The agent's job table: every job's context state on this node, as a pure state
machine.

One mutator, `JobTable.handle(event) -> list[effect]`; no clock, no I/O. A job
is keyed by (group, job id); a request with an empty group finds it by its id
alone, as in the v1alpha1 protocol, where groups do not namespace job ids. Its state:

    IDLE           known, no context yet (or its state is being asked after a reset)
    RUNNING        its context is live on the accelerators
    TRANSITIONING  an operation (snapshot or restore) is moving it
    SAVED          its context is in host storage; the accelerators are free of it
    FAULTED        quarantined: an operation failed, it was interrupted, or its
                   workload went away. Other jobs go on; `Reset` clears it.

Transitions:

    state          event                       next state      effects
    (none)         Register                    RUNNING|SAVED
    any but TRANS. Register (the workload is    RUNNING|SAVED   (a workload vouches for
                   back, saying where it is)                    its own state)
    RUNNING        Start(snapshot)             TRANSITIONING   Run
    SAVED          Start(restore)              TRANSITIONING   Run
    TRANSITIONING  Finish(ok)                  SAVED|RUNNING   Done
    TRANSITIONING  Finish(failed), deadline    FAULTED         Done (+ Cancel on deadline)
    any            Lost                        FAULTED         (Cancel, Done if it was
                                                               TRANSITIONING)
    any but TRANS. Forget (workload said bye)  (gone)
    TRANSITIONING  Forget                      as for Lost
    FAULTED        Reset                       IDLE            Reconcile
    (the table)    TakeEpoch                   keeps the highest orchestrator epoch
    IDLE|RUNNING|  Reconciled(state)           state, or FAULTED when the backend
    SAVED                                                      cannot tell
    any            Recover (agent restart)     TRANSITIONING -> FAULTED; pending
                                               operations fail; Reconcile the rest

Anything else raises a `TimeSliceError` and changes nothing. A fencing token per
group only grows: a Start with an older token is refused. So does the
orchestrator epoch (one per start or takeover of the orchestrator's journal):
a switch (`PlanSwitch`), a reset or a `TakeEpoch` of an epoch lower than the
highest taken is refused, so that a deposed orchestrator moves nothing; epoch
0 (a command of no orchestrator: an operator's) is not fenced by epoch. The
resources a job claims (its processes, say) belong to one job only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from copy import deepcopy
from itertools import islice
from typing import Any

from timeslice.api.bounds import MAX_ORCHESTRATOR_EPOCH
from timeslice.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    ResourceExhaustedError,
)
from timeslice.agent.events import (
    RESTORE,
    SNAPSHOT,
    AwaitOperations,
    Cancel,
    Done,
    Effect,
    Event,
    Finish,
    Forget,
    Job,
    JobState,
    Lost,
    Operation,
    OpStatus,
    PlanSwitch,
    Reconcile,
    Reconciled,
    Recover,
    Register,
    Reset,
    Run,
    Start,
    StartOperations,
    SwitchEnded,
    SwitchStage,
    TakeEpoch,
    Tick,
)
from timeslice.ids import check_id
from timeslice.kinds import OpKind

__all__ = [
    "RESTORE",
    "SNAPSHOT",
    "AwaitOperations",
    "Cancel",
    "Done",
    "Effect",
    "Event",
    "Finish",
    "Forget",
    "Job",
    "JobState",
    "JobTable",
    "Lost",
    "Operation",
    "OpStatus",
    "PlanSwitch",
    "Reconcile",
    "Reconciled",
    "Recover",
    "Register",
    "Reset",
    "Run",
    "Start",
    "StartOperations",
    "SwitchEnded",
    "SwitchStage",
    "TakeEpoch",
    "Tick",
]


class JobTable:
    """Every job on this node, and the operations that move them."""

    def __init__(
        self, op_retention: float = 600.0, max_operations: int = 10_000, max_jobs: int = 4096
    ) -> None:
        self.jobs: dict[tuple[str, str], Job] = {}
        self.operations: dict[str, Operation] = {}
        # Finished operations' ids, oldest finished first: what is forgotten first.
        self._finished: dict[str, None] = {}
        self.tokens: dict[str, int] = {}
        self.next_op = 1
        # The agent's own restarts (`Recover`).
        self.epoch = 0
        # The highest orchestrator epoch taken: commands of a lower one are refused.
        self.orchestrator_epoch = 0
        self.op_retention = op_retention
        self.max_operations = max_operations
        # Jobs the table knows at most: the whole table is saved after each change.
        self.max_jobs = max_jobs
        # Events handled since the table was made (not saved): what the agent says of
        # its jobs is stamped with it, so that the orchestrator keeps the newest word.
        self.version = 0
        # Each operation's JSON text, by id, as the last `encode` wrote it, with the
        # status it was encoded in; and each job's, with the job and its fields as
        # they were (see `encode`).
        self._encoded: dict[str, tuple[OpStatus, str]] = {}
        self._job_texts: dict[tuple[str, str], tuple[Job, tuple[Any, ...], str]] = {}

    def handle(self, event: Event) -> list[Effect]:
        """Apply one event; return what the shell must do. Raises on an illegal event,
        leaving the table unchanged."""
        effects = self._handle(event)
        self.version += 1
        return effects

    def _handle(self, event: Event) -> list[Effect]:
        match event:
            case Register():
                return self._register(event)
            case Start():
                return self._start(event)
            case Finish():
                return self._finish(event)
            case Lost():
                return self._lost(event)
            case Forget():
                return self._forget(event)
            case Reset():
                return self._reset(event)
            case TakeEpoch():
                return self._take_epoch(event)
            case Reconciled():
                return self._reconciled(event)
            case Recover():
                return self._recover(event)
            case Tick():
                return self._tick(event)
            case PlanSwitch():
                return self._plan_switch(event)
        raise TypeError(f"not an event: {event!r}")

    # --- lookups ----------------------------------------------------------------------

    def find(self, group: str, job: str) -> Job | None:
        """The job (group, job); a job registered without a group answers for any group.

        An empty `group` finds the job by its id alone, in whatever group it is known
        (v1alpha1 clients send an empty group); ConflictError when several groups
        know that id, since only the group can tell them apart.
        """
        if group:
            return self.jobs.get((group, job)) or self.jobs.get(("", job))
        found = [j for j in self.jobs.values() if j.job == job]
        if len(found) > 1:
            groups = sorted(repr(j.group) for j in found)
            more = f" and {len(groups) - 4} more" if len(groups) > 4 else ""
            named = ", ".join(groups[:4]) + more
            raise ConflictError(f"job {job!r} is known in groups {named}: name its group")
        return found[0] if found else None

    def job(self, group: str, job: str) -> Job:
        """The job, or NotFoundError."""
        found = self.find(group, job)
        if found is None:
            raise NotFoundError(f"unknown job {job!r} in group {group!r}")
        return found

    def _claimed_by_other(self, claims: tuple[str, ...], key: tuple[str, str]) -> str | None:
        for other in self.jobs.values():
            if other.key != key and (taken := set(claims) & set(other.claims)):
                return f"{', '.join(sorted(taken))} already belong to job {other.job}"
        return None

    def _admit(self) -> None:
        if len(self.jobs) >= self.max_jobs:
            raise ResourceExhaustedError(
                f"the agent knows {len(self.jobs)} jobs, its limit: no new one"
            )

    # --- transitions ------------------------------------------------------------------

    def _register(self, e: Register) -> list[Effect]:
        check_id("job_id", e.job)
        if e.group:
            check_id("group", e.group)
        if e.state not in (JobState.RUNNING, JobState.SAVED):
            raise InvalidArgumentError(f"a job registers as RUNNING or SAVED, not {e.state.value}")
        existing = self.jobs.get((e.group, e.job))
        if existing is not None and existing.state is JobState.TRANSITIONING:
            raise ConflictError(f"job {e.job} is in operation {existing.operation}")
        if existing is not None and existing.backend != e.backend:
            raise ConflictError(
                f"job {e.job} is known by backend {existing.backend}, not {e.backend}"
            )
        if taken := self._claimed_by_other(e.claims, (e.group, e.job)):
            raise AlreadyExistsError(taken)
        if existing is None:
            self._admit()
        self.jobs[(e.group, e.job)] = Job(
            group=e.group,
            job=e.job,
            backend=e.backend,
            config=dict(e.config),
            claims=list(dict.fromkeys(e.claims)),
            state=e.state,
            since=e.now,
            operation=existing.operation if existing else "",
            owner=e.owner or (existing.owner if existing else ""),
        )
        return []

    def _start(self, e: Start) -> list[Effect]:
        if e.kind not in (SNAPSHOT, RESTORE):
            raise InvalidArgumentError(f"unknown operation kind {e.kind!r}")
        check_id("job_id", e.job)
        if e.group:
            check_id("group", e.group)
        if not e.timeout > 0:  # NaN too
            raise InvalidArgumentError("an operation's timeout must be positive")
        job = self.find(e.group, e.job)
        # Found by its id alone (an empty group): the tokens are those of its group.
        group = e.group or (job.group if job is not None else "")
        newest = self.tokens.get(group, 0)
        if e.token and e.token < newest:
            raise LeaseLostError(
                f"stale fencing token {e.token} for group {group!r} (newest seen {newest})"
            )
        if job is None:
            if e.kind == RESTORE or e.backend is None:
                raise NotFoundError(f"unknown job {e.job!r} in group {e.group!r}")
            if taken := self._claimed_by_other(e.claims, (e.group, e.job)):
                raise AlreadyExistsError(taken)
            self._admit()
            job = Job(
                group=e.group,
                job=e.job,
                backend=e.backend,
                config=dict(e.config or {}),
                claims=list(dict.fromkeys(e.claims)),
                state=JobState.RUNNING,
                since=e.now,
            )
        elif e.backend is not None and e.backend != job.backend:
            raise ConflictError(f"job {e.job} is known by backend {job.backend}, not {e.backend}")
        needed = JobState.RUNNING if e.kind == SNAPSHOT else JobState.SAVED
        if job.state is not needed:
            detail = {
                JobState.TRANSITIONING: f" (operation {job.operation} is running)",
                JobState.FAULTED: f" ({job.fault}; reset it first)",
            }.get(job.state, "")
            raise ConflictError(f"cannot {e.kind} job {e.job}: it is {job.state.value}{detail}")
        if e.token:
            self.tokens[group] = e.token
        op = Operation(
            op_id=f"op-{self.next_op}",
            kind=e.kind,
            group=job.group,
            job=job.job,
            backend=job.backend,
            params=dict(e.params),
            started=e.now,
            deadline=e.now + e.timeout,
            token=e.token,
        )
        self.next_op += 1
        self.operations[op.op_id] = op
        self.jobs[job.key] = job
        job.state, job.since, job.operation, job.fault = JobState.TRANSITIONING, e.now, op.op_id, ""
        return [Run(op_id=op.op_id)]

    def _finish(self, e: Finish) -> list[Effect]:
        op = self.operations.get(e.op_id)
        if op is None or op.status is not OpStatus.PENDING:
            return []  # it timed out or was interrupted already
        op.status = OpStatus.COMPLETE if e.ok else OpStatus.FAILED
        op.finished, op.storage_bytes, op.device_bytes = e.now, e.storage_bytes, e.device_bytes
        op.error = "" if e.ok else (e.error or "the operation failed")
        self._finished[op.op_id] = None
        job = self.jobs.get((op.group, op.job))
        if job is not None and job.operation == op.op_id and job.state is JobState.TRANSITIONING:
            if e.ok:
                job.state = JobState.SAVED if op.kind == SNAPSHOT else JobState.RUNNING
            else:
                job.state, job.fault = JobState.FAULTED, f"{op.kind} {op.op_id} failed: {op.error}"
            job.since = e.now
        return [Done(op_id=op.op_id)]

    def _lost(self, e: Lost) -> list[Effect]:
        job = self.jobs.get((e.group, e.job))
        if job is None or job.state is JobState.FAULTED:
            return []
        reason = e.reason or "its workload went away"
        if job.state is JobState.TRANSITIONING:
            # Its operation cannot finish without the workload; fail it now, or a workload
            # that comes back could be moved by a second operation while this one runs.
            failed = Finish(now=e.now, op_id=job.operation, ok=False, error=reason)
            return [Cancel(op_id=job.operation), *self._finish(failed)]
        job.state, job.fault, job.since = JobState.FAULTED, reason, e.now
        return []

    def _forget(self, e: Forget) -> list[Effect]:
        job = self.jobs.get((e.group, e.job))
        if job is None:
            return []
        if job.state is JobState.TRANSITIONING:
            return self._lost(Lost(now=e.now, group=e.group, job=e.job, reason=e.reason))
        del self.jobs[job.key]
        return []

    def check_epoch(self, epoch: int) -> None:
        """Refuse a command of an orchestrator epoch lower than the highest taken
        (0, no orchestrator's, passes)."""
        if epoch and epoch < self.orchestrator_epoch:
            raise ConflictError(
                f"a command of orchestrator epoch {epoch}, but epoch"
                f" {self.orchestrator_epoch} has taken over: refused"
            )

    def _take_epoch(self, e: TakeEpoch) -> list[Effect]:
        if not 0 <= e.epoch <= MAX_ORCHESTRATOR_EPOCH:
            raise InvalidArgumentError(f"orchestrator epoch {e.epoch} is out of range")
        self.check_epoch(e.epoch)
        self.orchestrator_epoch = max(self.orchestrator_epoch, e.epoch)
        return []

    def _reset(self, e: Reset) -> list[Effect]:
        check_id("job_id", e.job)
        if e.group:
            check_id("group", e.group)
        self.check_epoch(e.epoch)
        job = self.job(e.group, e.job)
        if job.state is not JobState.FAULTED:
            raise ConflictError(f"job {e.job} is {job.state.value}, not FAULTED")
        job.state, job.fault, job.since = JobState.IDLE, "", e.now
        return [Reconcile(group=job.group, job=job.job)]

    def _reconciled(self, e: Reconciled) -> list[Effect]:
        if e.state not in (None, JobState.RUNNING, JobState.SAVED):
            raise InvalidArgumentError(f"a backend reports RUNNING or SAVED, not {e.state}")
        job = self.jobs.get((e.group, e.job))
        if job is None or job.state in (JobState.TRANSITIONING, JobState.FAULTED):
            return []  # something newer happened to it meanwhile
        if e.state is None:
            job.state, job.fault = JobState.FAULTED, e.reason or "its backend cannot tell its state"
        else:
            job.state = e.state
        job.since = e.now
        return []

    def _recover(self, e: Recover) -> list[Effect]:
        self.epoch += 1
        for op in self.operations.values():
            if op.status is OpStatus.PENDING:
                op.status, op.finished = OpStatus.FAILED, e.now
                op.error = "interrupted: the agent restarted during the operation"
                self._finished[op.op_id] = None
        effects: list[Effect] = []
        for job in self.jobs.values():
            if job.state is JobState.TRANSITIONING:
                job.state, job.since = JobState.FAULTED, e.now
                job.fault = f"{job.operation} was interrupted by an agent restart"
            elif job.state is not JobState.FAULTED:
                effects.append(Reconcile(group=job.group, job=job.job))
        return effects

    def _pending(self) -> list[Operation]:
        return [
            self.operations[j.operation]
            for j in self.jobs.values()
            if j.state is JobState.TRANSITIONING
        ]

    def _tick(self, e: Tick) -> list[Effect]:
        cancels: list[Effect] = []
        dones: list[Effect] = []
        for op in self._pending():
            if op.deadline <= e.now:
                took = op.deadline - op.started
                failed = Finish(
                    now=e.now,
                    op_id=op.op_id,
                    ok=False,
                    error=f"deadline exceeded after {took:.1f} s",
                )
                cancels.append(Cancel(op_id=op.op_id))
                dones += self._finish(failed)
        while self._finished:
            oldest = self.operations[next(iter(self._finished))]
            expired = (oldest.finished or 0.0) + self.op_retention <= e.now
            if not expired and len(self.operations) <= self.max_operations:
                break
            del self._finished[oldest.op_id], self.operations[oldest.op_id]
        return [*cancels, *dones]

    def next_deadline(self) -> float | None:
        """When `Tick` next has something to do."""
        times = [op.deadline for op in self._pending()]
        if self._finished:
            oldest = self.operations[next(iter(self._finished))]
            times.append((oldest.finished or 0.0) + self.op_retention)
        return min(times, default=None)

    # --- a switch's plan --------------------------------------------------------------

    def _members(self, group: str, named: tuple[str, ...]) -> list[Job]:
        """The group's jobs on this node: those registered in it, and those registered
        without a group that the orchestrator names as the group's."""
        return [
            j for j in self.jobs.values() if j.group == group or (not j.group and j.job in named)
        ]

    def _plan_switch(self, e: PlanSwitch) -> list[Effect]:
        # Every stage: an orchestrator that took over meanwhile stops the rest.
        self.check_epoch(e.epoch)
        members = self._members(e.group, e.jobs)
        match e.stage:
            case SwitchStage.SETTLE:
                newest = self.tokens.get(e.group, 0)
                if e.token < newest:
                    raise LeaseLostError(
                        f"stale fencing token {e.token} for group {e.group!r} (newest seen {newest})"
                    )
                moving = tuple(j.operation for j in members if j.state is JobState.TRANSITIONING)
                return [AwaitOperations(op_ids=moving)]
            case SwitchStage.EVICT:
                live = [j.job for j in members if j.state is JobState.RUNNING and j.job != e.job]
                # A job registered with a backend but not known here yet (a plain
                # process never moved) holds its context on the accelerators.
                live += [
                    job for job in e.registered if job != e.job and self.find(e.group, job) is None
                ]
                return [StartOperations(kind=SNAPSHOT, jobs=tuple(dict.fromkeys(live)))]
            case SwitchStage.RESTORE:
                target = self.find(e.group, e.job) if e.job else None
                saved = target is not None and target.state is JobState.SAVED
                return [StartOperations(kind=RESTORE, jobs=(e.job,) if saved else ())]
            case SwitchStage.REPORT:
                target = self.find(e.group, e.job) if e.job else None
                op = self.operations.get(target.operation) if target is not None else None
                restored = (
                    target is not None
                    and target.state is JobState.RUNNING
                    and op is not None
                    and op.kind == RESTORE
                    and op.token == e.token
                    and op.status is OpStatus.COMPLETE
                )
                faulted = tuple(j.key for j in members if j.state is JobState.FAULTED)
                ended = SwitchEnded(
                    restored=restored,
                    next_state=target.state if target is not None else None,
                    faulted=faulted,
                )
                return [ended]
        raise TypeError(f"not a switch stage: {e.stage!r}")

    # --- checks and persistence -------------------------------------------------------

    def validate(self) -> None:
        """Raise AssertionError if an invariant does not hold."""
        owners: dict[str, tuple[str, str]] = {}
        for key, job in self.jobs.items():
            assert key == job.key, (key, job.key)
            for claim in job.claims:
                assert claim not in owners, f"{claim} claimed by {owners[claim]} and {key}"
                owners[claim] = key
            pending = [
                o
                for o in self.operations.values()
                if o.status is OpStatus.PENDING and (o.group, o.job) == key
            ]
            if job.state is JobState.TRANSITIONING:
                assert [o.op_id for o in pending] == [job.operation], (key, pending)
            else:
                assert not pending, f"{key} is {job.state.value} with {pending}"
            assert (job.state is JobState.FAULTED) == bool(job.fault), (key, job.fault)

    def to_dict(self, finished: int | None = None) -> dict[str, Any]:
        """A JSON-ready copy of the table; with `finished`, of only that many of the
        most recently finished operations (and every pending one)."""
        return {
            "jobs": [deepcopy(_job_dict(j)) for j in self.jobs.values()],
            "operations": [deepcopy(_op_dict(o)) for o in self._kept(finished)],
            "tokens": dict(self.tokens),
            "next_op": self.next_op,
            "epoch": self.epoch,
            "orchestrator_epoch": self.orchestrator_epoch,
        }

    def encode(self, finished: int) -> str:
        """`to_dict(finished)` as compact JSON text: what a save writes. Only what
        changed since the last call is encoded again:
        - an operation changes only as it ends (its status with it), and never
          after, so each is encoded once pending and once ended;
        - a job changes by the table setting its fields (its state, operation and
          fault as it moves), or is replaced by a new one (a register): its text is
          kept while it is the same object with the same field values. Its config
          and claims are never changed in place."""
        encoded: dict[str, tuple[OpStatus, str]] = {}
        parts = []
        for op in self._kept(finished):
            known = self._encoded.get(op.op_id)
            text = known[1] if known and known[0] is op.status else _dumps(_op_dict(op))
            encoded[op.op_id] = (op.status, text)
            parts.append(text)
        self._encoded = encoded
        job_texts: dict[tuple[str, str], tuple[Job, tuple[Any, ...], str]] = {}
        jobs = []
        for key, job in self.jobs.items():
            fields = tuple(vars(job).values())
            seen = self._job_texts.get(key)
            if seen is not None and seen[0] is job and seen[1] == fields:
                text = seen[2]
            else:
                text = _dumps(_job_dict(job))
            job_texts[key] = (job, fields, text)
            jobs.append(text)
        self._job_texts = job_texts
        return (
            f'{{"jobs":[{",".join(jobs)}],"operations":[{",".join(parts)}],'
            f'"tokens":{_dumps(self.tokens)},"next_op":{self.next_op},"epoch":{self.epoch},'
            f'"orchestrator_epoch":{self.orchestrator_epoch}}}'
        )

    def _kept(self, finished: int | None) -> Iterable[Operation]:
        """The operations a copy of the table keeps (see `to_dict`)."""
        if finished is None:
            return self.operations.values()
        # The pending ones are never among the finished.
        kept = [self.operations[i] for i in islice(reversed(self._finished), finished)]
        kept += self._pending()
        kept.sort(key=_number)  # ids are numbered in start order
        return kept

    @classmethod
    def from_dict(cls, data: dict[str, Any], **options: Any) -> JobTable:
        """The inverse of `to_dict`."""
        table = cls(**options)
        for jd in data["jobs"]:
            job = Job(**{**jd, "state": JobState(jd["state"])})
            table.jobs[job.key] = job
        for od in data["operations"]:
            op = Operation(**{**od, "status": OpStatus(od["status"]), "kind": OpKind(od["kind"])})
            table.operations[op.op_id] = op
        done = [op for op in table.operations.values() if op.status is not OpStatus.PENDING]
        for op in sorted(done, key=lambda o: o.finished or 0.0):
            table._finished[op.op_id] = None
        table.tokens = dict(data["tokens"])
        table.next_op = data["next_op"]
        table.epoch = data["epoch"]
        # A table saved before orchestrator epochs were kept has seen none.
        table.orchestrator_epoch = int(data.get("orchestrator_epoch", 0))
        return table


def _job_dict(job: Job) -> dict[str, Any]:
    return {**vars(job), "state": job.state.value, "claims": list(job.claims)}


def _op_dict(op: Operation) -> dict[str, Any]:
    return {**vars(op), "status": op.status.value}


_ENCODER = json.JSONEncoder(separators=(",", ":"))  # one, not one per call as json.dumps


def _dumps(value: Any) -> str:
    return _ENCODER.encode(value)


def _number(op: Operation) -> int:
    return int(op.op_id.removeprefix("op-"))
