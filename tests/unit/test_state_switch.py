"""The lock table on groups that span nodes: SWITCHING, quarantine and the node config.

A grant on such a group to a job whose context is not the loaded one starts a
switch (`SwitchStarted`, no `Granted`); `SwitchDone` completes or fails it.
Every step goes through `Harness.handle`, which validates the table after it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.unit.test_state import Harness, granted, no_lease
from timeslice.errors import (
    ConflictError,
    DeadlineExceededError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    NotHolderError,
    TimeSliceError,
)
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.state import Group, GroupState, LockTable, check_node

NODES = ("n1", "n2")


@pytest.fixture
def t() -> Iterator[Harness]:
    """A table whose group "g" spans two nodes."""
    harness = Harness()
    assert harness.handle(ev.SetGroupNodes(now=0, group="g", nodes=NODES)) == []
    yield harness
    harness.table.validate()


def group(t: Harness, name: str = "g") -> Group:
    return t.table.groups[name]


def contexts(t: Harness, name: str = "g") -> tuple[str, str]:
    """(active job, loaded job)."""
    g = group(t, name)
    return g.active_job, g.loaded_job


def lease(token: int, ttl: float, expires_at: float) -> ev.LeaseInfo:
    return ev.LeaseInfo(lease_id=f"lease-{token}", ttl=ttl, expires_at=expires_at)


def done(t: Harness, token: int, now: float, restored: bool = False, **kw: Any) -> list[ev.Effect]:
    return t.handle(ev.SwitchDone(now=now, group="g", token=token, restored=restored, **kw))


def holding(t: Harness, job: str = "a", now: float = 0.0) -> ev.Granted:
    """`job` takes the free group "g" through a switch, both at `now`."""
    [started] = t.acquire(job, now=now)
    assert isinstance(started, ev.SwitchStarted)
    [grant] = done(t, started.token, now)
    assert isinstance(grant, ev.Granted)
    return grant


def switching_to_b(t: Harness) -> None:
    """a holds "g" (switched in at 0), b (queued at 1) and c (at 2) wait, and a yields
    at 3: the switch to b (token 2) runs."""
    holding(t, "a", now=0)
    assert t.acquire("b", now=1) == [ev.Queued(group="g", job="b", call_id="call-b", position=0)]
    assert t.acquire("c", now=2) == [ev.Queued(group="g", job="c", call_id="call-c", position=1)]
    assert t.yield_("a", now=3) == [
        ev.Yielded(
            group="g", job="a", token=1, pending_waiters=2, snapshot_deferred=False, next_job="b"
        ),
        ev.SwitchStarted(group="g", job="b", token=2, previous="a"),
    ]
    assert t.state() is GroupState.SWITCHING


# --- a switch, then its end -----------------------------------------------------------


def test_a_grant_on_a_group_with_nodes_switches_first_and_is_granted_at_switch_done(
    t: Harness,
) -> None:
    assert t.acquire("a", now=0.0, lease_ttl=10.0) == [
        ev.SwitchStarted(group="g", job="a", token=1, previous="")
    ]
    g = group(t)
    assert t.state() is GroupState.SWITCHING
    assert g.holder is not None and (g.holder.job, g.holder.switching) == ("a", True)
    assert (g.holder.call_id, g.token, g.state_since) == ("call-a", 1, 0.0)
    assert contexts(t) == ("a", "")

    assert done(t, 1, now=2.0) == [
        ev.Granted(
            group="g",
            job="a",
            call_id="call-a",
            token=1,
            lease=lease(1, 10.0, 12.0),
            waited=2.0,
            context_restored=False,
        )
    ]
    assert t.state() is GroupState.LOCKED
    assert (g.holder.switching, g.holder.granted_at, g.state_since) == (False, 2.0, 2.0)
    assert contexts(t) == ("a", "a")
    assert t.table.next_deadline() == 12.0


def test_a_switch_from_another_context_says_which_was_live_and_what_was_restored(
    t: Harness,
) -> None:
    switching_to_b(t)
    assert contexts(t) == ("b", "a")
    effects = done(t, 2, now=7.0, restored=True, moved_bytes=3 << 30)
    assert effects == [
        ev.Granted(
            group="g",
            job="b",
            call_id="call-b",
            token=2,
            lease=no_lease(2),
            waited=6.0,
            context_restored=True,
            switch_bytes=3 << 30,
        )
    ]
    assert contexts(t) == ("b", "b")
    assert (t.holder(), t.queue()) == ("b", ["c"])


@pytest.mark.parametrize("restored", [False, True])
def test_switch_done_passes_restored_on_to_the_grant(t: Harness, restored: bool) -> None:
    t.acquire("a", now=0.0)
    [grant] = done(t, 1, now=1.0, restored=restored, moved_bytes=7)
    assert isinstance(grant, ev.Granted)
    assert (grant.context_restored, grant.switch_bytes, grant.must_deliver) == (restored, 7, True)


def test_the_wait_is_measured_from_queueing_to_switch_done(t: Harness) -> None:
    holding(t, "a", now=0)
    t.acquire("b", now=1.0)
    t.acquire("b", now=4.0, call_id="b-2")  # re-attaching keeps the place and the time
    [_, started] = t.yield_("a", now=10.0)
    assert started == ev.SwitchStarted(group="g", job="b", token=2, previous="a")
    [grant] = done(t, 2, now=16.0)
    assert isinstance(grant, ev.Granted)
    assert (grant.call_id, grant.waited) == ("b-2", 15.0)
    assert group(t).holder.queued_at == 1.0  # type: ignore[union-attr]


def test_the_lease_starts_at_switch_done(t: Harness) -> None:
    t.acquire("a", now=0.0, lease_ttl=5.0)
    assert t.table.next_deadline() is None
    assert t.table.due(1000.0) is None
    [grant] = done(t, 1, now=100.0)
    assert isinstance(grant, ev.Granted) and grant.lease == lease(1, 5.0, 105.0)
    assert t.table.next_deadline() == 105.0
    assert t.table.due(104.9) is None
    assert t.run_due(105.0) == [
        ev.Revoked(group="g", job="a", token=1, reason=ev.Reason.LEASE_EXPIRED)
    ]
    assert t.state() is GroupState.IDLE_YIELDED
    assert contexts(t) == ("a", "a")


def test_the_hold_limit_counts_from_switch_done(t: Harness) -> None:
    t.handle(ev.SetHoldLimit(now=0, group="", max_hold=30.0, grace=5.0))
    t.acquire("a", now=0.0)
    t.acquire("b", now=1.0)
    assert t.table.next_deadline() is None
    assert t.table.due(1000.0) is None
    t.handle(
        ev.SetHoldLimit(now=50.0, group="g", max_hold=20.0, grace=5.0)
    )  # re-arming finds nothing either
    assert t.table.next_deadline() is None
    done(t, 1, now=100.0)
    assert t.table.next_deadline() == 120.0
    assert t.run_due(120.0) == [ev.YieldRequested(group="g", job="a", token=1, revoke_at=125.0)]
    assert t.run_due(125.0) == [
        ev.Revoked(group="g", job="a", token=1, reason=ev.Reason.HOLD_LIMIT),
        ev.SwitchStarted(group="g", job="b", token=2, previous="a"),
    ]
    assert t.table.next_deadline() is None


def test_a_waiters_wait_deadline_still_runs_during_a_switch(t: Harness) -> None:
    t.acquire("a", now=0.0)
    t.acquire("b", now=1.0, wait_deadline=5.0)
    assert t.table.next_deadline() == 5.0
    assert t.run_due(5.0) == [
        ev.LeftQueue(group="g", job="b", call_id="call-b", reason=ev.Reason.WAIT_TIMEOUT)
    ]
    assert t.state() is GroupState.SWITCHING


def test_a_failed_switch_fails_the_waiting_call_and_switches_the_next_waiter_in(
    t: Harness,
) -> None:
    switching_to_b(t)
    effects = done(t, 2, now=5.0, restored=True, error="agent n2: unreachable")
    assert effects == [
        ev.Revoked(
            group="g",
            job="b",
            token=2,
            reason=ev.Reason.SWITCH_FAILED,
            detail="agent n2: unreachable",
            call_id="call-b",
        ),
        ev.SwitchStarted(
            group="g", job="c", token=3, previous=""
        ),  # where the contexts are is not known
    ]
    g = group(t)
    assert g.holder is not None and (g.holder.job, g.holder.token, g.holder.switching) == (
        "c",
        3,
        True,
    )
    assert contexts(t) == ("c", "")
    assert g.quarantined == {}
    t.ignore(
        ev.SwitchDone(now=6.0, group="g", token=2, restored=True)
    )  # the failed switch's token is stale
    assert done(t, 3, now=7.0, restored=True) == [
        ev.Granted(
            group="g",
            job="c",
            call_id="call-c",
            token=3,
            lease=no_lease(3),
            waited=5.0,
            context_restored=True,
        )
    ]
    assert contexts(t) == ("c", "c")


def test_a_failed_switch_with_nobody_waiting_leaves_no_context_loaded(t: Harness) -> None:
    t.acquire("a", now=0.0)
    assert done(t, 1, now=1.0, error="timeout") == [
        ev.Revoked(
            group="g",
            job="a",
            token=1,
            reason=ev.Reason.SWITCH_FAILED,
            detail="timeout",
            call_id="call-a",
        )
    ]
    g = group(t)
    assert (g.holder, g.loaded_job, g.active_job, g.queue) == (None, "", "", {})
    assert g.state is GroupState.IDLE  # no context is known live: not IDLE_YIELDED
    # the same job again: its context is not known to be live, so it switches again
    assert t.acquire("a", now=2.0, call_id="a-2") == [
        ev.SwitchStarted(group="g", job="a", token=2, previous="")
    ]


def test_a_faulted_target_is_quarantined_and_its_grant_revoked(t: Harness) -> None:
    switching_to_b(t)
    t.acquire("d", now=3.5)
    faults = (("b", "xid 79"), ("c", "ecc error"))
    assert done(t, 2, now=5.0, restored=True, faults=faults) == [
        ev.Quarantined(group="g", job="b", reason="xid 79"),
        ev.Quarantined(group="g", job="c", reason="ecc error"),
        ev.LeftQueue(
            group="g", job="c", call_id="call-c", reason=ev.Reason.QUARANTINED, detail="ecc error"
        ),
        ev.Revoked(
            group="g",
            job="b",
            token=2,
            reason=ev.Reason.SWITCH_FAILED,
            detail="xid 79",
            call_id="call-b",
        ),
        ev.SwitchStarted(group="g", job="d", token=3, previous=""),
    ]
    g = group(t)
    assert g.quarantined == {"b": "xid 79", "c": "ecc error"}
    assert (t.holder(), t.queue(), contexts(t)) == ("d", [], ("d", ""))


def test_an_error_is_the_reason_even_when_the_target_faulted_too(t: Harness) -> None:
    t.acquire("a", now=0.0)
    assert done(t, 1, now=1.0, faults=(("a", "xid 43"),), error="restore failed") == [
        ev.Quarantined(group="g", job="a", reason="xid 43"),
        ev.Revoked(
            group="g",
            job="a",
            token=1,
            reason=ev.Reason.SWITCH_FAILED,
            detail="restore failed",
            call_id="call-a",
        ),
    ]


def test_another_faulted_job_is_quarantined_and_the_grant_goes_ahead(t: Harness) -> None:
    switching_to_b(t)
    faults = (("c", "ecc error"), ("a", "save failed"), ("c", "again"), ("zz", "stray"))
    assert done(t, 2, now=5.0, restored=True, faults=faults) == [
        ev.Quarantined(group="g", job="c", reason="ecc error"),
        ev.LeftQueue(
            group="g", job="c", call_id="call-c", reason=ev.Reason.QUARANTINED, detail="ecc error"
        ),
        ev.Quarantined(group="g", job="a", reason="save failed"),
        ev.Quarantined(group="g", job="zz", reason="stray"),
        ev.Granted(
            group="g",
            job="b",
            call_id="call-b",
            token=2,
            lease=no_lease(2),
            waited=4.0,
            context_restored=True,
        ),
    ]
    g = group(t)
    assert g.quarantined == {"c": "ecc error", "a": "save failed", "zz": "stray"}
    assert (t.holder(), t.queue(), contexts(t)) == ("b", [], ("b", "b"))
    # quarantined already: a second fault changes nothing and says nothing
    t.acquire("d", now=6.0)
    [_, started] = t.yield_("b", now=7.0)
    assert started == ev.SwitchStarted(group="g", job="d", token=3, previous="b")
    assert done(t, 3, now=8.0, faults=(("c", "later"),)) == [
        ev.Granted(
            group="g",
            job="d",
            call_id="call-d",
            token=3,
            lease=no_lease(3),
            waited=2.0,
            context_restored=False,
        )
    ]
    assert g.quarantined["c"] == "ecc error"


def test_a_detached_quarantined_waiter_leaves_with_an_empty_call(t: Harness) -> None:
    switching_to_b(t)
    t.handle(ev.Recover(now=4.0, grace=30.0))
    assert done(t, 2, now=5.0, faults=(("c", "xid 31"),))[:2] == [
        ev.Quarantined(group="g", job="c", reason="xid 31"),
        ev.LeftQueue(group="g", job="c", call_id="", reason=ev.Reason.QUARANTINED, detail="xid 31"),
    ]


def test_a_quarantined_job_may_not_acquire_until_it_is_reset(t: Harness) -> None:
    switching_to_b(t)
    done(t, 2, now=5.0, faults=(("c", "xid 79"),))
    err = t.refuse(ev.Acquire(now=6.0, group="g", job="c", call_id="c-2"), ConflictError)
    assert type(err) is ConflictError
    assert "quarantined" in str(err) and "xid 79" in str(err)
    # only on that group
    assert granted(t.acquire("c", group="other", now=6.0, call_id="c-other"))[0].job == "c"

    assert t.handle(ev.ResetJob(now=7.0, group="g", job="c")) == [ev.JobReset(group="g", job="c")]
    assert group(t).quarantined == {}
    t.ignore(ev.ResetJob(now=8.0, group="g", job="c"))  # not quarantined: nothing to do
    t.ignore(ev.ResetJob(now=8.0, group="g", job="never-seen"))
    assert t.acquire("c", now=9.0, call_id="c-3") == [
        ev.Queued(group="g", job="c", call_id="c-3", position=0)
    ]


def test_a_quarantine_holds_on_its_own_group_only(t: Harness) -> None:
    t.handle(ev.SetGroupNodes(now=0, group="h", nodes=("n3",)))
    holding(t, "a")
    t.acquire("b", group="h", now=0.0)
    t.handle(ev.SwitchDone(now=1.0, group="h", token=1, restored=False, faults=(("a", "xid 48"),)))
    assert group(t, "h").quarantined == {"a": "xid 48"}
    assert group(t).quarantined == {}
    assert t.holder() == "a"


@pytest.mark.parametrize(
    ("event", "error"),
    [
        (ev.ResetJob(now=0, group="nope", job="a"), NotFoundError),
        (ev.ResetJob(now=0, group="", job="a"), InvalidArgumentError),
        (ev.ResetJob(now=0, group="g", job=""), InvalidArgumentError),
        (ev.ResetJob(now=0, group="g", job="a\n"), InvalidArgumentError),
    ],
)
def test_reset_job_refusals(t: Harness, event: ev.ResetJob, error: type[TimeSliceError]) -> None:
    t.acquire("a")
    t.refuse(event, error)


@pytest.mark.parametrize(
    "event",
    [
        ev.SwitchDone(now=5, group="g", token=1, restored=True),  # a token long gone
        ev.SwitchDone(now=5, group="g", token=3, restored=True),  # a token not issued yet
        ev.SwitchDone(
            now=5, group="g", token=1, restored=True, faults=(("c", "xid 79"),)
        ),  # stale: no quarantine
        ev.SwitchDone(now=5, group="g", token=1, restored=False, error="boom"),
        ev.SwitchDone(now=5, group="nope", token=2, restored=True),
        ev.Revoke(now=5, group="g", token=2, reason=ev.Reason.NOT_DELIVERED, call_id="old-call"),
    ],
)
def test_a_stale_switch_done_is_a_no_op(t: Harness, event: ev.Event) -> None:
    switching_to_b(t)
    t.ignore(event)
    assert t.state() is GroupState.SWITCHING


def test_switch_done_for_a_grant_already_switched_is_a_no_op(t: Harness) -> None:
    holding(t, "a")
    t.ignore(ev.SwitchDone(now=1, group="g", token=1, restored=True))
    t.ignore(
        ev.SwitchDone(
            now=1, group="g", token=1, restored=False, faults=(("a", "xid"),), error="late"
        )
    )
    t.yield_("a", now=2)
    t.ignore(ev.SwitchDone(now=3, group="g", token=1, restored=True))  # nobody holds the group
    assert (t.state(), contexts(t)) == (GroupState.IDLE_YIELDED, ("a", "a"))


# --- while a switch runs --------------------------------------------------------------


def test_a_reentrant_acquire_during_a_switch_takes_the_call_over_but_waits(
    t: Harness,
) -> None:
    switching_to_b(t)
    assert t.acquire("b", now=4.0) == []  # the same call: nothing to supersede or grant
    assert t.acquire("b", now=4.5, call_id="b-2", lease_ttl=10.0, request_id="rb") == [
        ev.Superseded(group="g", job="b", call_id="call-b")
    ]
    h = group(t).holder
    assert h is not None and (h.call_id, h.lease_ttl, h.switching) == ("b-2", 10.0, True)
    assert t.table.next_deadline() is None
    # a retry of that request is still the same grant
    assert t.acquire("b", now=4.6, call_id="b-2", lease_ttl=10.0, request_id="rb") == []
    assert done(t, 2, now=6.0, restored=True) == [
        ev.Granted(
            group="g",
            job="b",
            call_id="b-2",
            token=2,
            lease=lease(2, 10.0, 16.0),
            waited=5.0,
            context_restored=True,
        )
    ]


def test_the_switch_target_cannot_yield_or_keep_alive(t: Harness) -> None:
    switching_to_b(t)
    t.refuse(ev.Yield(now=4, group="g", job="b"), NotHolderError)
    t.refuse(ev.Yield(now=4, group="g", job="b", token=2), NotHolderError)
    t.refuse(ev.Yield(now=4, group="g", job="b", token=1), LeaseLostError)
    t.refuse(ev.Yield(now=4, group="g", job="a"), NotHolderError)  # the previous holder
    t.refuse(ev.Yield(now=4, group="g", job="a", token=1), LeaseLostError)
    t.refuse(ev.KeepAlive(now=4, group="g", job="b", lease_id="lease-2"), LeaseLostError)
    t.refuse(ev.KeepAlive(now=4, group="g", job="a", lease_id="lease-1"), LeaseLostError)


def test_another_job_queues_behind_a_switch(t: Harness) -> None:
    switching_to_b(t)
    assert t.acquire("d", now=4.0) == [ev.Queued(group="g", job="d", call_id="call-d", position=1)]
    assert t.acquire("a", now=4.0, call_id="a-2") == [
        ev.Queued(group="g", job="a", call_id="a-2", position=2)
    ]
    t.refuse(
        ev.Acquire(now=4.0, group="g", job="e", call_id="call-e", wait_deadline=4.0),
        DeadlineExceededError,
    )


def test_force_release_ends_a_switch_and_the_next_grant_switches_again(t: Harness) -> None:
    holding(t, "a", now=0)
    t.yield_("a", now=1)
    assert t.acquire("b", now=2) == [ev.SwitchStarted(group="g", job="b", token=2, previous="a")]
    assert t.handle(ev.ForceRelease(now=3, group="g", job="b", reason="stuck")) == [
        ev.Revoked(
            group="g", job="b", token=2, reason=ev.Reason.OPERATOR, detail="stuck", call_id="call-b"
        )
    ]
    g = group(t)
    assert (g.holder, g.loaded_job) == (None, "")
    # a was loaded before the switch began, but the agents may be half way
    assert t.acquire("a", now=4, call_id="a-2") == [
        ev.SwitchStarted(group="g", job="a", token=3, previous="")
    ]
    t.ignore(ev.SwitchDone(now=5, group="g", token=2, restored=True))
    assert done(t, 3, now=5) == [
        ev.Granted(
            group="g",
            job="a",
            call_id="a-2",
            token=3,
            lease=no_lease(3),
            waited=1.0,
            context_restored=False,
        )
    ]


def test_force_release_during_a_switch_grants_the_next_waiter(t: Harness) -> None:
    switching_to_b(t)
    assert t.handle(ev.ForceRelease(now=4, group="g")) == [
        ev.Revoked(group="g", job="b", token=2, reason=ev.Reason.OPERATOR, call_id="call-b"),
        ev.SwitchStarted(group="g", job="c", token=3, previous=""),
    ]
    # the same job as the one released: it switches too
    assert t.acquire("b", now=5, call_id="b-2") == [
        ev.Queued(group="g", job="b", call_id="b-2", position=0)
    ]
    t.handle(ev.ForceRelease(now=6, group="g", job="c"))
    assert (t.holder(), contexts(t)) == ("b", ("b", ""))
    assert t.state() is GroupState.SWITCHING


def test_a_revoke_ends_a_switch_like_force_release(t: Harness) -> None:
    t.acquire("a", now=0)
    assert t.handle(ev.Revoke(now=1, group="g", token=1, reason="gone", call_id="call-a")) == [
        ev.Revoked(group="g", job="a", token=1, reason="gone", call_id="call-a")
    ]
    assert (group(t).holder, group(t).loaded_job) == (None, "")
    assert t.acquire("a", now=2, call_id="a-2") == [
        ev.SwitchStarted(group="g", job="a", token=2, previous="")
    ]


# --- a restart in the middle of a switch ----------------------------------------------


def test_recover_mid_switch_detaches_the_target_and_unclaimed_it_is_revoked(
    t: Harness,
) -> None:
    holding(t, "a", now=0)
    t.acquire("b", now=0.5)
    t.yield_("a", now=1)
    assert t.handle(ev.Recover(now=10.0, grace=5.0)) == []
    h = group(t).holder
    assert h is not None and (h.call_id, h.switching, h.claim_deadline) == ("", True, 15.0)
    assert t.table.next_deadline() is None  # no deadline while the switch runs
    assert t.table.due(100.0) is None
    assert done(t, 2, now=20.0, restored=True) == [
        ev.Granted(
            group="g",
            job="b",
            call_id="",
            token=2,
            lease=no_lease(2),
            waited=19.5,
            context_restored=True,
        )
    ]
    assert h.claim_deadline == 25.0
    assert t.table.next_deadline() == 25.0
    assert t.table.due(24.9) is None
    assert t.run_due(25.0) == [
        ev.Revoked(group="g", job="b", token=2, reason=ev.Reason.NOT_DELIVERED)
    ]
    # the agents switched b in: its context stays live
    assert (t.state(), contexts(t)) == (GroupState.IDLE_YIELDED, ("b", "b"))
    assert t.acquire("b", now=26, call_id="1.b") == [
        ev.Granted(
            group="g",
            job="b",
            call_id="1.b",
            token=3,
            lease=no_lease(3),
            waited=0.0,
            context_restored=False,
        )
    ]


def test_a_switched_grant_claimed_after_a_restart_reports_the_switch_it_made(
    t: Harness,
) -> None:
    holding(t, "a", now=0)
    t.acquire("b", now=0.5)
    t.yield_("a", now=1)
    t.handle(ev.Recover(now=10.0, grace=5.0))
    done(t, 2, now=20.0, restored=True, moved_bytes=64)
    # the claim is the first answer b gets: as the grant was made, and it must arrive
    assert t.acquire("b", now=21, call_id="1.b") == [
        ev.Granted(
            group="g",
            job="b",
            call_id="1.b",
            token=2,
            lease=no_lease(2),
            waited=19.5,
            context_restored=True,
            must_deliver=True,
        )
    ]
    assert t.table.next_deadline() is None
    # asking again: nothing was moved for this call, and losing the answer costs nothing
    assert t.acquire("b", now=22, call_id="1.b2") == [
        ev.Superseded(group="g", job="b", call_id="1.b"),
        ev.Granted(
            group="g",
            job="b",
            call_id="1.b2",
            token=2,
            lease=no_lease(2),
            waited=0.0,
            context_restored=False,
            must_deliver=False,
        ),
    ]


def test_a_target_coming_back_during_the_switch_claims_its_grant(t: Harness) -> None:
    holding(t, "a", now=0)
    t.acquire("b", now=0.5, lease_ttl=30.0)
    t.yield_("a", now=1)
    t.handle(ev.Recover(now=10.0, grace=5.0))
    assert t.acquire("b", now=11, call_id="1.b", lease_ttl=30.0) == []  # nothing to supersede
    assert done(t, 2, now=20.0) == [
        ev.Granted(
            group="g",
            job="b",
            call_id="1.b",
            token=2,
            lease=lease(2, 30.0, 50.0),
            waited=19.5,
            context_restored=False,
        )
    ]
    assert group(t).holder.claim_deadline is None  # type: ignore[union-attr]
    assert t.table.next_deadline() == 50.0


def test_the_claim_grace_after_switch_done_is_the_last_recovers(t: Harness) -> None:
    t.acquire("a", now=0)
    t.handle(ev.Recover(now=10.0, grace=5.0))
    t.handle(ev.Recover(now=12.0, grace=7.0))
    assert t.table.claim_grace == 7.0
    assert group(t).holder.claim_deadline == 19.0  # type: ignore[union-attr]
    done(t, 1, now=30.0)
    assert t.table.next_deadline() == 37.0


def test_a_detached_waiter_granted_into_a_switch_gets_its_claim_grace_after_it(
    t: Harness,
) -> None:
    holding(t, "a", now=0)
    t.acquire("b", now=1)
    t.handle(ev.Recover(now=10.0, grace=5.0))
    assert t.yield_("a", now=12)[1] == ev.SwitchStarted(group="g", job="b", token=2, previous="a")
    assert t.table.next_deadline() is None  # b's reclaim deadline waits for the switch
    assert done(t, 2, now=40.0) == [
        ev.Granted(
            group="g",
            job="b",
            call_id="",
            token=2,
            lease=no_lease(2),
            waited=39.0,
            context_restored=False,
        )
    ]
    assert t.table.next_deadline() == 45.0
    assert t.run_due(45.0) == [
        ev.Revoked(group="g", job="b", token=2, reason=ev.Reason.NOT_DELIVERED)
    ]


def test_a_failed_switch_of_a_detached_target_has_no_call_to_fail(t: Harness) -> None:
    t.acquire("a", now=0)
    t.handle(ev.Recover(now=1.0, grace=5.0))
    assert done(t, 1, now=2.0, error="agent gone") == [
        ev.Revoked(
            group="g",
            job="a",
            token=1,
            reason=ev.Reason.SWITCH_FAILED,
            detail="agent gone",
            call_id="",
        )
    ]


# --- which context is live ------------------------------------------------------------


def test_an_undelivered_grant_on_a_group_with_nodes_keeps_its_context_live(
    t: Harness,
) -> None:
    switching_to_b(t)
    done(t, 2, now=4)
    assert t.handle(
        ev.Revoke(now=5, group="g", token=2, reason=ev.Reason.NOT_DELIVERED, call_id="call-b")
    ) == [
        ev.Revoked(group="g", job="b", token=2, reason=ev.Reason.NOT_DELIVERED),
        ev.SwitchStarted(group="g", job="c", token=3, previous="b"),
    ]
    assert contexts(t) == ("c", "b")
    t.handle(ev.ForceRelease(now=6, group="g"))
    t.acquire("b", now=7, call_id="b-2")
    assert t.state() is GroupState.SWITCHING  # the force release left nothing loaded


def test_an_undelivered_grant_with_nobody_waiting_leaves_that_job_loaded(
    t: Harness,
) -> None:
    holding(t, "a", now=0)
    t.acquire("b", now=1)
    t.yield_("a", now=2)
    done(t, 2, now=3)
    assert t.handle(
        ev.Revoke(now=4, group="g", token=2, reason=ev.Reason.NOT_DELIVERED, call_id="call-b")
    ) == [ev.Revoked(group="g", job="b", token=2, reason=ev.Reason.NOT_DELIVERED)]
    assert (t.state(), contexts(t)) == (GroupState.IDLE_YIELDED, ("b", "b"))
    # b's next grant costs nothing; a's switches from b
    assert t.acquire("b", now=5, call_id="b-2") == [
        ev.Granted(
            group="g",
            job="b",
            call_id="b-2",
            token=3,
            lease=no_lease(3),
            waited=0.0,
            context_restored=False,
        )
    ]
    t.yield_("b", now=6)
    assert t.acquire("a", now=7, call_id="a-2") == [
        ev.SwitchStarted(group="g", job="a", token=4, previous="b")
    ]


def test_an_undelivered_grant_without_nodes_still_rolls_back() -> None:
    t = Harness()
    t.acquire("a", now=0)
    t.acquire("b", now=1)
    t.yield_("a", now=2)
    t.handle(ev.Revoke(now=3, group="g", token=2, reason=ev.Reason.NOT_DELIVERED, call_id="call-b"))
    assert contexts(t) == ("a", "a")


def test_the_loaded_job_is_granted_at_once_without_a_switch(t: Harness) -> None:
    holding(t, "a", now=0)
    assert t.yield_("a", now=1) == [
        ev.Yielded(
            group="g", job="a", token=1, pending_waiters=0, snapshot_deferred=True, next_job=""
        )
    ]
    assert (t.state(), contexts(t)) == (GroupState.IDLE_YIELDED, ("a", "a"))
    assert t.acquire("a", now=2, call_id="a-2", lease_ttl=10.0) == [
        ev.Granted(
            group="g",
            job="a",
            call_id="a-2",
            token=2,
            lease=lease(2, 10.0, 12.0),
            waited=0.0,
            context_restored=False,
        )
    ]
    assert (t.state(), t.table.next_deadline()) == (GroupState.LOCKED, 12.0)


def test_nodes_set_later_trust_the_context_already_loaded() -> None:
    t = Harness()
    t.acquire("a", now=0)
    t.yield_("a", now=1)
    t.handle(ev.SetGroupNodes(now=2, group="g", nodes=NODES))
    assert t.acquire("a", now=3, call_id="a-2") == [
        ev.Granted(
            group="g",
            job="a",
            call_id="a-2",
            token=2,
            lease=no_lease(2),
            waited=0.0,
            context_restored=False,
        )
    ]
    t.yield_("a", now=4)
    assert t.acquire("b", now=5) == [ev.SwitchStarted(group="g", job="b", token=3, previous="a")]


def test_a_group_whose_nodes_are_removed_grants_without_switching(t: Harness) -> None:
    holding(t, "a")
    t.yield_("a", now=1)
    assert t.handle(ev.SetGroupNodes(now=2, group="g", nodes=())) == []
    assert "g" not in t.table.nodes
    assert t.acquire("b", now=3) == [
        ev.Granted(
            group="g",
            job="b",
            call_id="call-b",
            token=2,
            lease=no_lease(2),
            waited=0.0,
            context_restored=False,
        )
    ]


def test_a_holder_without_a_lease_keeps_a_group_with_nodes_through_silence(
    t: Harness,
) -> None:
    [grant] = t.acquire("a", now=0.0)  # a v1alpha1 client: no lease TTL
    assert grant == ev.SwitchStarted(group="g", job="a", token=1, previous="")
    [grant] = done(t, 1, now=1.0, restored=True)
    assert isinstance(grant, ev.Granted) and grant.lease == no_lease(1)
    t.acquire("b", now=2.0, lease_ttl=5.0)
    assert t.table.next_deadline() is None
    assert t.table.due(1.0 + 600) is None
    assert t.table.due(1e9) is None
    # its zero-cost re-grant and a restart change nothing either
    t.yield_("a", now=3.0)
    done(t, 2, now=4.0)
    t.yield_("b", now=5.0)
    [again] = t.acquire("b", now=6.0, call_id="b-2")
    assert isinstance(again, ev.Granted) and again.lease == no_lease(3)
    t.handle(ev.Recover(now=7.0, grace=5.0))
    assert t.table.next_deadline() is None
    assert t.table.due(7.0 + 600) is None
    assert t.holder() == "b"


# --- nodes, agents and backends -------------------------------------------------------


def test_set_group_nodes_names_the_nodes_and_empty_removes_them(t: Harness) -> None:
    assert t.table.nodes == {"g": NODES}
    nodes = ("n1", "gpu-03.rack", "10.0.0.5:7070", "[::1]:7070", "agent_2", "host.example:443")
    assert t.handle(ev.SetGroupNodes(now=1, group="h", nodes=nodes)) == []
    assert t.table.nodes == {"g": NODES, "h": nodes}
    assert "h" not in t.table.groups  # naming nodes does not create the group
    assert t.handle(ev.SetGroupNodes(now=2, group="g", nodes=("n3",))) == []
    assert t.table.nodes["g"] == ("n3",)
    assert t.handle(ev.SetGroupNodes(now=3, group="g", nodes=())) == []
    assert t.table.nodes == {"h": nodes}
    assert t.handle(ev.SetGroupNodes(now=4, group="never-named", nodes=())) == []
    assert t.table.to_dict()["nodes"] == {"h": list(nodes)}


BAD_NODES = {
    "empty": "",
    "space": "node 1",
    "leading dash": "-n1",
    "leading dot": ".n1",
    "slash": "n1/x",
    "bad port": "n1:99999",
    "no port": "n1:",
    "no host": ":7070",
    "at": "user@n1:22",
    "bare ipv6": "::1:7070",
    "newline": "n1\n",
    "too long": "n" * 300,
    "leading space": " n1:7070",
    "trailing space": "n1:7070 ",
}


@pytest.mark.parametrize("bad", BAD_NODES.values(), ids=BAD_NODES.keys())
def test_set_group_nodes_refuses_bad_node_names(t: Harness, bad: str) -> None:
    t.refuse(ev.SetGroupNodes(now=1, group="g", nodes=("n1", bad)), InvalidArgumentError)
    t.refuse(ev.RegisterAgent(now=1, node=bad, address="10.0.0.1:7070"), InvalidArgumentError)
    with pytest.raises(InvalidArgumentError):
        check_node(bad)
    assert t.table.nodes == {"g": NODES}


def test_set_group_nodes_refuses_a_node_named_twice_and_a_bad_group(t: Harness) -> None:
    err = t.refuse(
        ev.SetGroupNodes(now=1, group="g", nodes=("n1", "n2", "n1")), InvalidArgumentError
    )
    assert "twice" in str(err)
    t.refuse(ev.SetGroupNodes(now=1, group="", nodes=("n1",)), InvalidArgumentError)
    t.refuse(ev.SetGroupNodes(now=1, group="g\x00", nodes=("n1",)), InvalidArgumentError)


def test_register_agent_records_and_replaces_addresses(t: Harness) -> None:
    assert t.handle(ev.RegisterAgent(now=0, node="n1", address="10.0.0.1:7070")) == []
    assert t.handle(ev.RegisterAgent(now=0, node="10.0.0.2:7070", address="10.0.0.2:7070")) == []
    assert t.handle(ev.RegisterAgent(now=1, node="n1", address="[fd00::1]:7070")) == []
    assert t.table.agents == {"n1": "[fd00::1]:7070", "10.0.0.2:7070": "10.0.0.2:7070"}
    t.refuse(ev.RegisterAgent(now=2, node="n1", address="no-port"), InvalidArgumentError)
    t.refuse(ev.RegisterAgent(now=2, node="n1", address="n1:0"), InvalidArgumentError)


def test_set_job_backend_sets_and_forgets_per_node(t: Harness) -> None:
    cuda: dict[str, Any] = {"kind": "cuda", "devices": [0, 1]}
    app = {"kind": "app", "port": 8000}
    assert t.handle(ev.SetJobBackend(now=0, group="g", job="a", node="", backend=cuda)) == []
    assert t.handle(ev.SetJobBackend(now=0, group="g", job="a", node="n2", backend=app)) == []
    assert t.handle(ev.SetJobBackend(now=0, group="g", job="b", node="n1", backend=app)) == []
    assert t.table.job_backends == {"g": {"a": {"": cuda, "n2": app}, "b": {"n1": app}}}
    cuda["extra"] = True  # the table keeps its own copy
    assert t.table.job_backends["g"]["a"][""] == {"kind": "cuda", "devices": [0, 1]}
    # replaced per node
    assert (
        t.handle(
            ev.SetJobBackend(
                now=1, group="g", job="a", node="n2", backend={"kind": "app", "port": 9000}
            )
        )
        == []
    )
    assert t.table.job_backends["g"]["a"]["n2"] == {"kind": "app", "port": 9000}
    # forgotten per node; the last one forgotten drops the job, then the group
    assert t.handle(ev.SetJobBackend(now=2, group="g", job="a", node="n2", backend=None)) == []
    assert t.table.job_backends["g"]["a"] == {"": {"kind": "cuda", "devices": [0, 1]}}
    assert (
        t.handle(ev.SetJobBackend(now=2, group="g", job="a", node="n9", backend=None)) == []
    )  # never set
    assert t.handle(ev.SetJobBackend(now=2, group="g", job="a", node="", backend=None)) == []
    assert t.table.job_backends == {"g": {"b": {"n1": app}}}
    assert t.handle(ev.SetJobBackend(now=3, group="g", job="b", node="n1", backend=None)) == []
    assert t.table.job_backends == {}
    assert (
        t.handle(ev.SetJobBackend(now=4, group="h", job="x", node="", backend=None)) == []
    )  # nothing anywhere
    assert t.table.job_backends == {}


def test_set_job_backend_keeps_who_registered_it(t: Harness) -> None:
    cuda: dict[str, Any] = {"cuda": {"explicitTarget": {"pids": [4242]}}}
    t.handle(ev.SetJobBackend(now=0, group="g", job="a", node="n1", backend=cuda, by="trainer-a"))
    t.handle(ev.SetJobBackend(now=0, group="g", job="a", node="", backend=cuda))
    assert t.table.registrant("g", "a", "n1") == "trainer-a"
    assert t.table.registrant("g", "a", "") == t.table.registrant("g", "b", "n1") == ""
    # Kept across a snapshot of the table, and forgotten with the backend.
    again = LockTable.from_dict(t.table.to_dict())
    assert again.registrant("g", "a", "n1") == "trainer-a"
    t.handle(ev.SetJobBackend(now=1, group="g", job="a", node="n1", backend=cuda, by="trainer-b"))
    assert t.table.registrant("g", "a", "n1") == "trainer-b"
    t.handle(ev.SetJobBackend(now=2, group="g", job="a", node="n1", backend=None, by="trainer-b"))
    assert t.table.registrant("g", "a", "n1") == ""
    assert t.table.settings.job_registrants == {}
    t.refuse(
        ev.SetJobBackend(now=3, group="g", job="a", node="", backend=cuda, by="bad\nname"),
        InvalidArgumentError,
    )


@pytest.mark.parametrize(
    "event",
    [
        ev.SetJobBackend(now=0, group="", job="a", node="", backend={}),
        ev.SetJobBackend(now=0, group="g", job="", node="", backend={}),
        ev.SetJobBackend(now=0, group="g", job="a", node="bad node", backend={}),
        ev.SetJobBackend(now=0, group="g", job="a", node="-n1", backend=None),
    ],
)
def test_set_job_backend_refusals(t: Harness, event: ev.SetJobBackend) -> None:
    t.refuse(event, InvalidArgumentError)


# --- snapshots ------------------------------------------------------------------------


def switch_history() -> list[ev.Event]:
    """Nodes, agents, backends, a quarantined job, a restart in the middle of a switch,
    detached and re-attached waiters, and a group without nodes."""
    return [
        ev.SetGroupNodes(now=0, group="g", nodes=NODES),
        ev.SetGroupNodes(now=0, group="k", nodes=("n1",)),
        ev.RegisterAgent(now=0, node="n1", address="10.0.0.1:7070"),
        ev.RegisterAgent(now=0, node="n2", address="10.0.0.2:7070"),
        ev.SetJobBackend(now=0, group="g", job="a", node="", backend={"kind": "cuda"}),
        ev.SetJobBackend(
            now=0, group="g", job="b", node="n2", backend={"kind": "app", "port": 8000}
        ),
        ev.SetHoldLimit(now=0, group="", max_hold=500.0, grace=10.0),
        ev.Acquire(now=0, group="g", job="a", call_id="0.1", request_id="ra", lease_ttl=30.0),
        ev.SwitchDone(now=1, group="g", token=1, restored=False),
        ev.Acquire(now=2, group="g", job="b", call_id="0.2", request_id="rb", lease_ttl=20.0),
        ev.Acquire(now=3, group="g", job="c", call_id="0.3"),
        ev.Acquire(now=4, group="g", job="d", call_id="0.4", wait_deadline=400.0),
        ev.Yield(now=5, group="g", job="a", request_id="ya", token=1),
        ev.SwitchDone(now=6, group="g", token=1, restored=True, faults=(("c", "xid 79"),)),  # stale
        ev.Acquire(now=7, group="k", job="x", call_id="0.5"),
        ev.SwitchDone(
            now=8, group="k", token=1, restored=False, faults=(("y", "ecc"),), moved_bytes=10
        ),
        ev.Acquire(now=9, group="h", job="z", call_id="0.6"),
        ev.Recover(now=10, grace=8.0),
        ev.Acquire(now=11, group="g", job="d", call_id="1.1", wait_deadline=400.0),
    ]


def test_the_switch_history_reaches_the_states_it_means_to() -> None:
    t = Harness()
    for event in switch_history():
        t.handle(event)
    g = group(t)
    assert g.state is GroupState.SWITCHING
    assert g.holder is not None and (g.holder.job, g.holder.call_id) == ("b", "")
    assert g.holder.claim_deadline == 18.0
    assert [(w.job, w.call_id) for w in g.queue.values()] == [("c", ""), ("d", "1.1")]
    assert group(t, "k").quarantined == {"y": "ecc"}
    assert (t.state("k"), t.state("h")) == (GroupState.LOCKED, GroupState.LOCKED)


def test_a_table_restored_mid_switch_equals_and_behaves_as_the_original() -> None:
    t = Harness()
    for event in switch_history():
        t.handle(event)
    data = t.table.to_dict()
    copy = Harness(LockTable.from_dict(json.loads(json.dumps(data))))
    copy.table.validate()
    assert copy.table.to_dict() == data
    assert copy.table.next_deadline() == t.table.next_deadline()
    g, c = group(t), group(copy)
    assert (c.state, c.holder, c.quarantined) == (g.state, g.holder, g.quarantined)
    assert (copy.table.nodes, copy.table.agents) == (t.table.nodes, t.table.agents)
    assert (copy.table.job_backends, copy.table.claim_grace) == (t.table.job_backends, 8.0)

    following: list[ev.Event] = [
        ev.KeepAlive(now=11.5, group="g", job="b", lease_id="lease-2"),  # refused: still switching
        ev.SwitchDone(
            now=12, group="g", token=2, restored=True, faults=(("c", "xid 79"),), moved_bytes=4096
        ),
        ev.Acquire(now=13, group="g", job="c", call_id="1.2"),  # quarantined
        ev.Acquire(now=14, group="g", job="e", call_id="1.3", lease_ttl=15.0),
        ev.ResetJob(now=15, group="g", job="c"),
        ev.ResetJob(now=15, group="k", job="y"),
        ev.KeepAlive(now=16, group="g", job="b", lease_id="lease-2"),  # claims the grant
        ev.Yield(now=17, group="g", job="b", request_id="yb", token=2),
        ev.Acquire(
            now=17.5, group="g", job="d", call_id="1.4", wait_deadline=400.0
        ),  # re-entrant mid-switch
        ev.ForceRelease(now=18, group="g", job="d"),
        ev.SwitchDone(now=19, group="g", token=4, restored=False, error="agent n1 unreachable"),
        ev.Acquire(now=20, group="g", job="a", call_id="1.5", request_id="ra2", lease_ttl=5.0),
        ev.SwitchDone(now=21, group="g", token=5, restored=True),
        ev.SetGroupNodes(now=22, group="k", nodes=()),
        ev.Yield(now=23, group="k", job="x"),
        ev.Acquire(now=24, group="k", job="w", call_id="1.6"),
    ]
    for event in following:
        outcomes: list[Any] = []
        for table in (t, copy):
            try:
                outcomes.append(table.handle(event))
            except TimeSliceError as exc:
                outcomes.append(type(exc))
        assert outcomes[0] == outcomes[1], event
        assert t.table.to_dict() == copy.table.to_dict()
        assert t.table.next_deadline() == copy.table.next_deadline()
    for now in (25.0, 30.0, 60.0, 600.0):
        assert t.run_due(now) == copy.run_due(now)
        assert t.table.to_dict() == copy.table.to_dict()


def test_the_restored_history_goes_where_expected() -> None:
    """The `following` events above, step by step on one table: what they should do."""
    t = Harness()
    for event in switch_history():
        t.handle(event)
    t.refuse(ev.KeepAlive(now=11.5, group="g", job="b", lease_id="lease-2"), LeaseLostError)
    assert t.handle(
        ev.SwitchDone(
            now=12, group="g", token=2, restored=True, faults=(("c", "xid 79"),), moved_bytes=4096
        )
    ) == [
        ev.Quarantined(group="g", job="c", reason="xid 79"),
        ev.LeftQueue(group="g", job="c", call_id="", reason=ev.Reason.QUARANTINED, detail="xid 79"),
        ev.Granted(
            group="g",
            job="b",
            call_id="",
            token=2,
            lease=lease(2, 20.0, 32.0),
            waited=10.0,
            context_restored=True,
            switch_bytes=4096,
        ),
    ]
    assert t.table.next_deadline() == 20.0  # the claim: 8 s after the switch
    t.refuse(ev.Acquire(now=13, group="g", job="c", call_id="1.2"), ConflictError)
    assert t.acquire("e", now=14, call_id="1.3", lease_ttl=15.0) == [
        ev.Queued(group="g", job="e", call_id="1.3", position=1)
    ]
    assert t.handle(ev.ResetJob(now=15, group="g", job="c")) == [ev.JobReset(group="g", job="c")]
    assert t.handle(ev.ResetJob(now=15, group="k", job="y")) == [ev.JobReset(group="k", job="y")]
    [renewed] = t.handle(ev.KeepAlive(now=16, group="g", job="b", lease_id="lease-2"))
    assert renewed == ev.LeaseRenewed(group="g", job="b", token=2, lease=lease(2, 20.0, 36.0))
    assert t.yield_("b", now=17, request_id="yb", token=2) == [
        ev.Yielded(
            group="g", job="b", token=2, pending_waiters=2, snapshot_deferred=False, next_job="d"
        ),
        ev.SwitchStarted(group="g", job="d", token=3, previous="b"),
    ]
    assert t.acquire("d", now=17.5, call_id="1.4", wait_deadline=400.0) == [
        ev.Superseded(group="g", job="d", call_id="1.1")
    ]
    assert t.handle(ev.ForceRelease(now=18, group="g", job="d")) == [
        ev.Revoked(group="g", job="d", token=3, reason=ev.Reason.OPERATOR, call_id="1.4"),
        ev.SwitchStarted(group="g", job="e", token=4, previous=""),
    ]
    assert t.handle(
        ev.SwitchDone(now=19, group="g", token=4, restored=False, error="agent n1 unreachable")
    ) == [
        ev.Revoked(
            group="g",
            job="e",
            token=4,
            reason=ev.Reason.SWITCH_FAILED,
            detail="agent n1 unreachable",
            call_id="1.3",
        )
    ]
    assert t.acquire("a", now=20, call_id="1.5", request_id="ra2", lease_ttl=5.0) == [
        ev.SwitchStarted(group="g", job="a", token=5, previous="")
    ]
    assert done(t, 5, now=21, restored=True) == [
        ev.Granted(
            group="g",
            job="a",
            call_id="1.5",
            token=5,
            lease=lease(5, 5.0, 26.0),
            waited=1.0,
            context_restored=True,
        )
    ]
    assert t.run_due(26.0) == [
        ev.Revoked(group="g", job="a", token=5, reason=ev.Reason.LEASE_EXPIRED)
    ]
