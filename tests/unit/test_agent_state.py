"""The agent's job table, one transition at a time.

Every step goes through `Harness.handle`, which checks the table's invariants
after it; every refused event goes through `Harness.refuse`, which checks that
the table did not change.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest

from timeslice.agent.state import (
    RESTORE,
    SNAPSHOT,
    Cancel,
    Done,
    Effect,
    Event,
    Finish,
    Forget,
    Job,
    JobState,
    JobTable,
    Lost,
    Operation,
    OpStatus,
    Reconcile,
    Reconciled,
    Recover,
    Register,
    Reset,
    Run,
    Start,
    Tick,
)
from timeslice.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    ResourceExhaustedError,
    TimeSliceError,
)


class Harness:
    """A job table whose invariants are checked after every step."""

    def __init__(self, table: JobTable | None = None) -> None:
        self.table = table if table is not None else JobTable()

    def handle(self, event: Event) -> list[Effect]:
        effects = self.table.handle(event)
        self.table.validate()
        return effects

    def refuse(self, event: Event, error: type[TimeSliceError]) -> TimeSliceError:
        """`event` must raise `error` and leave the table exactly as it was."""
        before = self.table.to_dict()
        deadline = self.table.next_deadline()
        with pytest.raises(error) as caught:
            self.table.handle(event)
        assert self.table.to_dict() == before
        assert self.table.next_deadline() == deadline
        self.table.validate()
        return caught.value

    def ignore(self, event: Event) -> None:
        """`event` must be a no-op: no effects, no change."""
        before = self.table.to_dict()
        assert self.handle(event) == []
        assert self.table.to_dict() == before

    def register(
        self,
        job: str = "a",
        group: str = "g",
        now: float = 0.0,
        backend: str = "noop",
        config: dict[str, Any] | None = None,
        claims: tuple[str, ...] = (),
        state: JobState = JobState.RUNNING,
    ) -> None:
        event = Register(
            now=now,
            group=group,
            job=job,
            backend=backend,
            config=config or {},
            claims=claims,
            state=state,
        )
        assert self.handle(event) == []

    def start(
        self, kind: str, job: str = "a", group: str = "g", now: float = 0.0, **kw: Any
    ) -> str:
        """Start an operation that must be accepted; return its id."""
        kw.setdefault("timeout", 10.0)
        [effect] = self.handle(Start(now=now, kind=kind, group=group, job=job, **kw))
        assert isinstance(effect, Run)
        return effect.op_id

    def snapshot(self, job: str = "a", group: str = "g", now: float = 0.0, **kw: Any) -> str:
        return self.start(SNAPSHOT, job, group, now, **kw)

    def restore(self, job: str = "a", group: str = "g", now: float = 0.0, **kw: Any) -> str:
        return self.start(RESTORE, job, group, now, **kw)

    def finish(self, op_id: str, now: float = 0.0, ok: bool = True, **kw: Any) -> None:
        assert self.handle(Finish(now=now, op_id=op_id, ok=ok, **kw)) == [Done(op_id=op_id)]

    def job(self, job: str = "a", group: str = "g") -> Job:
        return self.table.jobs[(group, job)]

    def op(self, op_id: str) -> Operation:
        return self.table.operations[op_id]

    def state(self, job: str = "a", group: str = "g") -> JobState:
        return self.job(job, group).state

    def saved(self, job: str = "a", group: str = "g", now: float = 0.0) -> None:
        """Take a registered, running job to SAVED through a snapshot."""
        self.finish(self.snapshot(job, group, now), now)
        assert self.state(job, group) is JobState.SAVED

    def faulted(self, job: str = "a", group: str = "g", now: float = 0.0) -> None:
        self.handle(Lost(now=now, group=group, job=job, reason="the workload went away"))
        assert self.state(job, group) is JobState.FAULTED

    def idle(self, job: str = "a", group: str = "g", now: float = 0.0) -> None:
        """Take a registered job to IDLE: faulted, then reset."""
        self.faulted(job, group, now)
        self.handle(Reset(now=now, group=group, job=job))
        assert self.state(job, group) is JobState.IDLE


@pytest.fixture
def t() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.table.validate()


# --- registration ---------------------------------------------------------------------


@pytest.mark.parametrize("state", [JobState.RUNNING, JobState.SAVED])
def test_register_makes_a_job_running_or_saved(t: Harness, state: JobState) -> None:
    t.register("a", now=3.0, config={"pid": 7}, claims=("pid:7",), state=state)
    assert t.table.jobs == {
        ("g", "a"): Job(
            group="g",
            job="a",
            backend="noop",
            config={"pid": 7},
            claims=["pid:7"],
            state=state,
            since=3.0,
            fault="",
            operation="",
        )
    }
    assert t.table.operations == {}


@pytest.mark.parametrize("state", [JobState.IDLE, JobState.TRANSITIONING, JobState.FAULTED])
def test_register_in_any_other_state_is_refused(t: Harness, state: JobState) -> None:
    error = t.refuse(
        Register(now=0, group="g", job="a", backend="noop", config={}, claims=(), state=state),
        InvalidArgumentError,
    )
    assert state.value in error.message
    t.register("b")
    t.refuse(
        Register(now=0, group="g", job="b", backend="noop", config={}, claims=(), state=state),
        InvalidArgumentError,
    )


def test_register_copies_its_config(t: Harness) -> None:
    config = {"x": 1}
    t.register(config=config)
    config["x"] = 2
    assert t.job().config == {"x": 1}


def test_registering_again_replaces_config_claims_and_state(t: Harness) -> None:
    t.register(now=1.0, config={"x": 1}, claims=("pid:1",))
    t.register(now=2.0, config={"y": 2}, claims=("pid:2",), state=JobState.SAVED)
    job = t.job()
    assert (job.config, job.claims, job.state, job.since) == (
        {"y": 2},
        ["pid:2"],
        JobState.SAVED,
        2.0,
    )
    assert list(t.table.jobs) == [("g", "a")]
    t.register("b", claims=("pid:1",))  # given up by a


@pytest.mark.parametrize("was", ["RUNNING", "SAVED", "IDLE", "FAULTED"])
def test_a_workload_registering_again_vouches_for_its_own_state(t: Harness, was: str) -> None:
    t.register()
    if was == "SAVED":
        t.saved()
    elif was == "IDLE":
        t.idle()
    elif was == "FAULTED":
        t.faulted()
    t.register(now=5.0, state=JobState.SAVED)
    job = t.job()
    assert (job.state, job.fault, job.since) == (JobState.SAVED, "", 5.0)
    t.register(now=6.0, state=JobState.RUNNING)
    assert t.state() is JobState.RUNNING


def test_registering_again_clears_a_failed_operations_fault(t: Harness) -> None:
    t.register()
    op = t.snapshot()
    t.finish(op, ok=False, error="out of memory")
    assert t.state() is JobState.FAULTED
    t.register(state=JobState.RUNNING)
    assert (t.state(), t.job().fault) == (JobState.RUNNING, "")
    assert t.job().operation == op  # still the last operation
    assert t.op(op).status is OpStatus.FAILED


def test_registering_again_during_an_operation_is_refused(t: Harness) -> None:
    t.register()
    op = t.snapshot()
    for state in (JobState.RUNNING, JobState.SAVED):
        error = t.refuse(
            Register(now=1, group="g", job="a", backend="noop", config={}, claims=(), state=state),
            ConflictError,
        )
        assert op in error.message


def test_registering_again_with_another_backend_is_refused(t: Harness) -> None:
    t.register(backend="noop")
    error = t.refuse(
        Register(
            now=1, group="g", job="a", backend="cuda", config={}, claims=(), state=JobState.RUNNING
        ),
        ConflictError,
    )
    assert "noop" in error.message and "cuda" in error.message


def test_the_same_job_in_another_group_is_another_job(t: Harness) -> None:
    t.register("a", group="g1", backend="noop")
    t.register("a", group="g2", backend="cuda")
    assert set(t.table.jobs) == {("g1", "a"), ("g2", "a")}


# --- claims ---------------------------------------------------------------------------


def test_a_claim_belongs_to_one_job_only(t: Harness) -> None:
    t.register("a", claims=("pid:1", "gpu:0"))
    error = t.refuse(
        Register(now=0, group="g", job="b", backend="noop", config={}, claims=("pid:2", "pid:1")),
        AlreadyExistsError,
    )
    assert "pid:1" in error.message and "a" in error.message
    t.refuse(
        Register(now=0, group="other", job="b", backend="noop", config={}, claims=("gpu:0",)),
        AlreadyExistsError,
    )
    t.refuse(
        Start(
            now=0,
            kind=SNAPSHOT,
            group="g",
            job="c",
            timeout=10.0,
            backend="noop",
            claims=("pid:1",),
        ),
        AlreadyExistsError,
    )
    t.register("b", claims=("pid:2",))
    t.snapshot("c", backend="noop", claims=("pid:3",))
    assert t.job("c").claims == ["pid:3"]


def test_a_job_may_claim_again_what_it_holds(t: Harness) -> None:
    t.register("a", claims=("pid:1",))
    t.register("a", claims=("pid:1", "pid:2"))
    assert t.job().claims == ["pid:1", "pid:2"]


def test_a_claim_named_twice_in_one_event_is_held_once(t: Harness) -> None:
    t.register("a", claims=("pid:1", "pid:1"))
    assert t.job("a").claims == ["pid:1"]
    t.snapshot("b", backend="noop", claims=("pid:2", "pid:2"))
    assert t.job("b").claims == ["pid:2"]


# --- starting operations --------------------------------------------------------------


def test_a_snapshot_of_a_running_job_starts_an_operation(t: Harness) -> None:
    t.register(backend="noop")
    effects = t.handle(
        Start(now=2.0, kind=SNAPSHOT, group="g", job="a", timeout=30.0, params={"mode": "full"})
    )
    assert effects == [Run(op_id="op-1")]
    job = t.job()
    assert (job.state, job.operation, job.since) == (JobState.TRANSITIONING, "op-1", 2.0)
    assert t.op("op-1") == Operation(
        op_id="op-1",
        kind=SNAPSHOT,
        group="g",
        job="a",
        backend="noop",
        params={"mode": "full"},
        started=2.0,
        deadline=32.0,
    )
    assert t.table.next_deadline() == 32.0


def test_a_restore_of_a_saved_job_starts_an_operation(t: Harness) -> None:
    t.register(state=JobState.SAVED)
    op = t.restore(now=1.0, timeout=5.0)
    assert (t.state(), t.job().operation) == (JobState.TRANSITIONING, op)
    assert (t.op(op).kind, t.op(op).status, t.op(op).deadline) == (
        RESTORE,
        OpStatus.PENDING,
        6.0,
    )


def test_operation_ids_count_up_across_jobs(t: Harness) -> None:
    t.register("a")
    t.register("b")
    assert [t.snapshot("a"), t.snapshot("b")] == ["op-1", "op-2"]
    t.finish("op-1")
    assert t.restore("a") == "op-3"


@pytest.mark.parametrize(
    ("kind", "setup", "said"),
    [
        (SNAPSHOT, "saved", "it is SAVED"),
        (RESTORE, "running", "it is RUNNING"),
        (SNAPSHOT, "idle", "it is IDLE"),
        (RESTORE, "idle", "it is IDLE"),
    ],
)
def test_start_in_the_wrong_state_is_refused_naming_the_state(
    t: Harness, kind: str, setup: str, said: str
) -> None:
    t.register()
    if setup == "saved":
        t.saved()
    elif setup == "idle":
        t.idle()
    error = t.refuse(Start(now=1, kind=kind, group="g", job="a", timeout=10.0), ConflictError)
    assert said in error.message and kind in error.message


@pytest.mark.parametrize("kind", [SNAPSHOT, RESTORE])
def test_start_during_an_operation_is_refused_naming_it(t: Harness, kind: str) -> None:
    t.register()
    op = t.snapshot()
    error = t.refuse(Start(now=1, kind=kind, group="g", job="a", timeout=10.0), ConflictError)
    assert "TRANSITIONING" in error.message and f"operation {op} is running" in error.message


@pytest.mark.parametrize("kind", [SNAPSHOT, RESTORE])
def test_start_of_a_faulted_job_is_refused_naming_the_fault(t: Harness, kind: str) -> None:
    t.register()
    t.handle(Lost(now=1, group="g", job="a", reason="channel closed: peer reset"))
    error = t.refuse(Start(now=2, kind=kind, group="g", job="a", timeout=10.0), ConflictError)
    assert "FAULTED" in error.message and "channel closed: peer reset" in error.message


def test_a_snapshot_of_an_unknown_job_with_a_backend_creates_it(t: Harness) -> None:
    op = t.snapshot(
        "new", now=4.0, backend="cuda", config={"pid": 9}, claims=("pid:9",), timeout=7.0
    )
    job = t.job("new")
    assert (job.backend, job.config, job.claims, job.state, job.operation) == (
        "cuda",
        {"pid": 9},
        ["pid:9"],
        JobState.TRANSITIONING,
        op,
    )
    assert (t.op(op).backend, t.op(op).deadline) == ("cuda", 11.0)
    t.finish(op, now=5.0)
    assert t.state("new") is JobState.SAVED


def test_a_restore_of_an_unknown_job_is_refused(t: Harness) -> None:
    t.refuse(
        Start(now=0, kind=RESTORE, group="g", job="a", timeout=10.0, backend="noop"), NotFoundError
    )
    t.refuse(Start(now=0, kind=RESTORE, group="g", job="a", timeout=10.0), NotFoundError)


def test_a_snapshot_of_an_unknown_job_without_a_backend_is_refused(t: Harness) -> None:
    t.refuse(Start(now=0, kind=SNAPSHOT, group="g", job="a", timeout=10.0), NotFoundError)
    t.register("a", group="other")
    t.refuse(Start(now=0, kind=SNAPSHOT, group="g", job="a", timeout=10.0), NotFoundError)


def test_start_naming_another_backend_is_refused(t: Harness) -> None:
    t.register(backend="noop")
    error = t.refuse(
        Start(now=0, kind=SNAPSHOT, group="g", job="a", timeout=10.0, backend="cuda"), ConflictError
    )
    assert "noop" in error.message and "cuda" in error.message
    t.snapshot(backend="noop")


def test_an_unknown_operation_kind_is_refused(t: Harness) -> None:
    t.register()
    t.refuse(Start(now=0, kind="migrate", group="g", job="a", timeout=10.0), InvalidArgumentError)


@pytest.mark.parametrize("timeout", [0.0, -1.0, -math.inf, math.nan])
def test_a_timeout_must_be_positive(t: Harness, timeout: float) -> None:
    t.register()
    t.refuse(Start(now=0, kind=SNAPSHOT, group="g", job="a", timeout=timeout), InvalidArgumentError)
    t.refuse(
        Start(now=0, kind=SNAPSHOT, group="g", job="b", timeout=timeout, backend="noop"),
        InvalidArgumentError,
    )


# --- jobs registered without a group --------------------------------------------------


def test_a_job_registered_without_a_group_answers_for_any_group(t: Harness) -> None:
    t.register("a", group="")
    assert t.table.find("g1", "a") is t.job("a", "")
    assert t.table.job("g2", "a") is t.job("a", "")
    op = t.snapshot("a", group="g1")
    assert (t.op(op).group, t.job("a", "").state) == ("", JobState.TRANSITIONING)
    t.finish(op)
    t.restore("a", group="g2")
    assert list(t.table.jobs) == [("", "a")]


def test_a_job_of_the_group_itself_comes_before_one_without_a_group(t: Harness) -> None:
    t.register("a", group="")
    t.register("a", group="g", state=JobState.SAVED)
    assert t.table.find("g", "a") is t.job("a", "g")
    assert t.table.find("h", "a") is t.job("a", "")
    assert t.table.find("g", "b") is None
    with pytest.raises(NotFoundError):
        t.table.job("g", "b")


# --- fencing tokens -------------------------------------------------------------------


def test_fencing_tokens_of_a_group_only_grow(t: Harness) -> None:
    t.register()
    t.finish(t.snapshot(token=5))
    assert t.table.tokens == {"g": 5}
    error = t.refuse(
        Start(now=1, kind=RESTORE, group="g", job="a", timeout=10.0, token=4), LeaseLostError
    )
    assert "4" in error.message and "5" in error.message
    t.finish(t.restore(token=5))  # the same grant may act again
    t.finish(t.snapshot(token=8))
    assert t.table.tokens == {"g": 8}
    t.refuse(Start(now=1, kind=RESTORE, group="g", job="a", timeout=10.0, token=7), LeaseLostError)
    assert t.state() is JobState.SAVED


def test_fencing_tokens_are_kept_per_group(t: Harness) -> None:
    t.register("a", group="g1")
    t.register("b", group="g2")
    t.snapshot("a", group="g1", token=9)
    t.snapshot("b", group="g2", token=1)
    assert t.table.tokens == {"g1": 9, "g2": 1}


def test_a_stale_token_is_refused_even_for_a_new_job(t: Harness) -> None:
    t.register()
    t.snapshot(token=3)
    t.refuse(
        Start(now=1, kind=SNAPSHOT, group="g", job="b", timeout=10.0, token=2, backend="noop"),
        LeaseLostError,
    )
    assert ("g", "b") not in t.table.jobs


def test_token_zero_is_not_checked(t: Harness) -> None:
    t.register()
    t.finish(t.snapshot(token=5))
    t.restore(token=0)
    assert t.table.tokens == {"g": 5}


def test_a_refused_start_does_not_record_its_token(t: Harness) -> None:
    t.register(state=JobState.SAVED)
    t.refuse(Start(now=1, kind=SNAPSHOT, group="g", job="a", timeout=10.0, token=9), ConflictError)
    assert t.table.tokens == {}
    t.restore(token=2)
    assert t.table.tokens == {"g": 2}


def test_tokens_of_a_group_without_a_name_are_kept_apart(t: Harness) -> None:
    t.register("a", group="")
    t.snapshot("a", group="g", token=4)
    assert t.table.tokens == {"g": 4}


# --- finishing ------------------------------------------------------------------------


def test_a_finished_snapshot_saves_the_job(t: Harness) -> None:
    t.register()
    op = t.snapshot(now=1.0)
    effects = t.handle(
        Finish(now=3.0, op_id=op, ok=True, storage_bytes=1 << 30, device_bytes=2 << 30)
    )
    assert effects == [Done(op_id=op)]
    assert (t.state(), t.job().since, t.job().operation) == (JobState.SAVED, 3.0, op)
    o = t.op(op)
    assert (o.status, o.finished, o.storage_bytes, o.device_bytes, o.error) == (
        OpStatus.COMPLETE,
        3.0,
        1 << 30,
        2 << 30,
        "",
    )


def test_a_finished_restore_makes_the_job_running(t: Harness) -> None:
    t.register(state=JobState.SAVED)
    op = t.restore()
    t.finish(op, now=2.0, storage_bytes=0, device_bytes=10)
    assert (t.state(), t.job().since) == (JobState.RUNNING, 2.0)
    assert (t.op(op).status, t.op(op).device_bytes) == (OpStatus.COMPLETE, 10)


@pytest.mark.parametrize("kind", [SNAPSHOT, RESTORE])
def test_a_failed_operation_faults_the_job(t: Harness, kind: str) -> None:
    t.register(state=JobState.RUNNING if kind == SNAPSHOT else JobState.SAVED)
    op = t.start(kind)
    t.finish(op, now=2.0, ok=False, error="CUDA_ERROR_OUT_OF_MEMORY")
    job = t.job()
    assert (job.state, job.since) == (JobState.FAULTED, 2.0)
    assert "CUDA_ERROR_OUT_OF_MEMORY" in job.fault and op in job.fault
    assert (t.op(op).status, t.op(op).error) == (OpStatus.FAILED, "CUDA_ERROR_OUT_OF_MEMORY")


def test_a_failure_without_a_message_still_says_it_failed(t: Harness) -> None:
    t.register()
    op = t.snapshot()
    t.finish(op, ok=False)
    assert t.op(op).error and t.job().fault


def test_finishing_an_unknown_or_finished_operation_is_a_no_op(t: Harness) -> None:
    t.register()
    t.ignore(Finish(now=0, op_id="op-1", ok=True))
    op = t.snapshot()
    t.finish(op, now=1.0)
    t.ignore(Finish(now=2, op_id=op, ok=True))
    t.ignore(Finish(now=2, op_id=op, ok=False, error="late"))
    assert t.state() is JobState.SAVED


# --- deadlines and forgetting ---------------------------------------------------------


def test_an_operation_past_its_deadline_is_cancelled_and_faults_the_job(t: Harness) -> None:
    t.register()
    op = t.snapshot(now=0.0, timeout=10.0)
    assert t.table.next_deadline() == 10.0
    t.ignore(Tick(now=9.99))
    assert t.handle(Tick(now=10.0)) == [Cancel(op_id=op), Done(op_id=op)]
    job = t.job()
    assert (job.state, job.since) == (JobState.FAULTED, 10.0)
    assert "deadline exceeded" in job.fault and op in job.fault
    assert (t.op(op).status, t.op(op).finished) == (OpStatus.FAILED, 10.0)
    assert "deadline exceeded after 10.0 s" in t.op(op).error
    t.ignore(Finish(now=11.0, op_id=op, ok=True))  # the backend answered too late
    assert t.state() is JobState.FAULTED


def test_every_operation_past_its_deadline_is_cancelled_before_any_is_done(
    t: Harness,
) -> None:
    t.register("a")
    t.register("b")
    t.register("c")
    ops = [t.snapshot("a", timeout=1.0), t.snapshot("b", timeout=2.0)]
    later = t.snapshot("c", timeout=50.0)
    effects = t.handle(Tick(now=5.0))
    assert sorted(map(repr, effects)) == sorted(
        map(
            repr,
            [Cancel(op_id=ops[0]), Cancel(op_id=ops[1]), Done(op_id=ops[0]), Done(op_id=ops[1])],
        )
    )
    kinds = [type(e) for e in effects]
    assert kinds == [Cancel, Cancel, Done, Done]
    assert (t.state("a"), t.state("b"), t.state("c")) == (
        JobState.FAULTED,
        JobState.FAULTED,
        JobState.TRANSITIONING,
    )
    assert t.table.next_deadline() == 50.0 and t.op(later).status is OpStatus.PENDING


def test_finished_operations_are_forgotten_after_the_retention() -> None:
    t = Harness(JobTable(op_retention=60.0))
    t.register()
    op = t.snapshot(now=0.0, timeout=100.0)
    t.finish(op, now=5.0)
    assert t.table.next_deadline() == 65.0
    assert t.handle(Tick(now=64.9)) == []
    assert op in t.table.operations
    assert t.handle(Tick(now=65.0)) == []
    assert t.table.operations == {}
    assert t.table.next_deadline() is None
    t.ignore(Finish(now=66.0, op_id=op, ok=True))
    assert t.job().operation == op and t.state() is JobState.SAVED


def test_no_new_job_over_the_tables_limit() -> None:
    t = Harness(JobTable(max_jobs=2))
    t.register("a")
    t.snapshot("b", backend="noop", config={})
    t.refuse(
        Register(
            now=0.0,
            group="g",
            job="c",
            backend="noop",
            config={},
            claims=(),
            state=JobState.RUNNING,
        ),
        ResourceExhaustedError,
    )
    t.refuse(
        Start(now=0.0, kind=SNAPSHOT, group="g", job="c", timeout=10.0, backend="noop"),
        ResourceExhaustedError,
    )
    t.register("a", now=1.0)  # a known job registers again whatever the limit
    assert JobTable.from_dict(t.table.to_dict(), max_jobs=1).jobs.keys() == t.table.jobs.keys()


def test_pending_operations_are_never_forgotten() -> None:
    t = Harness(JobTable(op_retention=0.0, max_operations=1))
    t.register("a")
    t.register("b")
    t.finish(t.snapshot("a", now=0.0), now=0.0)
    pending = [t.snapshot("b", now=1.0, timeout=1e9), t.restore("a", now=1.0, timeout=1e9)]
    t.handle(Tick(now=1e6))
    assert list(t.table.operations) == pending
    assert all(t.op(op).status is OpStatus.PENDING for op in pending)


def test_over_the_limit_the_oldest_finished_operations_are_forgotten_first() -> None:
    t = Harness(JobTable(op_retention=1e9, max_operations=3))
    t.register("a")
    t.register("b")
    ops = []
    for i in range(4):
        ops.append(t.start(SNAPSHOT if i % 2 == 0 else RESTORE, "a", now=float(i)))
        t.finish(ops[-1], now=float(i))
    pending = t.snapshot("b", now=10.0)
    t.handle(Tick(now=10.0))
    assert list(t.table.operations) == [ops[2], ops[3], pending]
    t.handle(Tick(now=11.0))
    assert list(t.table.operations) == [ops[2], ops[3], pending]


def test_operations_are_forgotten_only_on_a_tick() -> None:
    t = Harness(JobTable(op_retention=1e9, max_operations=1))
    t.register()
    first = t.snapshot(now=0.0)
    t.finish(first, now=1.0)
    t.finish(t.restore(now=2.0), now=3.0)
    assert len(t.table.operations) == 2
    t.handle(Tick(now=4.0))
    assert first not in t.table.operations and len(t.table.operations) == 1


def test_next_deadline_is_the_earliest_of_deadlines_and_expiries() -> None:
    t = Harness(JobTable(op_retention=30.0))
    assert t.table.next_deadline() is None
    t.register("a")
    t.register("b")
    op = t.snapshot("a", now=0.0, timeout=100.0)
    t.snapshot("b", now=0.0, timeout=50.0)
    assert t.table.next_deadline() == 50.0
    t.finish(op, now=10.0)
    assert t.table.next_deadline() == 40.0


# --- lost workloads -------------------------------------------------------------------


@pytest.mark.parametrize("state", [JobState.RUNNING, JobState.SAVED])
def test_a_lost_workload_faults_its_job(t: Harness, state: JobState) -> None:
    t.register(state=state)
    assert t.handle(Lost(now=4.0, group="g", job="a", reason="process 17 exited")) == []
    job = t.job()
    assert (job.state, job.fault, job.since) == (JobState.FAULTED, "process 17 exited", 4.0)


def test_a_lost_idle_job_is_faulted(t: Harness) -> None:
    t.register()
    t.idle()
    t.handle(Lost(now=1, group="g", job="a", reason="gone"))
    assert (t.state(), t.job().fault) == (JobState.FAULTED, "gone")


def test_losing_a_faulted_or_unknown_job_is_a_no_op(t: Harness) -> None:
    t.register()
    t.handle(Lost(now=1, group="g", job="a", reason="first"))
    t.ignore(Lost(now=2, group="g", job="a", reason="second"))
    assert t.job().fault == "first"
    t.ignore(Lost(now=2, group="g", job="nobody", reason="gone"))


def test_a_lost_workload_without_a_reason_is_still_faulted_with_one(t: Harness) -> None:
    t.register()
    t.handle(Lost(now=1, group="g", job="a", reason=""))
    assert t.state() is JobState.FAULTED and t.job().fault


def test_a_workload_lost_during_an_operation_fails_the_operation(t: Harness) -> None:
    t.register()
    op = t.snapshot(now=1.0)
    assert t.handle(Lost(now=2.0, group="g", job="a", reason="channel closed")) == [
        Cancel(op_id=op),
        Done(op_id=op),
    ]
    job = t.job()
    assert job.state is JobState.FAULTED and op in job.fault and "channel closed" in job.fault
    assert (t.op(op).status, t.op(op).finished) == (OpStatus.FAILED, 2.0)
    assert t.table.next_deadline() == 2.0 + t.table.op_retention
    t.ignore(Finish(now=3.0, op_id=op, ok=True))  # the backend gives up later
    # the workload comes back: it can be moved again, by one operation at a time
    t.register(now=4.0)
    again = t.snapshot(now=5.0)
    assert [o.op_id for o in t.table.operations.values() if o.status is OpStatus.PENDING] == [again]


def test_a_workload_that_says_goodbye_is_forgotten(t: Harness) -> None:
    t.register(claims=("pid:1",))
    t.register("b", claims=("pid:2",), state=JobState.SAVED)
    assert t.handle(Forget(now=1.0, group="g", job="a", reason="deregistered")) == []
    assert ("g", "a") not in t.table.jobs and ("g", "b") in t.table.jobs
    t.register("c", claims=("pid:1",))  # its claims are free again
    t.ignore(Forget(now=2.0, group="g", job="nobody", reason="deregistered"))


def test_forgetting_a_job_in_an_operation_fails_the_operation_instead(t: Harness) -> None:
    t.register()
    op = t.snapshot(now=1.0)
    assert t.handle(Forget(now=2.0, group="g", job="a", reason="deregistered")) == [
        Cancel(op_id=op),
        Done(op_id=op),
    ]
    assert t.state() is JobState.FAULTED and t.op(op).status is OpStatus.FAILED


@pytest.mark.parametrize("bad", [JobState.IDLE, JobState.TRANSITIONING, JobState.FAULTED])
def test_a_backend_can_only_report_running_or_saved(t: Harness, bad: JobState) -> None:
    t.register()
    t.refuse(Reconciled(now=1.0, group="g", job="a", state=bad), InvalidArgumentError)


# --- reset and reconcile --------------------------------------------------------------


def test_reset_takes_a_faulted_job_to_idle_and_asks_its_backend(t: Harness) -> None:
    t.register()
    t.faulted()
    assert t.handle(Reset(now=3.0, group="g", job="a")) == [Reconcile(group="g", job="a")]
    job = t.job()
    assert (job.state, job.fault, job.since) == (JobState.IDLE, "", 3.0)


@pytest.mark.parametrize("setup", ["running", "saved", "transitioning", "idle"])
def test_reset_of_a_job_that_is_not_faulted_is_refused(t: Harness, setup: str) -> None:
    t.register()
    if setup == "saved":
        t.saved()
    elif setup == "transitioning":
        t.snapshot()
    elif setup == "idle":
        t.idle()
    error = t.refuse(Reset(now=1, group="g", job="a"), ConflictError)
    assert t.state().value in error.message


def test_reset_of_an_unknown_job_is_refused(t: Harness) -> None:
    t.refuse(Reset(now=1, group="g", job="a"), NotFoundError)


def test_reset_of_a_job_without_a_group_asks_about_it_by_its_own_key(t: Harness) -> None:
    t.register("a", group="")
    t.faulted("a", group="")
    assert t.handle(Reset(now=1, group="g", job="a")) == [Reconcile(group="", job="a")]


@pytest.mark.parametrize("answer", [JobState.RUNNING, JobState.SAVED])
def test_reconciled_sets_the_state_the_backend_tells(t: Harness, answer: JobState) -> None:
    t.register()
    t.idle()
    assert t.handle(Reconciled(now=7.0, group="g", job="a", state=answer)) == []
    assert (t.state(), t.job().since, t.job().fault) == (answer, 7.0, "")


def test_reconciled_corrects_a_running_or_saved_job(t: Harness) -> None:
    t.register(state=JobState.RUNNING)
    t.handle(Reconciled(now=1, group="g", job="a", state=JobState.SAVED))
    assert t.state() is JobState.SAVED
    t.handle(Reconciled(now=2, group="g", job="a", state=JobState.RUNNING))
    assert t.state() is JobState.RUNNING


def test_a_backend_that_cannot_tell_faults_the_job(t: Harness) -> None:
    t.register()
    t.idle()
    t.handle(Reconciled(now=2.0, group="g", job="a", state=None, reason="no such process"))
    assert (t.state(), t.job().fault, t.job().since) == (JobState.FAULTED, "no such process", 2.0)
    t.register("b")
    t.handle(Reconciled(now=2.0, group="g", job="b", state=None))
    assert t.state("b") is JobState.FAULTED and t.job("b").fault


@pytest.mark.parametrize("setup", ["transitioning", "faulted", "unknown"])
def test_reconciled_is_ignored_when_something_newer_happened(t: Harness, setup: str) -> None:
    t.register()
    if setup == "transitioning":
        t.snapshot()
    elif setup == "faulted":
        t.faulted()
    job = "nobody" if setup == "unknown" else "a"
    for answer in (JobState.RUNNING, JobState.SAVED, None):
        t.ignore(Reconciled(now=9.0, group="g", job=job, state=answer, reason="cannot tell"))


# --- recovery -------------------------------------------------------------------------


def test_recover_fails_what_ran_and_asks_about_the_rest(t: Harness) -> None:
    t.register("running")
    t.register("saved", state=JobState.SAVED)
    t.register("moving")
    t.register("faulted")
    t.register("idle")
    done = t.snapshot("running", now=1.0)
    t.finish(done, now=2.0, storage_bytes=5)
    t.register("running", now=2.5)
    moving = t.snapshot("moving", now=3.0)
    t.faulted("faulted", now=3.0)
    t.idle("idle", now=3.0)
    finished_before = t.table.to_dict()["operations"][0]

    effects = t.handle(Recover(now=50.0))

    assert t.table.epoch == 1
    assert effects == [
        Reconcile(group="g", job="running"),
        Reconcile(group="g", job="saved"),
        Reconcile(group="g", job="idle"),
    ]
    job = t.job("moving")
    assert (job.state, job.since) == (JobState.FAULTED, 50.0)
    assert moving in job.fault and "interrupted" in job.fault
    op = t.op(moving)
    assert (op.status, op.finished) == (OpStatus.FAILED, 50.0)
    assert op.error.startswith("interrupted")
    assert t.table.to_dict()["operations"][0] == finished_before
    assert t.job("faulted").fault == "the workload went away"
    assert t.state("idle") is JobState.IDLE and t.state("saved") is JobState.SAVED
    t.ignore(Finish(now=51.0, op_id=moving, ok=True))
    t.handle(Recover(now=60.0))
    assert t.table.epoch == 2


def test_recover_of_an_empty_table_starts_an_epoch(t: Harness) -> None:
    assert t.handle(Recover(now=0.0)) == []
    assert t.table.epoch == 1


def test_operation_ids_keep_counting_after_a_restart(t: Harness) -> None:
    t.register()
    t.finish(t.snapshot())
    restored = Harness(JobTable.from_dict(json.loads(json.dumps(t.table.to_dict()))))
    restored.handle(Recover(now=1.0))
    restored.handle(Reconciled(now=2.0, group="g", job="a", state=JobState.SAVED))
    assert restored.restore() == "op-2"


# --- ids ------------------------------------------------------------------------------

BAD_IDS = ["", "x" * 257, "é" * 129, "a\nb", "a\x00b", "tab\there", "\x7f"]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_invalid_ids_are_refused(t: Harness, bad: str) -> None:
    t.register()
    t.refuse(Register(now=0, group="g", job=bad, backend="noop", config={}), InvalidArgumentError)
    t.refuse(
        Start(now=0, kind=SNAPSHOT, group="g", job=bad, timeout=10.0, backend="noop"),
        InvalidArgumentError,
    )
    if bad:  # an empty group means any group
        t.refuse(
            Register(now=0, group=bad, job="a", backend="noop", config={}), InvalidArgumentError
        )
        t.refuse(
            Start(now=0, kind=SNAPSHOT, group=bad, job="a", timeout=10.0), InvalidArgumentError
        )


@pytest.mark.parametrize("good", ["x" * 256, "é" * 128, "jöb 🚀", "a.b-c_d:e/f"])
def test_ids_up_to_256_bytes_of_printable_text_are_accepted(t: Harness, good: str) -> None:
    t.register(good, group=good)
    t.snapshot(good, group=good)
    assert t.state(good, good) is JobState.TRANSITIONING


def test_anything_but_an_event_is_refused(t: Harness) -> None:
    with pytest.raises(TypeError):
        t.table.handle("Register")  # type: ignore[arg-type]


# --- persistence ----------------------------------------------------------------------


def busy_table() -> Harness:
    """A table with a job in every state and operations of every status."""
    t = Harness(JobTable(op_retention=100.0))
    t.register("running", group="g1", config={"n": [1, 2]}, claims=("pid:1",))
    t.register("saved", group="g1", state=JobState.SAVED, backend="cuda")
    t.register("any", group="", claims=("pid:2", "gpu:0"))
    t.register("faulted", group="g2")
    t.register("idle", group="g2")
    t.finish(t.snapshot("running", group="g1", now=1.0, token=3), now=2.0, storage_bytes=7)
    t.register("running", group="g1", now=2.5, claims=("pid:1",))
    t.start(SNAPSHOT, "any", group="g2", now=3.0, token=2, params={"tags": ["kv"]})
    failing = t.restore("saved", group="g1", now=4.0, token=4)
    t.finish(failing, now=5.0, ok=False, error='quote " and newline\n')
    t.register("saved", group="g1", now=5.5, state=JobState.SAVED, backend="cuda")
    t.faulted("faulted", group="g2", now=6.0)
    t.idle("idle", group="g2", now=6.0)
    t.handle(Recover(now=7.0))
    t.snapshot("running", group="g1", now=8.0, timeout=20.0)
    return t


FOLLOW_UP: list[Event] = [
    Finish(now=9.0, op_id="op-4", ok=True, storage_bytes=1, device_bytes=2),
    Start(now=10.0, kind=RESTORE, group="g1", job="running", timeout=10.0, token=5),
    Reset(now=11.0, group="g2", job="faulted"),
    Reconciled(now=12.0, group="g2", job="faulted", state=JobState.SAVED),
    Reconciled(now=12.0, group="g1", job="saved", state=JobState.SAVED),
    Start(
        now=12.5, kind=RESTORE, group="g1", job="saved", timeout=1.0, token=1
    ),  # stale: refused by both
    Reset(now=12.5, group="g1", job="running"),  # not faulted: refused by both
    Start(now=13.0, kind=RESTORE, group="g1", job="saved", timeout=1.0, token=6),
    Lost(now=13.5, group="g1", job="running", reason="gone"),
    Tick(now=14.0),
    Recover(now=15.0),
    Tick(now=200.0),
]


def test_to_dict_and_from_dict_round_trip() -> None:
    t = busy_table()
    data = t.table.to_dict()
    for copy in (JobTable.from_dict(data), JobTable.from_dict(json.loads(json.dumps(data)))):
        copy.validate()
        assert copy.to_dict() == data
        assert copy.next_deadline() == t.table.next_deadline()
        assert (copy.epoch, copy.next_op, copy.tokens) == (1, 5, {"g1": 4, "g2": 2})


def test_a_table_read_back_behaves_the_same() -> None:
    t = busy_table()
    data = json.loads(json.dumps(t.table.to_dict()))
    copy = Harness(JobTable.from_dict(data, op_retention=100.0))
    for event in FOLLOW_UP:
        outcomes: list[object] = []
        for h in (t, copy):
            try:
                outcomes.append(h.handle(event))
            except TimeSliceError as exc:
                outcomes.append(type(exc))
        assert outcomes[0] == outcomes[1], event
        assert t.table.to_dict() == copy.table.to_dict(), event
        assert t.table.next_deadline() == copy.table.next_deadline()
    assert t.table.operations == {}  # all forgotten by the last tick


def test_from_dict_takes_the_tables_options() -> None:
    table = JobTable.from_dict(busy_table().table.to_dict(), op_retention=5.0, max_operations=1)
    assert (table.op_retention, table.max_operations) == (5.0, 1)


def test_to_dict_is_a_copy(t: Harness) -> None:
    t.register(config={"nested": {"x": 1}}, claims=("pid:1",))
    t.snapshot(token=2, params={"tags": ["a"]})
    data = t.table.to_dict()
    data["jobs"][0]["config"]["nested"]["x"] = 2
    data["jobs"][0]["claims"].append("pid:2")
    data["operations"][0]["params"]["tags"].append("b")
    data["tokens"]["g"] = 99
    assert t.job().config == {"nested": {"x": 1}} and t.job().claims == ["pid:1"]
    assert t.op("op-1").params == {"tags": ["a"]} and t.table.tokens == {"g": 2}


def test_a_limited_copy_keeps_every_pending_and_the_newest_finished_operations(
    t: Harness,
) -> None:
    t.register("a")
    t.register("b")
    t.snapshot("b", now=0.0, timeout=100.0)  # pending throughout
    finished = []
    for i in range(6):
        op = t.snapshot("a", now=float(i)) if i % 2 == 0 else t.restore("a", now=float(i))
        t.handle(Finish(now=float(i), op_id=op, ok=True))
        finished.append(op)
    kept = [o["op_id"] for o in t.table.to_dict(finished=2)["operations"]]
    assert kept == ["op-1", *finished[-2:]]
    restored = JobTable.from_dict(t.table.to_dict(finished=2))
    restored.validate()
    assert restored.to_dict() == t.table.to_dict(finished=2)
    assert [o["op_id"] for o in t.table.to_dict(finished=0)["operations"]] == ["op-1"]


def encoded_by(monkeypatch: pytest.MonkeyPatch, to_dict: str, name: str) -> list[str]:
    """What the table's `to_dict` function of that name (`_op_dict`, `_job_dict`) is
    called on from now, each by its attribute `name`: what is encoded."""
    import timeslice.agent.state as state_module

    encoded: list[str] = []
    original = getattr(state_module, to_dict)

    def counted(item: Any) -> dict[str, Any]:
        encoded.append(getattr(item, name))
        result: dict[str, Any] = original(item)
        return result

    monkeypatch.setattr(state_module, to_dict, counted)
    return encoded


def test_the_saved_text_is_the_limited_copy_and_encodes_each_operation_once_per_status(
    t: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded = encoded_by(monkeypatch, "_op_dict", "op_id")
    t.register("a", config={"nested": {"x": 1}}, claims=("pid:1",))
    t.register("b")
    t.snapshot("b", now=0.0, timeout=100.0)  # pending throughout
    for i in range(4):
        op = t.snapshot("a", now=float(i)) if i % 2 == 0 else t.restore("a", now=float(i))
        t.handle(Finish(now=float(i), op_id=op, ok=True))
        text = t.table.encode(finished=2)
        expected = json.loads(json.dumps(t.table.to_dict(finished=2)))
        assert json.loads(text) == expected
        restored = JobTable.from_dict(json.loads(text))
        restored.validate()
    encoded.clear()
    t.table.encode(finished=2)
    assert encoded == []  # nothing changed since: every text is kept
    t.handle(Finish(now=9.0, op_id="op-1", ok=True))
    text = t.table.encode(finished=2)
    assert encoded == ["op-1"]  # the one that ended, once more
    assert json.loads(text) == json.loads(json.dumps(t.table.to_dict(finished=2)))


def test_the_saved_text_encodes_again_only_the_jobs_that_changed(
    t: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded = encoded_by(monkeypatch, "_job_dict", "job")

    def saved() -> list[str]:
        """The jobs a save encodes; its text must be the table's."""
        encoded.clear()
        text = t.table.encode(finished=4)
        jobs = sorted(encoded)
        assert json.loads(text) == json.loads(json.dumps(t.table.to_dict(finished=4)))
        return jobs

    for job in "abc":
        t.register(job, config={"nested": {"job": job}}, claims=(f"pid:{ord(job)}",))
    assert saved() == ["a", "b", "c"]
    assert saved() == []  # nothing changed: every job's text is kept
    op = t.snapshot("b", now=1.0)  # b moves: its state, operation and time
    assert saved() == ["b"]
    t.finish(op, now=2.0)
    assert saved() == ["b"]
    # Registered again with the same fields: a new job, encoded again (its config
    # and claims could be others).
    t.register("c", now=0.0, config={"nested": {"job": "c"}}, claims=("pid:99",))
    assert saved() == ["c"]
    t.handle(Forget(now=3.0, group="g", job="a", reason="bye"))
    assert saved() == []
