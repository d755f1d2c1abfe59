"""The lock table remembers which loaded context belongs to a job that lost the group
without yielding (`Group.revoked_job`): the switch away from it bounds that job's
snapshot by the revoked-snapshot deadline, since its process may be frozen.

Every step goes through `Harness.handle`, which validates the table after it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.unit.test_state import Harness
from tests.unit.test_state_switch import NODES, done, group, holding
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.state import GroupState, LockTable


@pytest.fixture
def t() -> Iterator[Harness]:
    """A table whose group "g" spans two nodes."""
    harness = Harness()
    harness.handle(ev.SetGroupNodes(now=0, group="g", nodes=NODES))
    yield harness
    harness.table.validate()


def revoked(t: Harness) -> str:
    return group(t).revoked_job


def lease_expired(t: Harness, now: float) -> list[ev.Effect]:
    """a holds "g" with a lease of 1 s from 0 (switched in), b waits; nobody renews it."""
    [started] = t.acquire("a", now=0, lease_ttl=1.0)
    assert isinstance(started, ev.SwitchStarted)
    done(t, started.token, now=0)
    assert t.acquire("b", now=0.5) == [ev.Queued(group="g", job="b", call_id="call-b", position=0)]
    return t.run_due(now)


def test_a_holder_whose_lease_expires_is_the_revoked_job_of_the_switch_after_it(
    t: Harness,
) -> None:
    assert lease_expired(t, now=1.0) == [
        ev.Revoked(group="g", job="a", token=1, reason=ev.Reason.LEASE_EXPIRED),
        ev.SwitchStarted(group="g", job="b", token=2, previous="a"),
    ]
    assert revoked(t) == "a"
    # The switch reads it while it runs; once it is done a's context is saved (or
    # a is quarantined), and b's is the loaded one.
    done(t, 2, now=1.5, restored=True)
    assert (t.holder(), revoked(t)) == ("b", "")


def test_a_yielding_holder_is_not_revoked(t: Harness) -> None:
    holding(t, "a", now=0)
    t.acquire("b", now=1)
    assert t.yield_("a", now=2)[1] == ev.SwitchStarted(group="g", job="b", token=2, previous="a")
    assert revoked(t) == ""


@pytest.mark.parametrize(
    "end",
    [
        ev.Revoke(now=2, group="g", token=1, reason=ev.Reason.HOLD_LIMIT),
        ev.Revoke(now=2, group="g", token=1, reason=ev.Reason.HOLDER_GONE),
        ev.ForceRelease(now=2, group="g"),
    ],
    ids=["hold-limit", "holder-gone", "force-release"],
)
def test_every_end_of_a_grant_but_a_yield_marks_the_holder_revoked(
    t: Harness, end: ev.Event
) -> None:
    holding(t, "a", now=0)
    t.acquire("b", now=1)
    effects = t.handle(end)
    assert effects[-1] == ev.SwitchStarted(group="g", job="b", token=2, previous="a")
    assert revoked(t) == "a"


def test_a_revoked_holder_nobody_waited_for_stays_revoked_until_the_next_switch(
    t: Harness,
) -> None:
    holding(t, "a", now=0)
    assert t.handle(ev.Revoke(now=1, group="g", token=1, reason=ev.Reason.LEASE_EXPIRED)) == [
        ev.Revoked(group="g", job="a", token=1, reason=ev.Reason.LEASE_EXPIRED)
    ]
    # Its context stays live, and it may still be frozen when the next job comes.
    assert (t.state(), revoked(t)) == (GroupState.IDLE_YIELDED, "a")
    assert t.acquire("b", now=5) == [ev.SwitchStarted(group="g", job="b", token=2, previous="a")]
    assert revoked(t) == "a"
    done(t, 2, now=6)
    assert revoked(t) == ""


def test_a_revoked_holder_granted_again_is_alive_and_no_longer_revoked(t: Harness) -> None:
    holding(t, "a", now=0)
    t.handle(ev.ForceRelease(now=1, group="g"))
    [grant] = t.acquire("a", now=2, call_id="a-2")
    assert isinstance(grant, ev.Granted) and not grant.context_restored  # nothing moved
    assert revoked(t) == ""
    t.acquire("b", now=3)
    assert t.yield_("a", now=4)[1] == ev.SwitchStarted(group="g", job="b", token=3, previous="a")
    assert revoked(t) == ""  # it yielded this time


def test_a_failed_switch_keeps_the_revoked_job_for_the_next_one(t: Harness) -> None:
    lease_expired(t, now=1.0)
    t.acquire("c", now=1.2)
    # One node could not be reached: a's context may still be live there.
    effects = done(t, 2, now=2.0, error="n2: unreachable")
    assert effects[-1] == ev.SwitchStarted(group="g", job="c", token=3, previous="")
    assert revoked(t) == "a"
    done(t, 3, now=3.0)
    assert (t.holder(), revoked(t)) == ("c", "")


def test_a_switch_ended_before_it_was_done_does_not_mark_its_target_revoked(
    t: Harness,
) -> None:
    t.acquire("a", now=0)
    t.handle(ev.ForceRelease(now=1, group="g"))
    assert (group(t).loaded_job, revoked(t)) == ("", "")


def test_a_group_without_nodes_clears_it_at_the_next_grant() -> None:
    t = Harness()
    t.acquire("a", now=0)
    t.handle(ev.ForceRelease(now=1, group="g"))
    assert revoked(t) == "a"
    t.acquire("b", now=2)
    assert (t.holder(), revoked(t)) == ("b", "")


def test_the_revoked_job_survives_a_snapshot_of_the_table(t: Harness) -> None:
    lease_expired(t, now=1.0)
    data = json.loads(json.dumps(t.table.to_dict()))
    again = LockTable.from_dict(data)
    again.validate()
    assert again.groups["g"].revoked_job == "a"
    assert again.to_dict() == t.table.to_dict()
    # A snapshot written before the field existed reads as "nobody revoked".
    for g in data["groups"]:
        del g["revoked_job"]
    assert LockTable.from_dict(data).groups["g"].revoked_job == ""
