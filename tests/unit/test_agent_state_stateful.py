"""The agent's job table under random sequences of events.

Every step is checked against the transition table in `timeslice.agent.state`'s
docstring: a job moves only along a listed transition, for the event that lists
it. Across steps, a job's fencing tokens only grow, so does the orchestrator
epoch (a command of a lower one is refused), an operation never goes back
to PENDING, and a saved context comes back only by a restore or by someone (the
workload, its backend) saying so.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from timeslice.agent.state import (
    RESTORE,
    SNAPSHOT,
    AwaitOperations,
    Cancel,
    Done,
    Effect,
    Event,
    Finish,
    Job,
    JobState,
    JobTable,
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
from timeslice.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    TimeSliceError,
)

GROUPS = ("g1", "g2", "")  # "" registers a job for any group
JOBS = ("a", "b", "c")
BACKENDS = ("noop", "cuda")
CLAIMS = ("pid:1", "pid:2", "gpu:0")
RETENTION = 30.0
MAX_OPERATIONS = 5

R, S, T, F = JobState.RUNNING, JobState.SAVED, JobState.TRANSITIONING, JobState.FAULTED
IDLE = JobState.IDLE

groups = st.sampled_from(GROUPS)
jobs = st.sampled_from(JOBS)
claims = st.lists(st.sampled_from(CLAIMS), max_size=2).map(tuple)
# an index into the known jobs, or None for the (group, job) drawn with it
picks = st.one_of(st.integers(0, 100), st.integers(0, 100), st.none())
timeouts = st.sampled_from([1.0, 5.0, 20.0, 20.0, 0.0, -1.0])
token_kinds = st.sampled_from(["none", "none", "current", "newer", "stale"])
# orchestrator epochs: 0 is no orchestrator's (not fenced)
epochs = st.integers(0, 4)
Key = tuple[str, str]
# What a request with an empty group names when several groups know its job id.
AMBIGUOUS = "ambiguous"


class JobTableMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.table = JobTable(op_retention=RETENTION, max_operations=MAX_OPERATIONS)
        self.now = 0.0
        self.op_ids: list[str] = []  # every operation ever started
        self.finished: dict[str, Operation] = {}  # each finished operation, as it ended
        self.tokens: dict[str, int] = {}  # the newest token accepted, per group
        # jobs whose context was last seen saved, and not brought back since
        self.saved: set[Key] = set()
        self.orchestrator_epoch = 0  # the highest taken

    def deposed(self, epoch: int) -> bool:
        """Whether a command of orchestrator `epoch` comes from a deposed one."""
        return 0 < epoch < self.orchestrator_epoch

    # --- helpers ----------------------------------------------------------------------

    def named(self, group: str, job: str) -> Job | str | None:
        """The job a request for (group, job) names, by the rule of the v1alpha1
        protocol: a named group exactly (or the job registered without a group);
        an empty group, the one job of that id in any group, or AMBIGUOUS."""
        if group:
            return self.table.jobs.get((group, job)) or self.table.jobs.get(("", job))
        found = [j for j in self.table.jobs.values() if j.job == job]
        if len(found) > 1:
            return AMBIGUOUS
        return found[0] if found else None

    def apply(self, event: Event) -> list[Effect] | TimeSliceError:
        """Handle `event`; check that a refusal changed nothing, and that every job
        that moved did so along a transition of the table."""
        before = self.table.to_dict()
        states = {key: job.state for key, job in self.table.jobs.items()}
        target = self.target(event)
        pending = {o.op_id: o for o in self.table.operations.values()
                   if o.status is OpStatus.PENDING}  # fmt: skip
        deadline = self.table.next_deadline()
        try:
            effects = self.table.handle(event)
        except TimeSliceError as exc:
            assert self.table.to_dict() == before, (event, exc)
            assert self.table.next_deadline() == deadline
            return exc
        assert set(states) <= set(self.table.jobs), "a job was forgotten"
        for key, job in self.table.jobs.items():
            was = states.get(key)
            if was is not job.state or key not in states:
                assert target is None or key == target, (event, key)
                assert allowed(event, was, job.state, pending, key), (event, was, job.state)
            self.follow_context(event, key, job.state, pending)
        for op in self.table.operations.values():
            if op.op_id in pending and op.status is not OpStatus.PENDING:
                self.finished[op.op_id] = dataclasses.replace(op, params=dict(op.params))
        return effects

    def target(self, event: Event) -> Key | None:
        """The one job `event` may move, or None for events that may move any."""
        match event:
            case Start() | Reset():
                found = self.named(event.group, event.job)
                return found.key if isinstance(found, Job) else (event.group, event.job)
            case Register() | Lost() | Reconciled():
                return (event.group, event.job)
        return None

    def follow_context(
        self, event: Event, key: Key, state: JobState, pending: dict[str, Any]
    ) -> None:
        if state is S:
            self.saved.add(key)
        elif state is R and key in self.saved:
            said_so = isinstance(event, Register | Reconciled) and (event.group, event.job) == key
            restored = (
                isinstance(event, Finish)
                and event.ok
                and event.op_id in pending
                and pending[event.op_id].kind == RESTORE
                and (pending[event.op_id].group, pending[event.op_id].job) == key
            )
            assert said_so or restored, f"{key} went from SAVED to RUNNING on {event!r}"
            self.saved.discard(key)

    def choose(self, group: str, job: str, pick: int | None) -> Key:
        """A known job's key when `pick` is given and some job is known."""
        if pick is None or not self.table.jobs:
            return (group, job)
        keys = list(self.table.jobs)
        return keys[pick % len(keys)]

    def pending(self) -> list[str]:
        return [o.op_id for o in self.table.operations.values() if o.status is OpStatus.PENDING]

    # --- rules ------------------------------------------------------------------------

    @initialize()
    def jobs_known(self) -> None:
        """Most runs would otherwise spend their first steps on unknown jobs."""
        for group, job, state in (("g1", "a", R), ("", "b", S), ("g2", "c", R)):
            self.register(group, job, "noop", state, ())

    @rule(
        group=groups,
        job=jobs,
        backend=st.sampled_from(BACKENDS),
        state=st.sampled_from([R, R, S, S, IDLE, F]),
        taken=claims,
        pick=picks,
    )
    def register(
        self,
        group: str,
        job: str,
        backend: str,
        state: JobState,
        taken: tuple[str, ...],
        pick: int | None = None,
    ) -> None:
        group, job = self.choose(group, job, pick)
        existing = self.table.jobs.get((group, job))
        others = {c for j in self.table.jobs.values() if j.key != (group, job) for c in j.claims}
        outcome = self.apply(
            Register(
                now=self.now,
                group=group,
                job=job,
                backend=backend,
                config={"n": 1},
                claims=taken,
                state=state,
            )
        )
        if state not in (R, S):
            assert isinstance(outcome, InvalidArgumentError), outcome
        elif existing is not None and (existing.state is T or existing.backend != backend):
            assert isinstance(outcome, ConflictError), outcome
        elif others & set(taken):
            assert isinstance(outcome, AlreadyExistsError), outcome
        else:
            assert outcome == [], outcome
            job_now = self.table.jobs[(group, job)]
            assert (job_now.state, job_now.fault) == (state, "")
            assert job_now.claims == list(dict.fromkeys(taken))

    @rule(
        kind=st.sampled_from([SNAPSHOT, RESTORE]),
        group=groups,
        job=jobs,
        token=token_kinds,
        backend=st.sampled_from((None, *BACKENDS)),
        taken=claims,
        timeout=timeouts,
    )
    def start(
        self,
        kind: str,
        group: str,
        job: str,
        token: str,
        backend: str | None,
        taken: tuple[str, ...],
        timeout: float,
    ) -> None:
        named = self.named(group, job)
        found = named if isinstance(named, Job) else None
        # Found by its id alone: the tokens are those of the job's own group.
        group_of = group or (found.group if found else "")
        newest = self.tokens.get(group_of, 0)
        fencing = {"none": 0, "stale": newest - 1, "current": newest, "newer": newest + 1}[token]
        was = found.state if found else None
        others = {c for j in self.table.jobs.values() if j.key != (group, job) for c in j.claims}
        event = Start(
            now=self.now,
            kind=kind,
            group=group,
            job=job,
            timeout=timeout,
            token=fencing,
            backend=backend,
            config=None,
            claims=taken,
        )
        outcome = self.apply(event)
        needed = R if kind == SNAPSHOT else S
        if timeout <= 0:
            assert isinstance(outcome, InvalidArgumentError), outcome
        elif named == AMBIGUOUS:
            assert isinstance(outcome, ConflictError), outcome
            assert "name its group" in str(outcome)
        elif fencing and fencing < newest:
            assert isinstance(outcome, LeaseLostError), outcome
        elif found is None and (kind == RESTORE or backend is None):
            assert isinstance(outcome, NotFoundError), outcome
        elif found is None and others & set(taken):
            assert isinstance(outcome, AlreadyExistsError), outcome
        elif found is not None and (
            (backend is not None and backend != found.backend) or was is not needed
        ):
            assert isinstance(outcome, ConflictError), outcome
            if was is T and backend in (None, found.backend):
                assert found.operation in str(outcome)
        else:
            assert isinstance(outcome, list), outcome
            [run] = outcome
            assert isinstance(run, Run) and run.op_id not in self.op_ids
            self.op_ids.append(run.op_id)
            started = self.table.job(group, job)
            assert (started.state, started.operation) == (T, run.op_id)
            op = self.table.operations[run.op_id]
            assert (op.kind, op.status, op.deadline) == (kind, OpStatus.PENDING, self.now + timeout)
            if fencing:
                self.tokens[group_of] = fencing

    @precondition(lambda self: self.table.jobs)
    @rule(pick=st.integers(0, 100), group=st.sampled_from(GROUPS[:2]), token=token_kinds,
          timeout=timeouts, same_backend=st.booleans())  # fmt: skip
    def move(self, pick: int, group: str, token: str, timeout: float, same_backend: bool) -> None:
        """Start the operation a known job is ready for (or, when it is not, one that
        will be refused)."""
        job = self.table.jobs[self.choose("", "", pick)]
        kind = RESTORE if job.state is S else SNAPSHOT
        backend = job.backend if same_backend else None
        self.start(kind, job.group or group, job.job, token, backend, (), timeout)

    @precondition(lambda self: self.op_ids)
    @rule(
        pick=st.integers(0, 100),
        ok=st.booleans(),
        stale=st.booleans(),
        stored=st.one_of(st.none(), st.integers(0, 1 << 40)),
    )
    def finish(self, pick: int, ok: bool, stale: bool, stored: int | None) -> None:
        op_id = "op-0" if stale else self.op_ids[pick % len(self.op_ids)]
        op = self.table.operations.get(op_id)
        was_pending = op is not None and op.status is OpStatus.PENDING
        outcome = self.apply(
            Finish(
                now=self.now,
                op_id=op_id,
                ok=ok,
                storage_bytes=stored,
                device_bytes=stored,
                error="backend failed",
            )
        )
        if not was_pending:
            assert outcome == [], outcome
            return
        assert outcome == [Done(op_id=op_id)], outcome
        assert op is not None
        job = self.table.jobs[(op.group, op.job)]
        if ok:
            assert op.status is OpStatus.COMPLETE and op.storage_bytes == stored
            assert job.state is (S if op.kind == SNAPSHOT else R)
        else:
            assert op.status is OpStatus.FAILED and op.error == "backend failed"
            assert job.state is F and "backend failed" in job.fault

    @precondition(lambda self: self.pending())
    @rule(pick=st.integers(0, 100), ok=st.booleans())
    def finish_pending(self, pick: int, ok: bool) -> None:
        """Most picks of `finish` land on finished operations; this one never does."""
        pending = self.pending()
        op_id = pending[pick % len(pending)]
        assert self.apply(Finish(now=self.now, op_id=op_id, ok=ok)) == [Done(op_id=op_id)]

    @rule(group=groups, job=jobs, pick=picks, reason=st.sampled_from(["", "process exited"]))
    def lost(self, group: str, job: str, pick: int | None, reason: str) -> None:
        group, job = self.choose(group, job, pick)
        found = self.table.jobs.get((group, job))
        was = found.state if found else None
        running = found.operation if was is T and found else None
        before = self.table.to_dict()
        outcome = self.apply(Lost(now=self.now, group=group, job=job, reason=reason))
        if found is None or was is F:
            assert outcome == [], outcome
            assert self.table.to_dict() == before
            return
        assert found.state is F and found.fault
        if running is not None:
            assert outcome == [Cancel(op_id=running), Done(op_id=running)], outcome
        else:
            assert outcome == [], outcome

    @rule(
        group=groups,
        job=jobs,
        pick=picks,
        answer=st.sampled_from([R, S, None]),
        ask=st.booleans(),
        epoch=epochs,
    )
    def reset(
        self,
        group: str,
        job: str,
        pick: int | None,
        answer: JobState | None,
        ask: bool,
        epoch: int,
    ) -> None:
        """An operator resets the job (through the orchestrator of `epoch`); its
        backend answers (or something else happens first, when `ask` is false)."""
        group, job = self.choose(group, job, pick)
        named = self.named(group, job)
        found = named if isinstance(named, Job) else None
        was = found.state if found else None
        outcome = self.apply(Reset(now=self.now, group=group, job=job, epoch=epoch))
        if self.deposed(epoch):
            assert isinstance(outcome, ConflictError) and "taken over" in outcome.message
            return
        if named == AMBIGUOUS:
            assert isinstance(outcome, ConflictError), outcome
            return
        if found is None:
            assert isinstance(outcome, NotFoundError), outcome
            return
        if was is not F:
            assert isinstance(outcome, ConflictError), outcome
            return
        assert outcome == [Reconcile(group=found.group, job=found.job)], outcome
        assert (found.state, found.fault) == (IDLE, "")
        if ask:
            self.reconciled(found.group, found.job, None, answer)

    @rule(group=groups, job=jobs, pick=picks, answer=st.sampled_from([R, S, None]))
    def reconciled(self, group: str, job: str, pick: int | None, answer: JobState | None) -> None:
        group, job = self.choose(group, job, pick)
        found = self.table.jobs.get((group, job))
        was = found.state if found else None
        outcome = self.apply(
            Reconciled(
                now=self.now, group=group, job=job, state=answer, reason="backend cannot tell"
            )
        )
        assert outcome == [], outcome
        if found is None or was in (T, F):
            assert found is None or found.state is was
            return
        assert found.state is (answer or F)

    @rule(dt=st.sampled_from([0.0, 0.5, 1.0, 5.0, 20.0, 40.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        due = {o.op_id for o in self.table.operations.values()
               if o.status is OpStatus.PENDING and o.deadline <= self.now}  # fmt: skip
        pending = set(self.pending()) - due
        outcome = self.apply(Tick(now=self.now))
        assert isinstance(outcome, list), outcome
        cancels = [e.op_id for e in outcome if isinstance(e, Cancel)]
        dones = [e.op_id for e in outcome if isinstance(e, Done)]
        assert set(cancels) == set(dones) == due and len(outcome) == 2 * len(due)
        assert all(isinstance(e, Cancel) for e in outcome[: len(due)])
        assert pending <= set(self.table.operations)
        for op in self.table.operations.values():
            if op.status is not OpStatus.PENDING:
                assert op.finished is not None and op.finished + RETENTION > self.now
        assert len(self.table.operations) <= max(MAX_OPERATIONS, len(pending))
        deadline = self.table.next_deadline()
        assert deadline is None or deadline > self.now

    @rule()
    def recover(self) -> None:
        epoch = self.table.epoch
        pending = self.pending()
        expected = [Reconcile(group=job.group, job=job.job) for job in self.table.jobs.values()
                    if job.state not in (T, F)]  # fmt: skip
        moving = [job.key for job in self.table.jobs.values() if job.state is T]
        assert self.apply(Recover(now=self.now)) == expected
        assert self.table.epoch == epoch + 1
        for op_id in pending:
            op = self.table.operations[op_id]
            assert op.status is OpStatus.FAILED and "interrupted" in op.error
        for key in moving:
            job = self.table.jobs[key]
            assert job.state is F and job.operation in job.fault

    @rule(
        group=st.sampled_from(GROUPS[:2]),
        job=st.sampled_from(("", *JOBS)),
        stage=st.sampled_from(list(SwitchStage)),
        named=st.lists(jobs, max_size=3, unique=True),
        registered=st.lists(jobs, max_size=3, unique=True),
        token=st.integers(0, 6),
        epoch=epochs,
    )
    def plan_switch(
        self,
        group: str,
        job: str,
        stage: SwitchStage,
        named: list[str],
        registered: list[str],
        token: int,
        epoch: int,
    ) -> None:
        """Each stage of a switch plan is a question: it changes nothing, and its
        answer follows from where the group's contexts are; every stage of a
        deposed orchestrator's switch is refused."""
        before = self.table.to_dict()
        event = PlanSwitch(now=self.now, group=group, job=job, token=token, stage=stage,
                           jobs=tuple(named), registered=tuple(registered),
                           epoch=epoch)  # fmt: skip
        outcome = self.apply(event)
        assert self.table.to_dict() == before
        if self.deposed(epoch):
            assert isinstance(outcome, ConflictError) and "taken over" in outcome.message
            return
        if stage is SwitchStage.SETTLE and token < self.table.tokens.get(group, 0):
            assert isinstance(outcome, LeaseLostError), outcome
            return
        assert isinstance(outcome, list) and len(outcome) == 1, outcome
        [answer] = outcome
        members = [j for j in self.table.jobs.values()
                   if j.group == group or (not j.group and j.job in named)]  # fmt: skip
        target = self.table.find(group, job) if job else None
        match stage:
            case SwitchStage.SETTLE:
                moving = {j.operation for j in members if j.state is T}
                assert isinstance(answer, AwaitOperations) and set(answer.op_ids) == moving
            case SwitchStage.EVICT:
                assert isinstance(answer, StartOperations) and answer.kind == SNAPSHOT
                live = {j.job for j in members if j.state is R and j.job != job}
                unknown = {j for j in registered if j != job and not self.table.find(group, j)}
                assert set(answer.jobs) == live | unknown, (answer, live, unknown)
            case SwitchStage.RESTORE:
                assert isinstance(answer, StartOperations) and answer.kind == RESTORE
                saved = target is not None and target.state is S
                assert answer.jobs == ((job,) if saved else ())
            case SwitchStage.REPORT:
                assert isinstance(answer, SwitchEnded)
                assert answer.next_state == (target.state if target else None)
                assert set(answer.faulted) == {j.key for j in members if j.state is F}
                if answer.restored:
                    assert target is not None and target.state is R
                    op = self.table.operations[target.operation]
                    assert (op.kind, op.token, op.status) == (RESTORE, token, OpStatus.COMPLETE)

    @rule(epoch=epochs)
    def take_epoch(self, epoch: int) -> None:
        """A command of orchestrator `epoch` arrives: a lower epoch than the highest
        taken is refused, a higher one taken."""
        outcome = self.apply(TakeEpoch(now=self.now, epoch=epoch))
        if self.deposed(epoch):
            assert isinstance(outcome, ConflictError), outcome
            assert outcome.message == (
                f"a command of orchestrator epoch {epoch}, but epoch"
                f" {self.orchestrator_epoch} has taken over: refused"
            )
            return
        assert outcome == [], outcome
        self.orchestrator_epoch = max(self.orchestrator_epoch, epoch)

    @rule()
    def round_trip(self) -> None:
        data = self.table.to_dict()
        deadline = self.table.next_deadline()
        self.table = JobTable.from_dict(
            json.loads(json.dumps(data)), op_retention=RETENTION, max_operations=MAX_OPERATIONS
        )
        assert self.table.to_dict() == data
        assert self.table.next_deadline() == deadline

    # --- invariants -------------------------------------------------------------------

    @invariant()
    def table_is_valid(self) -> None:
        self.table.validate()

    @invariant()
    def a_job_is_moved_by_one_operation_at_a_time(self) -> None:
        for key, job in self.table.jobs.items():
            pending = [o.op_id for o in self.table.operations.values()
                       if o.status is OpStatus.PENDING and (o.group, o.job) == key]  # fmt: skip
            assert len(pending) <= 1, (key, pending)
            assert (job.state is T) == bool(pending), (key, job.state, pending)
            if pending:
                assert pending == [job.operation]

    @invariant()
    def tokens_only_grow(self) -> None:
        for group, newest in self.tokens.items():
            assert self.table.tokens.get(group, 0) == newest
        assert set(self.table.tokens) <= set(self.tokens)

    @invariant()
    def the_orchestrator_epoch_only_grows(self) -> None:
        assert self.table.orchestrator_epoch == self.orchestrator_epoch

    @invariant()
    def finished_operations_stay_finished(self) -> None:
        for op_id, ended in self.finished.items():
            op = self.table.operations.get(op_id)
            assert op is None or op == ended, (ended, op)

    @invariant()
    def the_saved_text_is_the_table(self) -> None:
        # Encoded after every step: texts kept from one save to the next must follow
        # every change (an operation that ends, a job that moves).
        assert json.loads(self.table.encode(finished=4)) == self.table.to_dict(finished=4)

    @invariant()
    def a_saved_context_is_remembered(self) -> None:
        for key in self.saved:
            assert self.table.jobs[key].state is not R, key


def allowed(
    event: Event, was: JobState | None, now: JobState, pending: dict[str, Any], key: Key
) -> bool:
    """Whether the transition table lists `was` -> `now` for `event`."""
    own_op = any((o.group, o.job) == key for o in pending.values())
    match event:
        case Register():
            return was is not T and now in (R, S)
        case Start():
            return now is T and was in (None, R, S) and (was is not None or event.kind == SNAPSHOT)
        case Finish():
            op = pending.get(event.op_id)
            if was is not T or op is None or (op.group, op.job) != key:
                return False
            return now is ((S if op.kind == SNAPSHOT else R) if event.ok else F)
        case Tick():
            return was is T and now is F and own_op
        case Lost():
            return now is F
        case Reset():
            return was is F and now is IDLE
        case Reconciled():
            return was in (IDLE, R, S) and now in (R, S, F)
        case Recover():
            return was is T and now is F
    return False


TestJobTable = JobTableMachine.TestCase
TestJobTable.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
