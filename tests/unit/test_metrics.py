"""The metrics as derived from the lock table's own events and effects: the real
`LockTable` handles each event, and what it answers goes to
`OrchestratorMetrics.observe` as the journal engine hands it over. The clock is
the events' own, so every figure is exact."""

from __future__ import annotations

from typing import Any

import pytest

from timeslice.agent.state import JobState, Operation, OpStatus
from timeslice.kinds import OpKind
from timeslice.metrics.agent import AgentMetrics
from timeslice.metrics.labels import OTHER_JOBS, JobLabels
from timeslice.metrics.orchestrator import OrchestratorMetrics
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.state import LockTable


class Fed:
    """A lock table whose every event's effects are observed, at a fixed clock."""

    def __init__(self) -> None:
        self.table = LockTable()
        self.clock = 0.0
        groups = lambda: ((g.name, len(g.queue)) for g in self.table.groups.values())  # noqa: E731
        self.metrics = OrchestratorMetrics(groups, lambda: 2, clock=lambda: self.clock)

    def handle(self, event: ev.Event) -> list[ev.Effect]:
        effects = self.table.handle(event)
        self.metrics.observe(event, effects)
        self.table.validate()
        return effects

    def acquire(self, job: str, now: float, group: str = "g") -> list[ev.Effect]:
        return self.handle(ev.Acquire(now=now, group=group, job=job, call_id=f"{job}-{now}"))

    def value(self, name: str, **labels: str) -> float:
        found = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found


def token_of(effects: list[ev.Effect]) -> int:
    return next(e.token for e in effects if isinstance(e, ev.SwitchStarted | ev.Granted))


@pytest.fixture
def fed() -> Fed:
    fed = Fed()
    fed.handle(ev.SetGroupNodes(now=0, group="g", nodes=("n1", "n2")))
    return fed


def test_a_switch_is_timed_in_its_parts_and_its_bytes_counted(fed: Fed) -> None:
    first = token_of(fed.acquire("a", 1.0))
    fed.handle(ev.SwitchDone(now=1.5, group="g", token=first, restored=False, began=1.1))
    fed.acquire("b", 2.0)
    assert fed.value("timeslice_orchestrator_queue_depth", group_id="g") == 1
    second = token_of(fed.handle(ev.Yield(now=5.0, group="g", job="a")))
    steps = (
        ("n1", "a", "snapshot", 0.4, 1000),
        ("n2", "a", "snapshot", 0.6, 3000),  # the slower node sets the phase
        ("n1", "b", "restore", 0.2, 500),
        ("n2", "b", "restore", 0.9, 700),
    )
    done = ev.SwitchDone(
        now=7.0, group="g", token=second, restored=True, began=5.1, steps=steps, moved_bytes=5200
    )
    fed.handle(done)
    fed.clock = 10.0
    phase = "timeslice_switch_phase_duration_seconds_sum"
    assert fed.value(phase, group_id="g", phase="snapshot") == pytest.approx(0.6)
    assert fed.value(phase, group_id="g", phase="restore") == pytest.approx(0.9)
    # the first switch (0.5 s, nothing moved) and this one (2 s)
    assert fed.value(phase, group_id="g", phase="overhead") == pytest.approx(0.5 + 0.5)
    assert fed.value(phase, group_id="g", phase="queue_wait") == pytest.approx(0 + 3.0)
    assert fed.value("timeslice_switch_duration_seconds_sum", group_id="g", outcome="ok") == 2.5
    moved = "timeslice_switch_moved_bytes_total"
    assert fed.value(moved, group_id="g", operation="snapshot") == 4000
    assert fed.value(moved, group_id="g", operation="restore") == 1200
    v1 = "timeslice_orchestrator_agent_operation_duration_seconds_count"
    assert fed.value(v1, group_id="g", job_id="a", node="n2", operation="snapshot") == 1
    assert fed.value("timeslice_orchestrator_acquire_wait_duration_seconds_sum", group_id="g") == (
        pytest.approx(0.5 + 5.0)
    )
    # Busy: a from 1.5 to 5.0, b from 7.0 to the scrape at 10.0.
    assert fed.value("timeslice_group_busy_seconds_total", group_id="g") == pytest.approx(6.5)
    held = "timeslice_job_held_seconds_total"
    assert fed.value(held, group_id="g", job_id="a") == pytest.approx(3.5)
    assert fed.value(held, group_id="g", job_id="b") == pytest.approx(3.0)
    assert fed.value("timeslice_job_switching_seconds_total", group_id="g", job_id="b") == 2.0
    assert fed.value("timeslice_job_waited_seconds_total", group_id="g", job_id="b") == 3.0
    assert fed.value("timeslice_agents_connected") == 2
    assert fed.value("timeslice_orchestrator_queue_depth", group_id="g") == 0


