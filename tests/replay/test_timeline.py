"""The journal -> timeline interpretation, on hand-made event sequences folded
through the real lock table. Times are binary fractions, so sums are exact."""

from __future__ import annotations

from typing import Any

import pytest

from timeslice.orchestrator import events as ev
from timeslice.orchestrator.events import Event
from timeslice.orchestrator.state import LockTable
from timeslice.replay.from_journal import timeline_from_journal
from timeslice.replay.timeline import Span, Timeline, uncovered

T0 = 1_000_000.0  # wall clock of the first event: the timeline's time 0


def rows(*events: Event) -> list[tuple[int, float, Event]]:
    return [(seq, e.now, e) for seq, e in enumerate(events, 1)]


def fold(*events: Event, **kwargs: Any) -> Timeline:
    return timeline_from_journal(rows(*events), **kwargs)


def at(t: float) -> float:
    return T0 + t


def spans(tl: Timeline, kind: str, job: str | None = None) -> list[Span]:
    return [s for s in tl.spans_of(kind) if job is None or s.job == job]


def two_node_handover() -> list[Event]:
    """A takes g (spanning n1, n2) with nothing to move; B queues; A yields and the
    agents save A on both nodes and restore B."""
    return [
        ev.SetGroupNodes(now=at(0), group="g", nodes=("n1", "n2")),
        ev.Acquire(now=at(1), group="g", job="A", call_id="a1"),
        ev.SwitchDone(now=at(2), group="g", token=1, restored=False, began=at(1.25)),
        ev.Acquire(now=at(3), group="g", job="B", call_id="b1"),
        ev.Yield(now=at(10), group="g", job="A"),
        ev.SwitchDone(
            now=at(11),
            group="g",
            token=2,
            restored=True,
            moved_bytes=600,
            began=at(10.25),
            steps=(
                ("n1", "A", "snapshot", 0.25, 200),
                ("n2", "A", "snapshot", 0.5, 200),
                ("n1", "B", "restore", 0.125, 100),
                ("n2", "B", "restore", 0.0625, 100),
            ),
        ),
    ]


def test_a_switch_has_its_parts_from_the_journal() -> None:
    tl = fold(*two_node_handover())
    assert (tl.start, tl.end, tl.origin) == (0.0, 11.0, T0)
    assert tl.groups == ("g",) and tl.jobs == ("A", "B")
    assert len(tl.switches) == 2
    first, second = tl.switches
    # The first grant switches too (the group spans nodes), moving nothing.
    assert (first.job, first.saved, first.start, first.end) == ("A", (), 1.0, 2.0)
    assert (first.snapshot, first.restore, first.overhead, first.wait) == (0.0, 0.0, 1.0, 1.0)
    assert first.moved_bytes == 0 and not first.restored
    # The handover: decided at A's yield, done at the SwitchDone.
    assert (second.group, second.job, second.saved) == ("g", "B", ("A",))
    assert (second.start, second.end, second.duration) == (10.0, 11.0, 1.0)
    assert second.snapshot == 0.5  # the nodes work in parallel: the slowest node's
    assert second.restore == 0.125
    assert second.overhead == 1.0 - 0.5 - 0.125  # the switch minus the agents' work
    assert second.wait == 8.0  # B's Acquire at 3 to its grant at 11
    assert second.moved_bytes == 600 and second.restored and second.ok
    assert second.agents_began == 10.25 and second.token == 2
    assert second.moves == (("A", "snapshot", 0.5), ("B", "restore", 0.125))
    assert [s.node for s in second.steps] == ["n1", "n2", "n1", "n2"]


def test_agents_figures_rounded_past_the_switchs_end_are_drawn_within_it() -> None:
    """The agents report whole milliseconds of their own clocks: their parts can add
    up to more than the time between the switch's start on the agents and its end.
    The parts stay as reported; what is drawn of them ends with the switch, and no
    overhead is counted where the agents worked."""
    events = two_node_handover()
    events[-1] = ev.SwitchDone(
        now=at(11),
        group="g",
        token=2,
        restored=True,
        began=at(10.25),
        steps=(("n1", "A", "snapshot", 0.5, 200), ("n1", "B", "restore", 0.375, 100)),
    )
    tl = fold(*events)
    second = tl.switches[1]
    assert (second.snapshot, second.restore) == (0.5, 0.375)  # as the agents said
    assert second.overhead == 0.25  # before the agents began; none after
    assert [(s.start, s.end) for s in spans(tl, "snapshot", "A")] == [(10.25, 10.75)]
    assert [(s.start, s.end) for s in spans(tl, "restore", "B")] == [(10.75, 11.0)]


