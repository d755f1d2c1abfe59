"""Acquires of several groups at once ("bundles") in the pure lock table: granted
all at once or not at all, and never deadlocked, whatever the order of asking,
the policies, the cancellations.

The property test plays random acquires (one group, or several in any order),
releases and cancellations, checks the table's invariants after each step and
that no grant ever gives a bundle only part of its groups; then it drains: every
holder releases, round after round, and every job still waiting must be granted
in the end. A cycle of groups kept for each other would leave waiters forever.
"""

from __future__ import annotations

import itertools

from hypothesis import example, given, settings
from hypothesis import strategies as st

from timeslice.orchestrator import events as ev
from timeslice.orchestrator.state import LockTable

GROUPS = ("g1", "g2", "g3")
JOBS = ("a", "b", "c", "d")

asks = st.lists(st.sampled_from(GROUPS), min_size=1, max_size=3, unique=True)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.sampled_from(JOBS), asks, st.integers(-2, 2)),
        st.tuples(st.just("release"), st.sampled_from(JOBS), st.just([]), st.just(0)),
        st.tuples(st.just("cancel"), st.sampled_from(JOBS), st.just([]), st.just(0)),
    ),
    max_size=40,
)


class Player:
    """Drives a table; knows each job's outstanding call and what it holds."""

    def __init__(self, policies: dict[str, str]) -> None:
        self.table = LockTable()
        self.now = 0.0
        self.calls = itertools.count(1)
        self.asked: dict[str, tuple[str, tuple[str, ...]]] = {}  # job -> (call, groups)
        self.holds: dict[str, set[str]] = {job: set() for job in JOBS}
        for group, policy in policies.items():
            self.step(ev.SetPolicy(now=0.0, group=group, policy=policy, aging=5.0))

    def step(self, event: ev.Event) -> list[ev.Effect]:
        self.now += 1.0
        effects = self.table.handle(event)
        self.table.validate()
        for effect in effects:
            if isinstance(effect, ev.Granted):
                self.holds[effect.job].add(effect.group)
        granted = {e.job for e in effects if isinstance(e, ev.Granted)}
        for job in granted:
            call, groups = self.asked[job]
            # all of its groups, in this very step: never a part of a bundle
            assert self.holds[job] >= set(groups), (job, groups, self.holds[job])
            del self.asked[job]
        for effect in effects:
            if isinstance(effect, ev.LeftQueue) and effect.job in self.asked:
                del self.asked[effect.job]
        return effects

    def acquire(self, job: str, groups: list[str], priority: int) -> None:
        if job in self.asked or self.holds[job]:
            return  # one call at a time, and nothing held while asking
        call = f"call-{next(self.calls)}"
        self.asked[job] = (call, tuple(groups))
        first, *more = groups
        self.step(
            ev.Acquire(
                now=self.now,
                group=first,
                job=job,
                call_id=call,
                priority=priority,
                more_groups=tuple(more),
            )
        )

    def release(self, job: str) -> None:
        for group in sorted(self.holds[job]):
            self.step(ev.Yield(now=self.now, group=group, job=job))
            self.holds[job].discard(group)

    def cancel(self, job: str) -> None:
        if job in self.asked:
            call, groups = self.asked[job]
            self.step(
                ev.DropWaiter(
                    now=self.now, group=groups[0], job=job, call_id=call, reason=ev.Reason.CANCELLED
                )
            )
            assert job not in self.asked or not any(
                job in self.table.groups[g].queue for g in groups
            )
            self.asked.pop(job, None)


@settings(max_examples=300, deadline=None)
@given(
    steps=steps,
    policies=st.fixed_dictionaries({g: st.sampled_from(tuple(ev.Policy)) for g in GROUPS}),
)
def test_bundles_are_granted_whole_and_every_waiter_is_served_in_the_end(
    steps: list[tuple[str, str, list[str], int]], policies: dict[str, str]
) -> None:
    player = Player(policies)
    for action, job, groups, priority in steps:
        if action == "acquire":
            player.acquire(job, groups, priority)
        elif action == "release":
            player.release(job)
        else:
            player.cancel(job)
    # Drain: holders keep releasing; nobody asks anew. Every waiter gets its turn.
    for _ in range(len(JOBS) * 3):
        if not player.asked:
            break
        for job in JOBS:
            player.release(job)
    assert player.asked == {}, f"left waiting: {player.asked}; table: {player.table.to_dict()}"
    for group in player.table.groups.values():
        assert not group.queue


class OrderedPlayer(Player):
    """Also plays jobs that ask for their groups one at a time, in name order, holding
    the earlier ones while they wait (the lock order of v1alpha1 clients)."""

    def acquire_next(self, job: str, group: str) -> None:
        held = self.holds[job]
        if job in self.asked or not held or group <= max(held):
            return  # only after what it holds, in order
        call = f"call-{next(self.calls)}"
        self.asked[job] = (call, (group,))
        self.step(ev.Acquire(now=self.now, group=group, job=job, call_id=call))

    def step(self, event: ev.Event) -> list[ev.Effect]:
        # A job granted one more group holds the earlier ones still.
        self.now += 1.0
        effects = self.table.handle(event)
        self.table.validate()
        granted = [e for e in effects if isinstance(e, ev.Granted)]
        for effect in granted:
            self.holds[effect.job].add(effect.group)
        for job in {e.job for e in granted}:
            call, groups = self.asked.pop(job)
            assert self.holds[job] >= set(groups), (job, groups)  # a bundle: all at once
        for effect in effects:
            if isinstance(effect, ev.LeftQueue):
                self.asked.pop(effect.job, None)
        return effects


ordered_steps = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.sampled_from(JOBS), asks),
        st.tuples(
            st.just("next"),
            st.sampled_from(JOBS),
            st.lists(st.sampled_from(GROUPS), min_size=1, max_size=1),
        ),
        st.tuples(st.just("release"), st.sampled_from(JOBS), st.just([])),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@example(  # b holds g1; a asks g1 and g2 at once; b asks g2, kept for a
    steps=[("acquire", "b", ["g1"]), ("acquire", "a", ["g1", "g2"]), ("next", "b", ["g2"])],
    policies=dict.fromkeys(GROUPS, ev.Policy.FIFO),
)
@given(
    steps=ordered_steps,
    policies=st.fixed_dictionaries({g: st.sampled_from(tuple(ev.Policy)) for g in GROUPS}),
)
def test_bundles_and_jobs_that_hold_while_they_ask_in_order_never_deadlock(
    steps: list[tuple[str, str, list[str]]], policies: dict[str, str]
) -> None:
    player = OrderedPlayer(policies)
    for action, job, groups in steps:
        if action == "acquire":
            player.acquire(job, groups, 0)
        elif action == "next":
            player.acquire_next(job, groups[0])
        elif job not in player.asked:
            player.release(job)
    # Drain: a job that waits keeps what it holds; the others release. A cycle of
    # waits (a group kept for a bundle whose other group a waiter of it holds)
    # would leave jobs waiting forever.
    for _ in range(len(JOBS) * 3):
        if not player.asked:
            break
        for job in JOBS:
            if job not in player.asked:
                player.release(job)
    assert player.asked == {}, f"left waiting: {player.asked}; table: {player.table.to_dict()}"