def test_revocations_departures_and_quarantines_by_reason(fed: Fed) -> None:
    token = token_of(fed.acquire("a", 1.0))
    fed.handle(ev.SwitchDone(now=1.0, group="g", token=token, restored=False))
    fed.acquire("b", 2.0)
    fed.acquire("c", 2.0)
    fed.handle(
        ev.DropWaiter(now=3.0, group="g", job="c", call_id="c-2.0", reason=ev.Reason.CANCELLED)
    )
    next_token = token_of(fed.handle(ev.ForceRelease(now=4.0, group="g", reason="stuck")))
    fault = (("b", "restore failed on n1"),)
    fed.handle(
        ev.SwitchDone(now=5.0, group="g", token=next_token, restored=False, faults=fault, began=4.0)
    )
    revoked = "timeslice_revocations_total"
    assert fed.value(revoked, group_id="g", reason="operator") == 1
    assert fed.value(revoked, group_id="g", reason="switch_failed") == 1
    departed = "timeslice_queue_departures_total"
    assert fed.value(departed, group_id="g", reason="cancelled") == 1
    assert fed.value("timeslice_quarantines_total", group_id="g") == 1
    assert fed.value("timeslice_switch_duration_seconds_count", group_id="g", outcome="failed") == 1
    # a held from 1 to 4; b never held (its switch failed)
    assert fed.value("timeslice_group_busy_seconds_total", group_id="g") == 3.0
    assert fed.value("timeslice_job_held_seconds_total", group_id="g", job_id="b") == 0


def test_a_yield_with_nobody_waiting_is_a_deferred_snapshot() -> None:
    fed = Fed()  # a group without nodes: grants are live at once
    fed.acquire("a", 1.0)
    fed.handle(ev.Yield(now=2.0, group="g", job="a"))
    fed.acquire("a", 3.0)  # its context was kept: no switch
    assert fed.value("timeslice_orchestrator_deferred_snapshots_total", group_id="g") == 1
    assert fed.value("timeslice_grants_total", group_id="g", context="live") == 2
    assert fed.value("timeslice_yields_total", group_id="g") == 1
    assert fed.value("timeslice_switch_duration_seconds_count", group_id="g", outcome="ok") == 0
    fed.clock = 4.5
    assert fed.value("timeslice_group_busy_seconds_total", group_id="g") == 2.5


def test_asking_again_for_a_grant_held_counts_nothing_twice() -> None:
    fed = Fed()
    fed.acquire("a", 1.0)
    fed.acquire("a", 2.0)  # the holder asks again (a retry)
    fed.clock = 3.0
    assert fed.value("timeslice_grants_total", group_id="g", context="live") == 1
    assert (
        fed.value("timeslice_orchestrator_acquire_wait_duration_seconds_count", group_id="g") == 1
    )
    assert fed.value("timeslice_group_busy_seconds_total", group_id="g") == 2.0


def test_job_labels_are_bounded() -> None:
    labels = JobLabels(limit=2)
    assert [labels(j) for j in ("a", "b", "c", "a", "d")] == ["a", "b", OTHER_JOBS, "a", OTHER_JOBS]


def test_journal_commits_are_timed() -> None:
    fed = Fed()
    fed.metrics.committed(0.002, 3)
    fed.metrics.committed(0.004, 1)
    assert fed.value("timeslice_journal_commit_duration_seconds_count") == 2
    assert fed.value("timeslice_journal_commit_duration_seconds_sum") == pytest.approx(0.006)
    assert fed.value("timeslice_journal_events_total") == 4


def operation(kind: OpKind, status: OpStatus, **kw: Any) -> Operation:
    return Operation(
        op_id="op-1", kind=kind, group="g", job="a", backend="noop", params={},
        started=10.0, deadline=20.0, status=status, **kw,
    )  # fmt: skip


def test_agent_operations_by_backend_kind_and_outcome() -> None:
    states = [JobState.SAVED, JobState.SAVED, JobState.FAULTED]
    metrics = AgentMetrics(lambda: states, lambda: 4)
    ok = operation(
        OpKind.SNAPSHOT, OpStatus.COMPLETE, finished=12.5, storage_bytes=100, device_bytes=80
    )
    metrics.finished(ok)
    metrics.finished(operation(OpKind.RESTORE, OpStatus.FAILED, finished=11.0))

    def value(name: str, **labels: str) -> float:
        return metrics.registry.get_sample_value(name, labels) or 0.0

    snap = {"backend": "noop", "kind": "snapshot", "outcome": "complete"}
    assert value("timeslice_agent_operations_total", **snap) == 1
    assert value("timeslice_agent_operation_duration_seconds_sum", **snap) == 2.5
    assert value("timeslice_agent_moved_bytes_total", **snap) == 100
    assert value("timeslice_agent_device_bytes_total", **snap) == 80
    failed = {"backend": "noop", "kind": "restore", "outcome": "failed"}
    assert value("timeslice_agent_operations_total", **failed) == 1
    assert value("timeslice_agent_jobs", state="SAVED") == 2
    assert value("timeslice_agent_jobs", state="FAULTED") == 1
    assert value("timeslice_agent_jobs", state="RUNNING") == 0
    assert value("timeslice_agent_workload_channels_open") == 4