def test_holds_waits_and_moves_are_drawn_where_they_happened() -> None:
    tl = fold(*two_node_handover())
    assert spans(tl, "hold", "A") == [Span("g", "A", "hold", 2.0, 10.0, waited=1.0, switch=0)]
    assert spans(tl, "hold", "B") == [
        Span("g", "B", "hold", 11.0, 11.0, open=True, waited=8.0, switch=1)
    ]
    # A wait is what the table counted: from the Acquire to the grant.
    assert [(s.job, s.start, s.end) for s in spans(tl, "wait")] == [
        ("A", 1.0, 2.0),
        ("B", 3.0, 11.0),
    ]
    # The phases from the moment the agents were asked: snapshots, then the restore.
    assert [(s.job, s.start, s.end) for s in spans(tl, "snapshot")] == [("A", 10.25, 10.75)]
    assert [(s.job, s.start, s.end) for s in spans(tl, "restore")] == [("B", 10.75, 10.875)]
    assert tl.summary()["switches"] == 2
    assert tl.summary()["moved_bytes"] == 600
    assert tl.summary()["median_snapshot"] == 0.5  # of the switches that saved something


def test_a_group_without_nodes_hands_over_without_switching() -> None:
    tl = fold(
        ev.Acquire(now=at(0), group="g", job="A", call_id="a1"),
        ev.Acquire(now=at(1), group="g", job="B", call_id="b1"),
        ev.Yield(now=at(5), group="g", job="A"),
        ev.Yield(now=at(6), group="g", job="B"),
    )
    assert tl.switches == ()
    assert [(s.job, s.start, s.end, s.waited) for s in spans(tl, "hold")] == [
        ("A", 0.0, 5.0, 0.0),
        ("B", 5.0, 6.0, 4.0),
    ]
    assert [(s.job, s.start, s.end) for s in spans(tl, "wait")] == [("B", 1.0, 5.0)]


def test_a_failed_switch_counts_and_fails_its_waiter() -> None:
    tl = fold(
        ev.SetGroupNodes(now=at(0), group="g", nodes=("n1",)),
        ev.Acquire(now=at(0), group="g", job="A", call_id="a1"),
        ev.SwitchDone(now=at(1), group="g", token=1, restored=False, began=at(0)),
        ev.Acquire(now=at(2), group="g", job="B", call_id="b1"),
        ev.Yield(now=at(4), group="g", job="A"),
        ev.SwitchDone(
            now=at(6),
            group="g",
            token=2,
            restored=False,
            error="n1: restore failed",
            began=at(4.5),
            steps=(("n1", "A", "snapshot", 0.5, 64),),
            moved_bytes=64,
        ),
    )
    assert len(tl.switches) == 2
    failed = tl.switches[1]
    assert not failed.ok and failed.error == "n1: restore failed"
    assert failed.wait is None and failed.job == "B" and failed.saved == ("A",)
    assert failed.moved_bytes == 64 and failed.overhead == 2.0 - 0.5
    assert spans(tl, "hold", "B") == []  # it never held the group
    (wait,) = spans(tl, "wait", "B")  # its call failed with the switch
    assert (wait.start, wait.end, wait.open) == (2.0, 6.0, False)
    assert wait.note == "switch failed: n1: restore failed"
    assert any(m.kind == "revoked" and m.job == "B" for m in tl.marks)
    assert tl.summary()["failed"] == 1


def test_a_quarantined_target_fails_the_switch() -> None:
    tl = fold(
        ev.SetGroupNodes(now=at(0), group="g", nodes=("n1",)),
        ev.Acquire(now=at(0), group="g", job="A", call_id="a1"),
        ev.SwitchDone(
            now=at(1), group="g", token=1, restored=False, faults=(("A", "snapshot failed"),)
        ),
    )
    assert [s.error for s in tl.switches] == ["the switch failed"]
    assert [m.kind for m in tl.marks] == ["quarantined", "revoked"]


def test_a_switch_revoked_while_it_runs_is_abandoned_not_counted() -> None:
    tl = fold(
        ev.SetGroupNodes(now=at(0), group="g", nodes=("n1",)),
        ev.Acquire(now=at(0), group="g", job="A", call_id="a1"),
        ev.ForceRelease(now=at(1), group="g", reason="stuck"),
        # The agents' late answer: the table ignores it (the orchestrator does not
        # journal it, but a replay must not count it either way).
        ev.SwitchDone(now=at(2), group="g", token=1, restored=False),
    )
    assert tl.switches == ()
    assert [(m.kind, m.job) for m in tl.marks] == [("abandoned", "A")]
    assert "stuck" in tl.marks[0].text
    assert [(s.kind, s.start, s.end) for s in tl.spans] == [("wait", 0.0, 1.0)]


def test_a_switch_still_running_at_the_end_is_noted() -> None:
    tl = fold(
        ev.SetGroupNodes(now=at(0), group="g", nodes=("n1",)),
        ev.Acquire(now=at(1), group="g", job="A", call_id="a1"),
    )
    assert tl.switches == ()
    assert any("still running" in n for n in tl.notes)


