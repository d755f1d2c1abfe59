"""The lock table, one transition at a time.

Every step goes through `Harness.handle`, which checks the table's invariants
after it; every refused event goes through `Harness.refuse`, which checks that
the table did not change.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from typing import Any

import pytest

from timeslice.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    NotHolderError,
    ResourceExhaustedError,
    TimeSliceError,
)
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.model import TableLimits
from timeslice.api.bounds import MAX_ID_BYTES
from timeslice.orchestrator.state import Group, GroupState, LockTable


class Harness:
    """A lock table whose invariants are checked after every step."""

    def __init__(self, table: LockTable | None = None) -> None:
        self.table = table if table is not None else LockTable()

    def handle(self, event: ev.Event) -> list[ev.Effect]:
        effects = self.table.handle(event)
        self.table.validate()
        return effects

    def refuse(self, event: ev.Event, error: type[TimeSliceError]) -> TimeSliceError:
        """`event` must raise `error` and leave the table exactly as it was."""
        before = self.table.to_dict()
        deadline = self.table.next_deadline()
        with pytest.raises(error) as caught:
            self.table.handle(event)
        assert self.table.to_dict() == before
        assert self.table.next_deadline() == deadline
        self.table.validate()
        return caught.value

    def ignore(self, event: ev.Event) -> None:
        """`event` must be a no-op: no effects, no change."""
        before = self.table.to_dict()
        assert self.handle(event) == []
        assert self.table.to_dict() == before

    def acquire(self, job: str, group: str = "g", now: float = 0.0, **kw: Any) -> list[ev.Effect]:
        kw.setdefault("call_id", f"call-{job}")
        return self.handle(ev.Acquire(now=now, group=group, job=job, **kw))

    def yield_(self, job: str, group: str = "g", now: float = 0.0, **kw: Any) -> list[ev.Effect]:
        return self.handle(ev.Yield(now=now, group=group, job=job, **kw))

    def run_due(self, now: float) -> list[ev.Effect]:
        """Apply everything `due(now)` returns, as the shell does."""
        effects: list[ev.Effect] = []
        while (event := self.table.due(now)) is not None:
            effects += self.handle(event)
        return effects

    def state(self, group: str = "g") -> GroupState:
        return self.table.groups[group].state

    def holder(self, group: str = "g") -> str | None:
        h = self.table.groups[group].holder
        return h.job if h else None

    def queue(self, group: str = "g") -> list[str]:
        return list(self.table.groups[group].queue)


@pytest.fixture
def t() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.table.validate()


def granted(effects: list[ev.Effect]) -> list[ev.Granted]:
    return [e for e in effects if isinstance(e, ev.Granted)]


def no_lease(token: int) -> ev.LeaseInfo:
    return ev.LeaseInfo(lease_id=f"lease-{token}", ttl=0.0, expires_at=None)


# --- groups, queue, states -----------------------------------------------------------


def test_a_group_is_created_by_its_first_acquire(t: Harness) -> None:
    assert t.table.groups == {}
    effects = t.acquire("a", now=1.0)
    assert effects == [
        ev.Granted(
            group="g",
            job="a",
            call_id="call-a",
            token=1,
            lease=no_lease(1),
            waited=0.0,
            context_restored=False,
        )
    ]
    assert list(t.table.groups) == ["g"]
    g = t.table.groups["g"]
    assert (g.state, t.holder(), g.active_job, g.loaded_job) == (GroupState.LOCKED, "a", "a", "a")
    assert g.state_since == 1.0


def test_each_group_is_locked_on_its_own(t: Harness) -> None:
    t.acquire("a", group="g1")
    assert granted(t.acquire("b", group="g2", call_id="b2"))[0].token == 1
    assert (t.holder("g1"), t.holder("g2")) == ("a", "b")


def test_waiters_are_queued_and_served_first_come_first_served(t: Harness) -> None:
    t.acquire("a")
    assert t.acquire("b", now=1) == [ev.Queued(group="g", job="b", call_id="call-b", position=0)]
    assert t.acquire("c", now=2) == [ev.Queued(group="g", job="c", call_id="call-c", position=1)]
    assert t.acquire("d", now=3) == [ev.Queued(group="g", job="d", call_id="call-d", position=2)]
    assert t.queue() == ["b", "c", "d"]
    served = []
    for job in ["a", "b", "c", "d"]:
        effects = t.yield_(job, now=10)
        served += [e.job for e in granted(effects)]
    assert served == ["b", "c", "d"]
    assert t.state() is GroupState.IDLE_YIELDED


def test_a_waiter_asking_again_is_not_queued_twice(t: Harness) -> None:
    t.acquire("a")
    t.acquire("b")
    t.acquire("c")
    # the same call again: nothing to supersede
    assert t.acquire("b") == [ev.Queued(group="g", job="b", call_id="call-b", position=0)]
    # a new call of the same job takes the place of the old one
    assert t.acquire("b", call_id="b-2") == [
        ev.Superseded(group="g", job="b", call_id="call-b"),
        ev.Queued(group="g", job="b", call_id="b-2", position=0),
    ]
    assert t.queue() == ["b", "c"]
    assert t.table.groups["g"].queue["b"].call_id == "b-2"


def test_the_holder_acquiring_again_gets_the_same_token(t: Harness) -> None:
    first = granted(t.acquire("a"))[0]
    # Asking again for a grant already taken: losing this answer must not roll
    # the grant back (must_deliver False), or the job would hold without the lock.
    again = t.acquire("a", now=5)
    assert again == [
        ev.Granted(
            group="g",
            job="a",
            call_id="call-a",
            token=first.token,
            lease=first.lease,
            waited=0.0,
            context_restored=False,
            must_deliver=False,
        )
    ]
    again = t.acquire("a", now=6, call_id="a-2")
    assert again == [
        ev.Superseded(group="g", job="a", call_id="call-a"),
        ev.Granted(
            group="g",
            job="a",
            call_id="a-2",
            token=first.token,
            lease=first.lease,
            waited=0.0,
            context_restored=False,
            must_deliver=False,
        ),
    ]
    assert t.table.groups["g"].token == first.token


def test_state_goes_locked_then_idle_yielded(t: Harness) -> None:
    t.acquire("a")
    assert t.state() is GroupState.LOCKED
    effects = t.yield_("a", now=4)
    assert effects == [
        ev.Yielded(
            group="g", job="a", token=1, pending_waiters=0, snapshot_deferred=True, next_job=""
        )
    ]
    g = t.table.groups["g"]
    assert g.state is GroupState.IDLE_YIELDED
    assert (g.holder, g.active_job, g.loaded_job, g.state_since) == (None, "a", "a", 4)


def test_a_fresh_group_is_idle() -> None:
    assert Group(name="g", state_since=0.0).state is GroupState.IDLE


def test_yield_with_nobody_waiting_keeps_the_context_live_for_the_same_job(t: Harness) -> None:
    t.acquire("a", now=0)
    [yielded] = t.yield_("a", now=1)
    assert yielded.snapshot_deferred and yielded.pending_waiters == 0 and yielded.next_job == ""
    [again] = t.acquire("a", now=2, call_id="a-2")
    assert again == ev.Granted(
        group="g",
        job="a",
        call_id="a-2",
        token=2,
        lease=no_lease(2),
        waited=0.0,
        context_restored=False,
    )
    assert t.state() is GroupState.LOCKED


def test_another_job_takes_an_idle_yielded_group_at_once(t: Harness) -> None:
    t.acquire("a")
    t.yield_("a")
    [g] = t.acquire("b", now=3)
    assert (g.job, g.token, g.waited) == ("b", 2, 0.0)
    assert t.table.groups["g"].active_job == "b"


def test_yield_with_a_waiter_grants_it(t: Harness) -> None:
    t.acquire("a", now=0)
    t.acquire("b", now=2)
    t.acquire("c", now=3)
    effects = t.yield_("a", now=7)
    assert effects == [
        ev.Yielded(
            group="g", job="a", token=1, pending_waiters=2, snapshot_deferred=False, next_job="b"
        ),
        ev.Granted(
            group="g",
            job="b",
            call_id="call-b",
            token=2,
            lease=no_lease(2),
            waited=5.0,
            context_restored=False,
        ),
    ]
    g = t.table.groups["g"]
    assert (g.active_job, g.loaded_job, t.queue()) == ("b", "b", ["c"])


# --- leases and hold limits ----------------------------------------------------------


def test_a_lease_expires_unless_kept_alive_and_the_next_waiter_is_granted(t: Harness) -> None:
    [g] = t.acquire("a", now=0, lease_ttl=10.0)
    assert g.lease == ev.LeaseInfo(lease_id="lease-1", ttl=10.0, expires_at=10.0)
    t.acquire("b", now=1)
    assert t.table.next_deadline() == 10.0
    assert t.table.due(9.99) is None
    assert t.table.due(10.0) == ev.Revoke(
        now=10.0, group="g", token=1, reason=ev.Reason.LEASE_EXPIRED
    )
    effects = t.run_due(10.0)
    assert effects == [
        ev.Revoked(group="g", job="a", token=1, reason=ev.Reason.LEASE_EXPIRED),
        ev.Granted(
            group="g",
            job="b",
            call_id="call-b",
            token=2,
            lease=no_lease(2),
            waited=9.0,
            context_restored=False,
        ),
    ]
    t.refuse(ev.KeepAlive(now=11, group="g", job="a", lease_id="lease-1"), LeaseLostError)


def test_keep_alive_moves_the_expiry(t: Harness) -> None:
    t.acquire("a", now=0, lease_ttl=10.0)
    effects = t.handle(ev.KeepAlive(now=6.0, group="g", job="a", lease_id="lease-1"))
    assert effects == [
        ev.LeaseRenewed(
            group="g",
            job="a",
            token=1,
            lease=ev.LeaseInfo(lease_id="lease-1", ttl=10.0, expires_at=16.0),
        )
    ]
    assert t.table.due(10.0) is None
    assert t.table.next_deadline() == 16.0
    assert t.run_due(16.0) == [
        ev.Revoked(group="g", job="a", token=1, reason=ev.Reason.LEASE_EXPIRED)
    ]
    assert t.state() is GroupState.IDLE_YIELDED


def test_a_lease_expiring_with_nobody_waiting_leaves_the_context_live(t: Harness) -> None:
    t.acquire("a", now=0, lease_ttl=1.0)
    t.run_due(1.0)
    g = t.table.groups["g"]
    assert (g.state, g.active_job) == (GroupState.IDLE_YIELDED, "a")


@pytest.mark.parametrize(
    ("event", "error"),
    [
        (ev.KeepAlive(now=1, group="g", job="a", lease_id="lease-7"), LeaseLostError),
        (ev.KeepAlive(now=1, group="g", job="b", lease_id="lease-1"), LeaseLostError),
        (ev.KeepAlive(now=1, group="nope", job="a", lease_id="lease-1"), NotFoundError),
        (ev.KeepAlive(now=1, group="", job="a", lease_id="lease-1"), InvalidArgumentError),
    ],
)
def test_keep_alive_of_anything_but_the_current_lease_is_refused(
    t: Harness, event: ev.KeepAlive, error: type[TimeSliceError]
) -> None:
    t.acquire("a", now=0, lease_ttl=10.0)
    t.acquire("b", now=0)
    t.refuse(event, error)


def test_a_holder_without_a_lease_is_never_revoked_for_silence(t: Harness) -> None:
    [g] = t.acquire("a", now=0)  # a v1alpha1 client: no lease TTL
    assert g.lease.ttl == 0.0 and g.lease.expires_at is None
    t.acquire("b", now=0, lease_ttl=5.0)
    assert t.table.next_deadline() is None
    assert t.table.due(1e9) is None
    t.handle(ev.Recover(now=100.0, grace=5.0))
    assert t.run_due(1e9) == [
        ev.LeftQueue(group="g", job="b", call_id="", reason=ev.Reason.NOT_RECLAIMED)
    ]
    assert t.holder() == "a"


def test_a_holder_without_a_lease_loses_the_lock_by_yield(t: Harness) -> None:
    t.acquire("a")
    t.acquire("b")
    assert [e.job for e in granted(t.yield_("a"))] == ["b"]


def test_force_release_takes_the_lock_and_grants_the_next(t: Harness) -> None:
    t.acquire("a", now=0)
    t.acquire("b", now=1)
    effects = t.handle(ev.ForceRelease(now=3, group="g", reason="stuck"))
    assert effects == [
        ev.Revoked(group="g", job="a", token=1, reason=ev.Reason.OPERATOR, detail="stuck"),
        ev.Granted(
            group="g",
            job="b",
            call_id="call-b",
            token=2,
            lease=no_lease(2),
            waited=2.0,
            context_restored=False,
        ),
    ]
    effects = t.handle(ev.ForceRelease(now=4, group="g", job="b"))
    assert effects == [ev.Revoked(group="g", job="b", token=2, reason=ev.Reason.OPERATOR)]
    assert t.state() is GroupState.IDLE_YIELDED


@pytest.mark.parametrize(
    ("event", "error"),
    [
        (ev.ForceRelease(now=1, group="g", job="b"), NotHolderError),
        (ev.ForceRelease(now=1, group="nope"), NotFoundError),
        (ev.ForceRelease(now=1, group=""), InvalidArgumentError),
    ],
)
def test_force_release_refusals(
    t: Harness, event: ev.ForceRelease, error: type[TimeSliceError]
) -> None:
    t.acquire("a")
    t.acquire("b")
    t.refuse(event, error)


def test_force_release_of_a_free_group_is_refused(t: Harness) -> None:
    t.acquire("a")
    t.yield_("a")
    t.refuse(ev.ForceRelease(now=1, group="g"), NotHolderError)


def test_the_default_hold_limit_applies_to_every_group(t: Harness) -> None:
    assert t.handle(ev.SetHoldLimit(now=0, group="", max_hold=30.0)) == []
    t.acquire("a", group="g1", now=0)
    t.acquire("b", group="g2", now=5)
    t.acquire("c", group="g1", now=6)
    assert t.table.next_deadline() == 30.0
    assert t.run_due(30.0) == [
        ev.Revoked(group="g1", job="a", token=1, reason=ev.Reason.HOLD_LIMIT),
        ev.Granted(
            group="g1",
            job="c",
            call_id="call-c",
            token=2,
            lease=no_lease(2),
            waited=24.0,
            context_restored=False,
        ),
    ]
    assert t.run_due(35.0) == [
        ev.Revoked(group="g2", job="b", token=1, reason=ev.Reason.HOLD_LIMIT)
    ]
    assert t.table.next_deadline() == 60.0  # c's grant began at 30


def test_a_group_hold_limit_overrides_the_default(t: Harness) -> None:
    t.handle(ev.SetHoldLimit(now=0, group="", max_hold=30.0))
    t.handle(ev.SetHoldLimit(now=0, group="short", max_hold=5.0))
    t.handle(ev.SetHoldLimit(now=0, group="free", max_hold=None))
    t.acquire("a", group="short")
    t.acquire("a", group="free", call_id="a-free")
    t.acquire("a", group="other", call_id="a-other")
    assert t.run_due(1e6) == [
        ev.Revoked(group="short", job="a", token=1, reason=ev.Reason.HOLD_LIMIT),
        ev.Revoked(group="other", job="a", token=1, reason=ev.Reason.HOLD_LIMIT),
    ]
    assert t.holder("free") == "a"
    assert t.table.hold_limit("short") == 5.0
    assert t.table.hold_limit("free") is None
    assert t.table.hold_limit("other") == 30.0


def test_a_hold_limit_set_later_applies_to_the_current_holder(t: Harness) -> None:
    t.acquire("a", now=0)
    assert t.table.next_deadline() is None
    t.handle(ev.SetHoldLimit(now=10, group="g", max_hold=20.0))
    assert t.table.next_deadline() == 20.0
    t.handle(
        ev.SetHoldLimit(now=11, group="g", max_hold=50.0)
    )  # a longer limit moves the deadline out
    assert t.table.due(20.0) is None
    assert t.table.next_deadline() == 50.0


def test_the_earlier_of_lease_and_hold_limit_wins(t: Harness) -> None:
    t.handle(ev.SetHoldLimit(now=0, group="g", max_hold=15.0))
    t.acquire("a", now=0, lease_ttl=10.0)
    t.handle(ev.KeepAlive(now=8, group="g", job="a", lease_id="lease-1"))  # lease now ends at 18
    assert t.run_due(15.0) == [ev.Revoked(group="g", job="a", token=1, reason=ev.Reason.HOLD_LIMIT)]


@pytest.mark.parametrize("max_hold", [0.0, -1.0])
def test_a_hold_limit_must_be_positive(t: Harness, max_hold: float) -> None:
    t.acquire("a")
    t.refuse(ev.SetHoldLimit(now=0, group="g", max_hold=max_hold), InvalidArgumentError)


# --- fencing tokens ------------------------------------------------------------------


def test_fencing_tokens_grow_with_every_grant_of_a_group(t: Harness) -> None:
    tokens = [granted(t.acquire("a", now=0, lease_ttl=1.0))[0].token]
    t.acquire("b", now=0)
    t.acquire("c", now=0)
    tokens += [e.token for e in granted(t.run_due(1.0))]  # lease of a expires: b
    tokens += [e.token for e in granted(t.yield_("b", now=2))]  # c
    tokens += [e.token for e in granted(t.handle(ev.ForceRelease(now=3, group="g")))]  # nobody
    tokens += [e.token for e in granted(t.acquire("a", now=4, call_id="a-2"))]
    assert tokens == [1, 2, 3, 4]
    assert granted(t.acquire("z", group="h"))[0].token == 1  # per group


def test_fencing_tokens_keep_growing_across_recover_and_snapshot(t: Harness) -> None:
    t.acquire("a", now=0)
    t.yield_("a", now=1)
    t.handle(ev.Recover(now=2, grace=5))
    restored = Harness(LockTable.from_dict(json.loads(json.dumps(t.table.to_dict()))))
    [g] = restored.acquire("b", now=3)
    assert g.token == 2


# --- waiters leaving -----------------------------------------------------------------


def test_a_cancelled_waiter_leaves_the_queue(t: Harness) -> None:
    t.acquire("a")
    for job in "bcd":
        t.acquire(job)
    effects = t.handle(
        ev.DropWaiter(now=1, group="g", job="c", call_id="call-c", reason=ev.Reason.CANCELLED)
    )
    assert effects == [
        ev.LeftQueue(group="g", job="c", call_id="call-c", reason=ev.Reason.CANCELLED)
    ]
    assert t.queue() == ["b", "d"]
    assert t.acquire("e") == [ev.Queued(group="g", job="e", call_id="call-e", position=2)]


@pytest.mark.parametrize(
    "event",
    [
        ev.DropWaiter(
            now=1, group="g", job="b", call_id="old-call", reason=ev.Reason.CANCELLED
        ),  # re-attached since
        ev.DropWaiter(
            now=1, group="g", job="x", call_id="call-x", reason=ev.Reason.CANCELLED
        ),  # never queued
        ev.DropWaiter(
            now=1, group="g", job="a", call_id="call-a", reason=ev.Reason.CANCELLED
        ),  # the holder
        ev.DropWaiter(now=1, group="nope", job="b", call_id="call-b", reason=ev.Reason.CANCELLED),
        ev.Revoke(now=1, group="g", token=0, reason=ev.Reason.LEASE_EXPIRED),  # a token long gone
        ev.Revoke(
            now=1, group="g", token=2, reason=ev.Reason.LEASE_EXPIRED
        ),  # a token not issued yet
        ev.Revoke(now=1, group="g", token=1, reason=ev.Reason.NOT_DELIVERED, call_id="old-call"),
        ev.Revoke(now=1, group="nope", token=1, reason=ev.Reason.LEASE_EXPIRED),
    ],
)
def test_stale_drop_and_revoke_are_no_ops(t: Harness, event: ev.Event) -> None:
    t.acquire("a")
    t.acquire("b", call_id="old-call")
    t.acquire("b")  # re-attached through call-b
    t.ignore(event)


def test_a_waiter_granted_already_cannot_be_dropped(t: Harness) -> None:
    t.acquire("a")
    t.acquire("b")
    t.yield_("a")
    t.ignore(ev.DropWaiter(now=1, group="g", job="b", call_id="call-b", reason=ev.Reason.CANCELLED))
    assert t.holder() == "b"


def test_a_grant_nobody_took_is_rolled_back_and_the_next_waiter_granted(t: Harness) -> None:
    t.acquire("a", now=0)
    t.acquire("b", now=1)
    t.acquire("c", now=2)
    [_, g] = t.yield_("a", now=3)
    assert (g.job, g.call_id) == ("b", "call-b")
    effects = t.handle(
        ev.Revoke(now=3, group="g", token=g.token, reason=ev.Reason.NOT_DELIVERED, call_id="call-b")
    )
    assert effects == [
        ev.Revoked(group="g", job="b", token=2, reason=ev.Reason.NOT_DELIVERED),
        ev.Granted(
            group="g",
            job="c",
            call_id="call-c",
            token=3,
            lease=no_lease(3),
            waited=1.0,
            context_restored=False,
        ),
    ]
    assert t.queue() == []


def test_a_grant_nobody_took_leaves_the_previous_context_active(t: Harness) -> None:
    t.acquire("a", now=0)
    t.acquire("b", now=1)
    [_, g] = t.yield_("a", now=2)
    assert (t.table.groups["g"].active_job, t.table.groups["g"].loaded_job) == ("b", "b")
    t.handle(
        ev.Revoke(now=3, group="g", token=g.token, reason=ev.Reason.NOT_DELIVERED, call_id="call-b")
    )
    group = t.table.groups["g"]
    assert t.state() is GroupState.IDLE_YIELDED
    assert (group.active_job, group.loaded_job, group.token) == ("a", "a", 2)
    # a grant that was taken and then lost leaves its own context live
    t.acquire("c", now=4)
    t.handle(ev.Revoke(now=5, group="g", token=3, reason=ev.Reason.LEASE_EXPIRED))
    assert (group.active_job, group.loaded_job) == ("c", "c")


def test_only_a_claim_of_an_unclaimed_grant_must_be_delivered(t: Harness) -> None:
    t.acquire("a", now=0)
    t.acquire("b", now=1)
    t.handle(ev.Recover(now=10.0, grace=5.0))
    [_, g] = t.yield_("a", now=11)
    assert (g.job, g.call_id, g.must_deliver) == ("b", "", True)
    [claim] = t.acquire("b", now=12, call_id="1.b")
    assert isinstance(claim, ev.Granted) and claim.must_deliver
    [again] = t.acquire("b", now=13, call_id="1.b2")[1:]
    assert isinstance(again, ev.Granted) and not again.must_deliver


def test_a_waiter_leaves_when_its_wait_deadline_passes(t: Harness) -> None:
    t.acquire("a", now=0)
    t.acquire("b", now=1, wait_deadline=5.0)
    t.acquire("c", now=2)
    assert t.table.next_deadline() == 5.0
    assert t.table.due(5.0) == ev.DropWaiter(
        now=5.0, group="g", job="b", call_id="call-b", reason=ev.Reason.WAIT_TIMEOUT
    )
    assert t.run_due(5.0) == [
        ev.LeftQueue(group="g", job="b", call_id="call-b", reason=ev.Reason.WAIT_TIMEOUT)
    ]
    assert t.queue() == ["c"]


def test_a_waiter_granted_before_its_deadline_keeps_the_grant(t: Harness) -> None:
    t.acquire("a", now=0)
    t.acquire("b", now=1, wait_deadline=5.0)
    t.yield_("a", now=2)
    assert t.run_due(100.0) == []
    assert t.holder() == "b"


def test_an_acquire_whose_deadline_has_passed_on_a_busy_group_is_refused(t: Harness) -> None:
    t.acquire("a", now=0)
    t.refuse(
        ev.Acquire(now=5, group="g", job="b", call_id="call-b", wait_deadline=5.0),
        DeadlineExceededError,
    )
    t.refuse(
        ev.Acquire(now=5, group="g", job="b", call_id="call-b", wait_deadline=4.0),
        DeadlineExceededError,
    )


def test_an_acquire_whose_deadline_has_passed_on_a_free_group_is_granted(t: Harness) -> None:
    [g] = t.acquire("a", now=5, wait_deadline=5.0)
    assert g.token == 1
    assert t.table.next_deadline() is None


# --- recovery ------------------------------------------------------------------------


def test_recover_starts_an_epoch_and_gives_holders_a_fresh_lease(t: Harness) -> None:
    t.acquire("a", now=0, lease_ttl=10.0)
    t.acquire("b", now=0, group="h", call_id="b-h")
    assert t.handle(ev.Recover(now=100.0, grace=5.0)) == []
    assert t.table.epoch == 1
    h = t.table.groups["g"].holder
    assert h is not None and h.expires_at == 110.0
    assert t.table.groups["h"].holder.expires_at is None  # type: ignore[union-attr]
    assert t.table.next_deadline() == 110.0
    t.handle(ev.Recover(now=200.0, grace=5.0))
    assert t.table.epoch == 2


def test_recover_detaches_waiters_and_drops_those_that_do_not_come_back(t: Harness) -> None:
    t.acquire("a", now=0)
    t.acquire("b", now=1)
    t.acquire("c", now=2)
    t.handle(ev.Recover(now=10.0, grace=5.0))
    assert [w.call_id for w in t.table.groups["g"].queue.values()] == ["", ""]
    assert t.table.due(14.9) is None
    assert t.table.due(15.0) == ev.DropWaiter(
        now=15.0, group="g", job="b", call_id="", reason=ev.Reason.NOT_RECLAIMED
    )
    assert t.run_due(15.0) == [
        ev.LeftQueue(group="g", job="b", call_id="", reason=ev.Reason.NOT_RECLAIMED),
        ev.LeftQueue(group="g", job="c", call_id="", reason=ev.Reason.NOT_RECLAIMED),
    ]
    assert t.holder() == "a"


def test_a_waiter_coming_back_after_recover_keeps_its_place(t: Harness) -> None:
    t.acquire("a", now=0)
    t.acquire("b", now=1)
    t.acquire("c", now=2)
    t.handle(ev.Recover(now=10.0, grace=5.0))
    assert t.acquire("c", now=11, call_id="1.c") == [
        ev.Queued(group="g", job="c", call_id="1.c", position=1)
    ]
    assert t.run_due(15.0) == [
        ev.LeftQueue(group="g", job="b", call_id="", reason=ev.Reason.NOT_RECLAIMED)
    ]
    assert t.queue() == ["c"]
    [_, g] = t.yield_("a", now=16)
    assert (g.job, g.call_id, g.waited) == ("c", "1.c", 14.0)


def test_a_grant_to_a_detached_waiter_is_revoked_unless_claimed(t: Harness) -> None:
    t.acquire("a", now=0)
    t.acquire("b", now=1)
    t.acquire("c", now=2)
    t.handle(ev.Recover(now=10.0, grace=5.0))
    t.acquire("c", now=11, call_id="1.c")
    [_, g] = t.yield_("a", now=12)
    assert (g.job, g.call_id) == ("b", "")
    assert t.table.next_deadline() == 15.0
    assert t.table.due(15.0) == ev.Revoke(
        now=15.0, group="g", token=2, reason=ev.Reason.NOT_DELIVERED
    )
    assert t.run_due(15.0) == [
        ev.Revoked(group="g", job="b", token=2, reason=ev.Reason.NOT_DELIVERED),
        ev.Granted(
            group="g",
            job="c",
            call_id="1.c",
            token=3,
            lease=no_lease(3),
            waited=13.0,
            context_restored=False,
        ),
    ]


def test_a_grant_to_a_detached_waiter_is_claimed_by_its_acquire(t: Harness) -> None:
    t.acquire("a", now=0)
    t.acquire("b", now=1)
    t.handle(ev.Recover(now=10.0, grace=5.0))
    t.yield_("a", now=12)
    # Delivered as it was made: b waited from 1 (queued) to 12 (granted).
    assert t.acquire("b", now=13, call_id="1.b") == [
        ev.Granted(
            group="g",
            job="b",
            call_id="1.b",
            token=2,
            lease=no_lease(2),
            waited=11.0,
            context_restored=False,
        )
    ]
    assert t.table.next_deadline() is None
    assert t.run_due(1e6) == []


def test_a_grant_to_a_detached_waiter_is_claimed_by_keep_alive(t: Harness) -> None:
    t.acquire("a", now=0)
    t.acquire("b", now=1, lease_ttl=60.0)
    t.handle(ev.Recover(now=10.0, grace=5.0))
    t.yield_("a", now=12)
    t.handle(ev.KeepAlive(now=13.0, group="g", job="b", lease_id="lease-2"))
    assert t.table.next_deadline() == 73.0  # the lease, no longer the claim
    assert t.run_due(72.0) == []
    assert t.holder() == "b"


def test_a_claim_by_keep_alive_keeps_the_hold_limit(t: Harness) -> None:
    t.handle(ev.SetHoldLimit(now=0, group="", max_hold=100.0))
    t.acquire("a", now=0)
    t.acquire("b", now=1)  # a v1alpha1 client: no lease
    t.handle(ev.Recover(now=10.0, grace=5.0))
    t.yield_("a", now=12)
    t.handle(ev.KeepAlive(now=13.0, group="g", job="b", lease_id="lease-2"))
    assert t.table.next_deadline() == 112.0
    assert t.run_due(112.0) == [
        ev.Revoked(group="g", job="b", token=2, reason=ev.Reason.HOLD_LIMIT)
    ]


def test_an_unclaimed_holder_grant_gets_a_new_claim_deadline_on_recover(t: Harness) -> None:
    t.acquire("a", now=0)
    t.acquire("b", now=1)
    t.handle(ev.Recover(now=10.0, grace=5.0))
    t.yield_("a", now=12)  # granted to b, detached: claim by 15
    t.handle(ev.Recover(now=14.0, grace=5.0))
    assert t.table.due(15.0) is None
    assert t.table.next_deadline() == 19.0


# --- request ids and fencing on yield ------------------------------------------------


def test_a_retried_acquire_while_holding_returns_the_same_token(t: Harness) -> None:
    [first] = t.acquire("a", now=0, request_id="r1")
    [again] = t.acquire("a", now=1, request_id="r1")
    assert again.token == first.token == 1


def test_a_retried_acquire_after_its_grant_ended_is_refused(t: Harness) -> None:
    t.acquire("a", now=0, request_id="r1")
    t.yield_("a", now=1)
    err = t.refuse(
        ev.Acquire(now=2, group="g", job="a", call_id="a-2", request_id="r1"), LeaseLostError
    )
    assert "r1" in str(err)
    t.acquire("b", now=3)
    t.refuse(ev.Acquire(now=4, group="g", job="a", call_id="a-3", request_id="r1"), LeaseLostError)


def test_a_retried_acquire_granted_to_a_waiter_returns_its_token(t: Harness) -> None:
    t.acquire("a", now=0)
    t.acquire("b", now=0, request_id="rb")
    t.yield_("a", now=1)
    assert t.acquire("b", now=2, request_id="rb", call_id="b-2") == [
        ev.Superseded(group="g", job="b", call_id="call-b"),
        ev.Granted(
            group="g",
            job="b",
            call_id="b-2",
            token=2,
            lease=no_lease(2),
            waited=0.0,
            context_restored=False,
            must_deliver=False,
        ),
    ]


def test_a_retried_reentrant_acquire_after_its_grant_ended_is_refused(t: Harness) -> None:
    t.acquire("a", now=0, request_id="r1")
    t.acquire("a", now=1, request_id="r2", call_id="a-2")
    t.handle(ev.ForceRelease(now=2, group="g"))
    t.refuse(ev.Acquire(now=3, group="g", job="a", call_id="a-3", request_id="r2"), LeaseLostError)


def test_a_retried_yield_returns_the_first_answer(t: Harness) -> None:
    t.acquire("a", now=0)
    t.acquire("b", now=0)
    first = t.yield_("a", now=1, request_id="y1")
    before = t.table.to_dict()
    # The same answer, marked as given again: nothing happened now (watchers, logs,
    # metrics and timelines leave it out).
    [again] = t.yield_("a", now=2, request_id="y1")
    assert again == dataclasses.replace(first[0], again=True)
    assert t.table.to_dict() == before
    t.refuse(ev.Yield(now=3, group="g", job="a", request_id="y2"), NotHolderError)


def test_a_request_id_of_another_job_or_group_is_not_a_retry(t: Harness) -> None:
    t.acquire("a", group="g1", now=0)
    t.acquire("b", group="g2", now=0)
    t.yield_("a", group="g1", now=1, request_id="7")
    # b's first Yield with the same id is applied, not answered as a's was
    assert t.yield_("b", group="g2", now=2, request_id="7") == [
        ev.Yielded(
            group="g2", job="b", token=1, pending_waiters=0, snapshot_deferred=True, next_job=""
        )
    ]
    assert t.table.groups["g2"].holder is None
    # nor is a's id of a Yield taken for an Acquire's
    [granted] = t.acquire("a", group="g1", now=3, request_id="7", call_id="a-2")
    assert isinstance(granted, ev.Granted) and granted.token == 2


def test_the_answers_kept_for_retries_are_one_per_job_and_kind_and_expire(t: Harness) -> None:
    for i in range(1000):
        t.acquire("a", now=i, request_id=f"acq-{i}", call_id=f"a-{i}")
        t.yield_("a", now=i + 0.5, request_id=f"yield-{i}")
    assert len(t.table.answers) == 2  # a's latest Acquire and its latest Yield
    assert len(json.dumps(t.table.to_dict()["answers"])) < 1000
    # a retry of the latest is still answered as the first try was
    assert t.yield_("a", now=999.6, request_id="yield-999") == [
        ev.Yielded(
            group="g",
            job="a",
            token=1000,
            pending_waiters=0,
            snapshot_deferred=True,
            next_job="",
            again=True,
        )
    ]
    t.acquire("b", now=5000, request_id="b-1")
    assert list(t.table.answers) == [("acquire", "g", "b")]  # a's are two minutes old


def test_no_new_group_and_no_waiter_over_the_tables_limits(t: Harness) -> None:
    t.table.limits = TableLimits(max_groups=2, max_waiters_per_group=2)
    t.acquire("a", group="g1")
    t.acquire("a", group="g2", call_id="call-a2")
    t.refuse(ev.Acquire(now=0, group="g3", job="a", call_id="call-3"), ResourceExhaustedError)
    t.refuse(
        ev.Acquire(now=0, group="g1", job="x", call_id="call-x", more_groups=("g3",)),
        ResourceExhaustedError,
    )
    t.acquire("b", group="g1")
    t.acquire("c", group="g1")
    err = t.refuse(ev.Acquire(now=0, group="g1", job="d", call_id="call-d"), ResourceExhaustedError)
    assert "g1" in str(err)
    # a job already queued asks again (its retry) whatever the limits
    t.acquire("c", group="g1", call_id="call-c2")
    # once one leaves, another may wait
    t.yield_("a", group="g1")
    t.acquire("d", group="g1")
    # a journal is folded without limits: what it holds was admitted
    replayed = LockTable.from_dict(t.table.to_dict())
    assert replayed.limits is None


def test_yield_with_a_stale_token_is_refused(t: Harness) -> None:
    t.acquire("a", now=0)
    t.yield_("a", now=1)
    t.acquire("a", now=2, call_id="a-2")  # token 2
    t.refuse(ev.Yield(now=3, group="g", job="a", token=1), LeaseLostError)
    t.refuse(ev.Yield(now=3, group="g", job="b", token=2), LeaseLostError)
    assert t.yield_("a", now=3, token=2) == [
        ev.Yielded(
            group="g", job="a", token=2, pending_waiters=0, snapshot_deferred=True, next_job=""
        )
    ]
    t.refuse(ev.Yield(now=4, group="g", job="a", token=2), LeaseLostError)


def test_yield_by_a_non_holder_is_refused(t: Harness) -> None:
    t.acquire("a")
    t.acquire("b")
    err = t.refuse(ev.Yield(now=1, group="g", job="b"), NotHolderError)
    assert "a" in str(err)
    t.yield_("a")
    t.yield_("b")
    t.refuse(ev.Yield(now=1, group="g", job="b"), NotHolderError)  # a free group


@pytest.mark.parametrize(
    "event",
    [
        ev.Yield(now=0, group="nope", job="a"),
        ev.KeepAlive(now=0, group="nope", job="a", lease_id="lease-1"),
        ev.ForceRelease(now=0, group="nope"),
    ],
)
def test_an_unknown_group_is_not_found(t: Harness, event: ev.Event) -> None:
    t.acquire("a")
    t.refuse(event, NotFoundError)


# --- argument checks -----------------------------------------------------------------

BAD_IDS = {
    "empty": "",
    "too long": "x" * (MAX_ID_BYTES + 1),
    "too many bytes": "é" * (MAX_ID_BYTES // 2 + 1),
    "newline": "a\nb",
    "nul": "a\x00",
    "escape": "\x1b[31m",
    "delete": "a\x7f",
}


@pytest.mark.parametrize("bad", BAD_IDS.values(), ids=BAD_IDS.keys())
@pytest.mark.parametrize("field", ["job", "group"])
def test_acquire_refuses_bad_ids(t: Harness, field: str, bad: str) -> None:
    t.acquire("a")
    event = ev.Acquire(now=0, **{"group": "g", "job": "b", field: bad}, call_id="c")
    err = t.refuse(event, InvalidArgumentError)
    assert f"{field}_id" in str(err)


@pytest.mark.parametrize("bad", BAD_IDS.values(), ids=BAD_IDS.keys())
def test_yield_refuses_bad_ids(t: Harness, bad: str) -> None:
    t.acquire("a")
    t.refuse(ev.Yield(now=0, group="g", job=bad), InvalidArgumentError)
    t.refuse(ev.Yield(now=0, group=bad, job="a"), InvalidArgumentError)


def test_ids_up_to_the_limit_are_accepted(t: Harness) -> None:
    job, group = "é" * (MAX_ID_BYTES // 2), "g" * MAX_ID_BYTES
    assert granted(t.acquire(job, group=group))[0].job == job
    assert t.yield_(job, group=group)[0].job == job


@pytest.mark.parametrize("ttl", [0.0, -1.0, 3600.001, math.inf, math.nan])
def test_a_lease_ttl_out_of_range_is_refused(t: Harness, ttl: float) -> None:
    t.refuse(
        ev.Acquire(now=0, group="g", job="a", call_id="c", lease_ttl=ttl), InvalidArgumentError
    )
    assert t.table.groups == {}  # no group is created by a refused acquire


@pytest.mark.parametrize("ttl", [0.001, 3600.0])
def test_a_lease_ttl_in_range_is_accepted(t: Harness, ttl: float) -> None:
    [g] = t.acquire("a", now=1.0, lease_ttl=ttl)
    assert g.lease == ev.LeaseInfo(lease_id="lease-1", ttl=ttl, expires_at=1.0 + ttl)


def test_handle_refuses_what_is_not_an_event(t: Harness) -> None:
    with pytest.raises(TypeError):
        t.table.handle(
            ev.Granted(
                group="g",
                job="a",
                call_id="c",
                token=1,
                lease=no_lease(1),
                waited=0.0,
                context_restored=False,
            )
        )  # type: ignore[arg-type]


# --- snapshots and replay ------------------------------------------------------------


def busy_history() -> list[ev.Event]:
    """A history touching every kind of state: leases, hold limits, detached waiters,
    an unclaimed grant, remembered requests, several groups."""
    return [
        ev.SetHoldLimit(now=0, group="", max_hold=500.0),
        ev.SetHoldLimit(now=0, group="h", max_hold=None),
        ev.Acquire(now=0, group="g", job="a", call_id="0.1", request_id="ra", lease_ttl=30.0),
        ev.Acquire(now=1, group="g", job="b", call_id="0.2", request_id="rb", wait_deadline=400.0),
        ev.Acquire(now=2, group="g", job="c", call_id="0.3", request_id="rc", lease_ttl=20.0),
        ev.Acquire(now=3, group="g", job="d", call_id="0.4"),
        ev.Acquire(now=4, group="h", job="a", call_id="0.5", lease_ttl=10.0),
        ev.Yield(now=5, group="h", job="a", request_id="ya"),
        ev.Acquire(now=6, group="k", job="z", call_id="0.6"),
        ev.Recover(now=10, grace=8.0),
        ev.Acquire(now=11, group="g", job="c", call_id="1.1", request_id="rc", lease_ttl=20.0),
        ev.Yield(now=12, group="g", job="a", request_id="ya2", token=1),
    ]


def live(history: list[ev.Event]) -> Harness:
    t = Harness()
    for event in history:
        t.handle(event)
    return t


def test_the_busy_history_reaches_the_states_it_means_to() -> None:
    t = live(busy_history())
    g = t.table.groups["g"]
    assert g.holder is not None and (g.holder.job, g.holder.call_id) == ("b", "")
    assert list(g.queue) == ["c", "d"] and g.queue["c"].call_id == "1.1"
    assert t.state("h") is GroupState.IDLE_YIELDED
    assert t.table.epoch == 1


def test_to_dict_is_json_ready_and_round_trips() -> None:
    t = live(busy_history())
    data = t.table.to_dict()
    restored = LockTable.from_dict(json.loads(json.dumps(data)))
    restored.validate()
    assert restored.to_dict() == data
    assert restored.next_deadline() == t.table.next_deadline()


def test_a_restored_table_behaves_as_the_original() -> None:
    t = live(busy_history())
    copy = Harness(LockTable.from_dict(json.loads(json.dumps(t.table.to_dict()))))
    following: list[ev.Event] = [
        ev.Acquire(now=13, group="g", job="b", call_id="1.2", lease_ttl=5.0),
        ev.Yield(
            now=14, group="g", job="a", request_id="ya2", token=1
        ),  # a retry: the first answer
        ev.Acquire(now=15, group="g", job="a", call_id="1.3", request_id="ra"),  # its grant ended
        ev.Acquire(now=16, group="h", job="a", call_id="1.4"),
        ev.KeepAlive(now=17, group="g", job="b", lease_id="lease-2"),
        ev.Acquire(now=18, group="g", job="e", call_id="1.5", wait_deadline=19.0),
        ev.DropWaiter(now=18.5, group="g", job="d", call_id="", reason=ev.Reason.CANCELLED),
    ]
    for event in following:
        outcomes = []
        for table in (t, copy):
            try:
                outcomes.append(table.handle(event))
            except TimeSliceError as exc:
                outcomes.append(type(exc))
        assert outcomes[0] == outcomes[1], event
        assert t.table.to_dict() == copy.table.to_dict()
        assert t.table.next_deadline() == copy.table.next_deadline()
    for now in (19.0, 22.0, 30.0, 60.0, 600.0):
        assert t.run_due(now) == copy.run_due(now)
        assert t.table.to_dict() == copy.table.to_dict()


def test_a_snapshot_does_not_change_with_the_table() -> None:
    t = live(busy_history())
    data = t.table.to_dict()
    frozen = json.dumps(data)
    t.handle(ev.SetHoldLimit(now=20, group="g", max_hold=5.0))
    t.handle(ev.Yield(now=21, group="g", job="b"))
    t.handle(ev.Recover(now=22, grace=1.0))
    assert json.dumps(data) == frozen


def test_replaying_the_journaled_events_rebuilds_the_table() -> None:
    history = busy_history()
    t = live(history)
    journaled: list[ev.Event] = list(history)
    for now in (20.0, 60.0, 600.0):
        while (event := t.table.due(now)) is not None:
            t.handle(event)
            journaled.append(event)
    assert live(journaled).table.to_dict() == t.table.to_dict()


def test_replay_differs_only_in_expiries_moved_by_keep_alive() -> None:
    t = Harness()
    journaled: list[ev.Event] = [
        ev.Acquire(now=0, group="g", job="a", call_id="c1", lease_ttl=10.0),
        ev.Acquire(now=1, group="g", job="b", call_id="c2", lease_ttl=10.0),
    ]
    for event in journaled:
        t.handle(event)
    t.handle(ev.KeepAlive(now=5, group="g", job="a", lease_id="lease-1"))  # not journaled
    replayed = live(journaled).table.to_dict()
    current = t.table.to_dict()
    assert replayed != current
    assert replayed["groups"][0]["holder"]["expires_at"] == 10.0
    assert current["groups"][0]["holder"]["expires_at"] == 15.0
    replayed["groups"][0]["holder"]["expires_at"] = 15.0
    assert replayed == current


# --- policies -------------------------------------------------------------------------


def test_fifo_is_the_default_policy(t: Harness) -> None:
    assert t.table.policy("g") == (ev.Policy.FIFO, 60.0)
    t.acquire("a", now=0)
    t.acquire("b", now=1, priority=1)
    t.acquire("c", now=2, priority=9)
    [_, g] = t.yield_("a", now=3)
    assert g.job == "b"


def test_least_recently_served_goes_first(t: Harness) -> None:
    t.handle(ev.SetPolicy(now=0, group="g", policy=ev.Policy.LRS))
    for i, job in enumerate(["a", "b", "a"]):  # a served at 0 and 20, b at 10
        t.acquire(job, now=i * 10.0)
        t.yield_(job, now=i * 10.0 + 1)
    t.acquire("x", now=30)
    t.acquire("a", now=31)
    t.acquire("b", now=32)
    t.acquire("new", now=33)
    granted = [t.yield_(job, now=40 + i)[1] for i, job in enumerate(["x", "new", "b"])]
    # never served first, then b (served at 10) before a (served at 20)
    assert [g.job for g in granted] == ["new", "b", "a"]


def test_priority_serves_the_highest_first_and_ties_in_queue_order(t: Harness) -> None:
    t.handle(ev.SetPolicy(now=0, group="g", policy=ev.Policy.PRIORITY, aging=1000.0))
    t.acquire("holder", now=0)
    t.acquire("low", now=1, priority=1)
    t.acquire("high", now=2, priority=5)
    t.acquire("high2", now=3, priority=5)
    order = []
    holder = "holder"
    for i in range(3):
        [_, g] = t.yield_(holder, now=4 + i)
        order.append(g.job)
        holder = g.job
    assert order == ["high", "high2", "low"]


def test_priority_ages_so_that_no_waiter_starves(t: Harness) -> None:
    t.handle(ev.SetPolicy(now=0, group="g", policy=ev.Policy.PRIORITY, aging=10.0))
    t.acquire("j0", now=0, priority=5)
    t.acquire("low", now=0, priority=0)
    holder, now = "j0", 0.0
    for i in range(1, 100):
        # a newcomer of priority 5 arrives before every handoff
        t.acquire(f"j{i}", now=now, priority=5)
        now += 1.0
        [_, g] = t.yield_(holder, now=now)
        holder = g.job
        if holder == "low":
            break
    # "low" outranks a fresh 5 once it has waited more than 50 s (aging 10 s a point)
    assert holder == "low" and 50.0 < now <= 52.0


def test_policies_are_validated_and_survive_a_round_trip(t: Harness) -> None:
    t.refuse(ev.SetPolicy(now=0, group="g", policy="random"), InvalidArgumentError)
    t.refuse(
        ev.SetPolicy(now=0, group="g", policy=ev.Policy.PRIORITY, aging=0.0), InvalidArgumentError
    )
    t.handle(ev.SetPolicy(now=0, group="", policy=ev.Policy.LRS))
    t.handle(ev.SetPolicy(now=0, group="g", policy=ev.Policy.PRIORITY, aging=5.0))
    t.acquire("a", now=1)
    t.yield_("a", now=2)
    again = LockTable.from_dict(json.loads(json.dumps(t.table.to_dict())))
    assert again.to_dict() == t.table.to_dict()
    assert again.policy("g") == (ev.Policy.PRIORITY, 5.0)
    assert again.policy("other") == (ev.Policy.LRS, 60.0)
    assert again.groups["g"].last_served == {"a": 1.0}


# --- hold limit with a grace period ---------------------------------------------------


def test_a_holder_at_its_hold_limit_is_asked_to_yield_then_revoked_after_the_grace(
    t: Harness,
) -> None:
    t.handle(ev.SetHoldLimit(now=0, group="g", max_hold=10.0, grace=5.0))
    [granted] = t.acquire("a", now=0.0, lease_ttl=100.0)
    t.acquire("b", now=1.0)
    assert t.table.next_deadline() == 10.0
    assert t.table.due(10.0) == ev.RequestYield(now=10.0, group="g", token=granted.token)
    assert t.run_due(10.0) == [
        ev.YieldRequested(group="g", job="a", token=granted.token, revoke_at=15.0)
    ]
    assert t.holder() == "a" and t.table.next_deadline() == 15.0
    [renewed] = t.handle(
        ev.KeepAlive(now=12.0, group="g", job="a", lease_id=granted.lease.lease_id)
    )
    assert isinstance(renewed, ev.LeaseRenewed) and renewed.yield_requested
    t.ignore(ev.RequestYield(now=13.0, group="g", token=granted.token))  # asked once only
    effects = t.run_due(15.0)
    assert effects[0] == ev.Revoked(
        group="g", job="a", token=granted.token, reason=ev.Reason.HOLD_LIMIT
    )
    assert t.holder() == "b"


def test_a_holder_that_yields_when_asked_is_not_revoked(t: Harness) -> None:
    t.handle(ev.SetHoldLimit(now=0, group="", max_hold=10.0, grace=5.0))
    t.acquire("a", now=0.0)
    t.run_due(10.0)
    t.yield_("a", now=11.0)
    assert t.table.next_deadline() is None and t.state() is GroupState.IDLE_YIELDED


def test_without_a_grace_the_hold_limit_revokes_at_once(t: Harness) -> None:
    t.handle(ev.SetHoldLimit(now=0, group="g", max_hold=10.0))
    [granted] = t.acquire("a", now=0.0)
    assert t.table.due(10.0) == ev.Revoke(
        now=10.0, group="g", token=granted.token, reason=ev.Reason.HOLD_LIMIT
    )


def test_a_negative_grace_is_refused(t: Harness) -> None:
    t.refuse(ev.SetHoldLimit(now=0, group="g", max_hold=10.0, grace=-1.0), InvalidArgumentError)
