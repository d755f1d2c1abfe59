"""The v1alpha1 protocol's rules in our pure tables (spec/wire-api.md, end), and the
v1alpha1 client's names for our errors.

- On the agent, groups do not namespace job ids: a request with an empty group
  finds the job by its id alone (a clear error when several groups know that
  id); a request that names a group is exact.
- A Yield by a job that does not hold the lock is PERMISSION_DENIED.
"""

from __future__ import annotations

import pytest

from timeslice.agent.state import (
    RESTORE,
    SNAPSHOT,
    Done,
    Finish,
    JobState,
    JobTable,
    Reconcile,
    Register,
    Reset,
    Run,
    Start,
)
from timeslice.errors import (
    Code,
    ConflictError,
    LeaseLostError,
    NotFoundError,
    NotHolderError,
    PermissionDeniedError,
    TimeSliceError,
    YieldNotHeldError,
)
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.state import LockTable


def register(table: JobTable, job: str, group: str, backend: str = "noop") -> None:
    event = Register(
        now=0.0, group=group, job=job, backend=backend, config={}, state=JobState.RUNNING
    )
    assert table.handle(event) == []
    table.validate()


def start(table: JobTable, kind: str, job: str, group: str, token: int = 0) -> str:
    event = Start(now=1.0, kind=kind, group=group, job=job, timeout=10.0, token=token)
    [run] = table.handle(event)
    table.validate()
    assert isinstance(run, Run)
    return run.op_id


def refused(table: JobTable, event: Start | Reset, error: type[TimeSliceError]) -> str:
    before = table.to_dict()
    with pytest.raises(error) as caught:
        table.handle(event)
    assert table.to_dict() == before
    return str(caught.value)


# --- the agent: a job found by its id alone --------------------------------------------


def test_an_empty_group_finds_the_job_registered_in_a_group() -> None:
    table = JobTable()
    register(table, "trainer", "g1")
    op_id = start(table, SNAPSHOT, "trainer", "")
    op = table.operations[op_id]
    assert (op.group, op.job) == ("g1", "trainer")
    assert table.jobs[("g1", "trainer")].state is JobState.TRANSITIONING
    assert table.handle(Finish(now=2.0, op_id=op_id, ok=True)) == [Done(op_id=op_id)]
    assert table.jobs[("g1", "trainer")].state is JobState.SAVED
    restored = table.operations[start(table, RESTORE, "trainer", "")]
    assert (restored.group, restored.kind) == ("g1", RESTORE)
    assert list(table.jobs) == [("g1", "trainer")]  # no second job under ""


def test_an_id_known_in_several_groups_needs_its_group() -> None:
    table = JobTable()
    register(table, "trainer", "g1")
    register(table, "trainer", "g2")
    event = Start(now=1.0, kind=SNAPSHOT, group="", job="trainer", timeout=10.0)
    message = refused(table, event, ConflictError)
    assert message == "job 'trainer' is known in groups 'g1', 'g2': name its group"
    assert refused(table, Reset(now=1.0, group="", job="trainer"), ConflictError) == message
    # Each group still finds its own.
    assert table.operations[start(table, SNAPSHOT, "trainer", "g2")].group == "g2"
    assert table.operations[start(table, SNAPSHOT, "trainer", "g1")].group == "g1"


def test_an_ambiguous_id_names_a_bounded_number_of_groups() -> None:
    table = JobTable()
    for n in range(9):
        register(table, "w", f"group-{n}")
    event = Start(now=1.0, kind=SNAPSHOT, group="", job="w", timeout=10.0)
    message = refused(table, event, ConflictError)
    assert message.endswith("'group-3' and 5 more: name its group"), message


def test_a_named_group_is_exact() -> None:
    table = JobTable()
    register(table, "trainer", "g1")
    event = Start(now=1.0, kind=SNAPSHOT, group="g2", job="trainer", timeout=10.0)
    assert "in group 'g2'" in refused(table, event, NotFoundError)
    # A job registered without a group still answers for any group that is named.
    register(table, "sampler", "")
    assert table.operations[start(table, SNAPSHOT, "sampler", "g2")].group == ""


def test_an_unknown_id_with_an_empty_group_is_not_found() -> None:
    table = JobTable()
    register(table, "trainer", "g1")
    event = Start(now=1.0, kind=RESTORE, group="", job="nobody", timeout=10.0)
    refused(table, event, NotFoundError)


def test_a_reset_with_an_empty_group_finds_the_faulted_job() -> None:
    table = JobTable()
    register(table, "trainer", "g1")
    op_id = start(table, SNAPSHOT, "trainer", "")
    table.handle(Finish(now=2.0, op_id=op_id, ok=False, error="boom"))
    assert table.jobs[("g1", "trainer")].state is JobState.FAULTED
    assert table.handle(Reset(now=3.0, group="", job="trainer")) == [
        Reconcile(group="g1", job="trainer")
    ]


def test_a_job_found_by_its_id_is_fenced_by_its_own_group() -> None:
    table = JobTable()
    register(table, "trainer", "g1")
    op_id = start(table, SNAPSHOT, "trainer", "g1", token=5)
    table.handle(Finish(now=2.0, op_id=op_id, ok=True))
    event = Start(now=3.0, kind=RESTORE, group="", job="trainer", timeout=10.0, token=4)
    assert "group 'g1'" in refused(table, event, LeaseLostError)
    start(table, RESTORE, "trainer", "", token=6)
    assert table.tokens == {"g1": 6}


# --- the orchestrator: a Yield by a job that does not hold the lock --------------------


def test_a_yield_by_a_job_that_does_not_hold_the_lock_is_permission_denied() -> None:
    table = LockTable()
    table.handle(ev.Acquire(now=0.0, group="g", job="a", call_id="a"))
    for job in ("b", "never-seen"):
        with pytest.raises(YieldNotHeldError) as caught:
            table.handle(ev.Yield(now=1.0, group="g", job=job))
        error = caught.value
        assert error.code is Code.PERMISSION_DENIED and error.status.name == "PERMISSION_DENIED"
        # Whoever caught these before still catches them.
        assert isinstance(error, NotHolderError) and isinstance(error, ConflictError)
        assert isinstance(error, PermissionDeniedError)
        assert str(error) == f"job {job} does not hold group g (a does)"
    table.handle(ev.Yield(now=2.0, group="g", job="a"))
    with pytest.raises(YieldNotHeldError, match=r"\(nobody does\)"):
        table.handle(ev.Yield(now=3.0, group="g", job="a"))
    table.validate()


def test_a_force_release_of_a_free_group_stays_failed_precondition() -> None:
    table = LockTable()
    table.handle(ev.Acquire(now=0.0, group="g", job="a", call_id="a"))
    with pytest.raises(NotHolderError) as caught:
        table.handle(ev.ForceRelease(now=1.0, group="g", job="b"))
    assert caught.value.code is Code.FAILED_PRECONDITION