def test_waits_that_end_without_a_grant() -> None:
    tl = fold(
        ev.Acquire(now=at(0), group="g", job="A", call_id="a1", lease_ttl=5.0),
        ev.Acquire(now=at(1), group="g", job="B", call_id="b1"),
        ev.DropWaiter(now=at(2), group="g", job="B", call_id="b1", reason=ev.Reason.CANCELLED),
        ev.Acquire(now=at(3), group="g", job="C", call_id="c1"),
        ev.Revoke(now=at(6), group="g", token=1, reason=ev.Reason.LEASE_EXPIRED),
    )
    assert [(s.job, s.start, s.end, s.note) for s in spans(tl, "wait")] == [
        ("B", 1.0, 2.0, "left the queue: cancelled"),
        ("C", 3.0, 6.0, ""),
    ]
    hold_a, hold_c = spans(tl, "hold")
    assert (hold_a.job, hold_a.end, hold_a.note) == ("A", 6.0, "revoked: lease expired")
    assert (hold_c.job, hold_c.start, hold_c.open) == ("C", 6.0, True)
    assert [(m.kind, m.job) for m in tl.marks] == [("revoked", "A")]


def test_a_holder_asking_again_does_not_start_a_new_hold() -> None:
    tl = fold(
        ev.Acquire(now=at(0), group="g", job="A", call_id="a1"),
        ev.Acquire(now=at(1), group="g", job="A", call_id="a2"),
        ev.Yield(now=at(2), group="g", job="A"),
    )
    assert [(s.start, s.end) for s in spans(tl, "hold")] == [(0.0, 2.0)]


def test_a_restart_is_marked_and_open_spans_end_with_the_record() -> None:
    tl = fold(
        ev.Acquire(now=at(0), group="g", job="A", call_id="a1"),
        ev.Acquire(now=at(1), group="g", job="B", call_id="b1"),
        ev.Recover(now=at(4), grace=30.0),
    )
    assert [(m.kind, m.time) for m in tl.marks] == [("restart", 4.0)]
    assert [(s.kind, s.job, s.end, s.open) for s in tl.spans] == [
        ("hold", "A", 4.0, True),
        ("wait", "B", 4.0, True),
    ]


def test_a_compacted_journal_starts_from_its_snapshot() -> None:
    events = two_node_handover()
    table = LockTable()
    for e in events[:3]:  # A holds g
        table.handle(e)
    tail = rows(*events)[3:]  # B's Acquire (now time 0), A's yield (7), the switch (8)
    tl = timeline_from_journal(tail, snapshot_seq=3, snapshot=table.to_dict())
    assert any("compacted" in n and "#4" in n and "snapshot at #3" in n for n in tl.notes)
    assert [(s.job, s.start, s.end, s.wait) for s in tl.switches] == [("B", 7.0, 8.0, 8.0)]
    # A held g when the snapshot was taken: it holds from the start of what is left.
    assert [(s.start, s.end) for s in spans(tl, "hold", "A")] == [(0.0, 7.0)]
    assert [(s.start, s.end) for s in spans(tl, "wait", "B")] == [(0.0, 8.0)]


def test_a_compacted_journal_skips_what_its_snapshot_holds() -> None:
    events = two_node_handover()
    table = LockTable()
    for e in events[:4]:
        table.handle(e)
    tail = rows(*events)[2:]  # events 3 and 4 are in the snapshot too
    tl = timeline_from_journal(tail, snapshot_seq=4, snapshot=table.to_dict())
    assert any("2 event(s) up to it are not shown" in n for n in tl.notes)
    assert [s.job for s in tl.switches] == ["B"]
    # B asked before the first event shown: the timeline begins with its wait.
    assert tl.start == -7.0 and spans(tl, "wait", "B")[0].start == -7.0


def test_a_compacted_journal_without_a_snapshot_says_what_it_skipped() -> None:
    tail = rows(*two_node_handover())[3:]
    tl = timeline_from_journal(tail)
    assert any("no snapshot covers them" in n for n in tl.notes)
    assert any("did not apply" in n and "Yield" in n for n in tl.notes)
    assert tl.switches == ()


def test_gaps_in_the_event_numbers_are_noted() -> None:
    r = rows(
        ev.Acquire(now=at(0), group="g", job="A", call_id="a1"),
        ev.Yield(now=at(1), group="g", job="A"),
    )
    r[1] = (5, r[1][1], r[1][2])
    assert any("1 gap" in n for n in timeline_from_journal(r).notes)


def test_an_empty_journal_is_an_empty_timeline() -> None:
    tl = timeline_from_journal([])
    assert (tl.switches, tl.spans, tl.origin, tl.notes) == ((), (), None, ())
    assert tl.to_dict()["summary"]["switches"] == 0


@pytest.mark.parametrize(
    ("start", "end", "covered", "left"),
    [
        (0.0, 10.0, [], 10.0),
        (0.0, 10.0, [(1.0, 3.0), (2.0, 4.0), (8.0, 12.0)], 5.0),
        (0.0, 10.0, [(-5.0, 20.0)], 0.0),
        (0.0, 10.0, [(3.0, 3.0), (11.0, 12.0)], 10.0),
        (5.0, 3.0, [], 0.0),
    ],
)
def test_uncovered(
    start: float, end: float, covered: list[tuple[float, float]], left: float
) -> None:
    assert uncovered(start, end, covered) == left
