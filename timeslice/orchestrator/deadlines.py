"""When the lock table's time-driven transitions fall due: a lease running out, a
hold limit, a grant nobody claimed, a wait limit, a waiter that never came back
after a start.

The table does not act on time by itself. It keeps a heap of (deadline, group,
key) entries, pushed whenever a deadline may have moved and checked lazily: an
entry is current only while it still matches what its holder or waiter says
now. The shell reads `next_deadline()`, sets one timer, and at that time feeds
`due(now)` back through `handle`, so the journal records a time-driven decision
like any other.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Callable

from timeslice.orchestrator import events as ev
from timeslice.orchestrator.model import Group, HoldLimit, Waiter

HOLDER = ""  # the key of a group's holder; a waiter's key is its job id


class Due(enum.Enum):
    """What falls due for a holder, besides its revocation."""

    ASK_TO_YIELD = "ask to yield"  # the hold limit with a grace: ask before revoking


Deadline = tuple[float, ev.Reason | Due]


def holder_deadlines(g: Group, hold: HoldLimit) -> list[Deadline]:
    """Every deadline of `g`'s holder under its hold limit `hold`."""
    h = g.holder
    if h is None or h.switching:
        return []  # a switch is bounded by the shell's deadline; the lease starts after
    found: list[Deadline] = []
    if h.expires_at is not None:
        found.append((h.expires_at, ev.Reason.LEASE_EXPIRED))
    if hold.max_hold is not None:
        if hold.grace > 0 and not h.yield_requested:
            found.append((h.granted_at + hold.max_hold, Due.ASK_TO_YIELD))
        found.append((h.granted_at + hold.max_hold + hold.grace, ev.Reason.HOLD_LIMIT))
    if h.claim_deadline is not None:
        found.append((h.claim_deadline, ev.Reason.NOT_DELIVERED))
    return found


def waiter_deadlines(w: Waiter) -> list[Deadline]:
    """Every deadline of a waiter."""
    found: list[Deadline] = []
    if w.wait_deadline is not None:
        found.append((w.wait_deadline, ev.Reason.WAIT_TIMEOUT))
    if w.reclaim_deadline is not None:
        found.append((w.reclaim_deadline, ev.Reason.NOT_RECLAIMED))
    return found


def earliest(found: list[Deadline]) -> Deadline | None:
    """The first of `found` (None if there is none); of two at once, the first by
    name."""
    return min(found, key=lambda d: (d[0], d[1].value)) if found else None


class Timers:
    """A lazy heap of deadlines; `current(group, key)` says what one is now."""

    def __init__(self, current: Callable[[str, str], Deadline | None]) -> None:
        self._current = current
        self._heap: list[tuple[float, str, str]] = []

    def arm(self, group: str, key: str) -> None:
        """Note that the deadline of `key` in `group` may have moved."""
        if (d := self._current(group, key)) is not None:
            heapq.heappush(self._heap, (d[0], group, key))

    def next(self) -> tuple[float, str, str] | None:
        """The earliest current (deadline, group, key), stale entries dropped."""
        while self._heap:
            at, group, key = self._heap[0]
            now = self._current(group, key)
            if now is not None and now[0] == at:
                return self._heap[0]
            heapq.heappop(self._heap)
        return None
