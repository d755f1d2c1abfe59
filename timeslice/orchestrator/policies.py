"""Which waiter a free group serves next: the group's policy, and the rule that
keeps acquires of several groups at once ("bundles") free of deadlock.

Policies (per group, `SetPolicy`):
- FIFO: the earliest queued.
- LRS (least recently served): the job granted the group longest ago, never
  served first; ties in queue order.
- PRIORITY: the highest priority, where every `aging` seconds waited adds one,
  so that a low priority waiter is served in the end.

Bundles. A job that asks for several groups at once waits in each of their
queues and is granted all of them in one step, or none. A group whose policy
picks a bundle waiter is kept for the *oldest* bundle waiter in its queue (by
ticket, a number that only grows across the whole table) until every group of
that bundle is free for it. The oldest bundle waiter of all is therefore, in
each of its groups, either waiting behind single waiters (who hold one group
each and give it back) or the one its group is kept for: it is granted once
those holders yield, and no cycle of groups kept for each other can form,
whatever order jobs ask in.

A job may also hold some groups while it asks for one more (v1alpha1 clients
take their groups one by one, in a fixed order). A group is never kept for a
bundle while a waiter of it holds another group of that bundle: that waiter is
served first (the lock table's `_chosen`), since the bundle could not be
granted before it gives its group back, nor could it give it back before it is
served.
"""

from __future__ import annotations

from collections.abc import Iterable

from timeslice.orchestrator import events as ev
from timeslice.orchestrator.model import Group, Waiter


def policy_pick(g: Group, policy: ev.Policy, aging: float, now: float) -> Waiter:
    """The waiter `g`'s policy serves next (the queue must not be empty)."""
    waiters = list(g.queue.values())
    if policy is ev.Policy.LRS:
        # Never served goes first; min keeps queue order among equals.
        return min(waiters, key=lambda w: g.last_served.get(w.job, float("-inf")))
    if policy is ev.Policy.PRIORITY:
        return max(waiters, key=lambda w: w.priority + (now - w.since) / aging)
    return waiters[0]


def chosen(g: Group, policy: ev.Policy, aging: float, now: float) -> Waiter:
    """The waiter `g` is served to or kept for: the policy's pick, or, when that is
    a bundle, the oldest bundle waiter of the group."""
    pick = policy_pick(g, policy, aging, now)
    if not pick.bundle:
        return pick
    return min((w for w in g.queue.values() if w.bundle), key=lambda w: w.ticket)


def bundle_ready(waiter: Waiter, groups: Iterable[Group], picks: Iterable[Waiter]) -> bool:
    """Whether every group of `waiter`'s bundle is free and chosen for it."""
    return all(g.holder is None for g in groups) and all(p.job == waiter.job for p in picks)
