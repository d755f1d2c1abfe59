"""The Acquire calls waiting for a grant, and what undoes one whose caller left.

An Acquire is journaled with the id of its call; the table then answers it with
effects naming that id (`Granted`, `LeftQueue`, `Superseded`, a `Revoked` of a
grant whose switch failed). `WaitingCalls` is where those answers find the
caller's future. A call that goes away (cancelled, or a bundle that failed part
way) must give back what it holds and leave the queues: `rollback` says which
events do that.
"""

from __future__ import annotations

import asyncio
import itertools

from timeslice.errors import CancelledError, ConflictError, DeadlineExceededError, TimeSliceError
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.events import Reason
from timeslice.orchestrator.state import LockTable


class Call:
    """One waiting Acquire: the groups it asks for, and the grants it has so far."""

    def __init__(self, call_id: str, job: str, groups: tuple[str, ...]) -> None:
        self.call_id, self.job, self.groups = call_id, job, groups
        self.grants: dict[str, ev.Granted] = {}
        self.future: asyncio.Future[list[ev.Granted]] = asyncio.get_running_loop().create_future()

    def granted(self, grant: ev.Granted) -> None:
        self.grants[grant.group] = grant
        if len(self.grants) == len(self.groups) and not self.future.done():
            self.future.set_result([self.grants[g] for g in self.groups])


class WaitingCalls:
    """Every Acquire call in flight, by call id."""

    def __init__(self) -> None:
        self._calls: dict[str, Call] = {}
        self._ids = itertools.count(1)

    def open(self, epoch: int, job: str, groups: tuple[str, ...]) -> Call:
        """A new call of `job` for `groups`; its id is unique across epochs."""
        call = Call(f"{epoch}.{next(self._ids)}", job, groups)
        self._calls[call.call_id] = call
        return call

    def close(self, call: Call) -> None:
        """`call` is answered or gone."""
        self._calls.pop(call.call_id, None)

    def deliver(self, grant: ev.Granted) -> bool:
        """Hand `grant` to its call; False if that call is gone."""
        call = self._calls.get(grant.call_id)
        if call is None:
            return False
        call.granted(grant)
        return True

    def fail(self, call_id: str, error: TimeSliceError) -> None:
        """Fail the call `call_id`, if it still waits."""
        call = self._calls.get(call_id)
        if call is not None and not call.future.done():
            call.future.set_exception(error)

    def fail_all(self, error: TimeSliceError) -> None:
        """Fail every call still waiting."""
        for call in self._calls.values():
            if not call.future.done():
                call.future.set_exception(error)


def left_queue_error(effect: ev.LeftQueue) -> TimeSliceError:
    """What the caller of a waiter that left the queue is told."""
    match effect.reason:
        case Reason.WAIT_TIMEOUT:
            return DeadlineExceededError(f"not granted {effect.group} in time")
        case Reason.QUARANTINED:
            return ConflictError(f"job {effect.job} is {effect.why}")
    return CancelledError(f"left the queue of {effect.group}: {effect.why}")


def rollback(call: Call, table: LockTable, now: float) -> list[ev.Event]:
    """The events that undo what `call` got, its caller gone: each grant it was
    delivered and nobody had yet is revoked, a grant still switching for it too,
    and it leaves the queues where it still waits."""
    events: list[ev.Event] = []
    for group in call.groups:
        grant = call.grants.get(group)
        g = table.groups.get(group)
        h = g.holder if g is not None else None
        token: int | None = None
        if grant is not None:
            token = grant.token if grant.must_deliver else None
        elif h is not None and h.call_id == call.call_id and h.switching:
            token = h.token
        else:
            events.append(
                ev.DropWaiter(
                    now=now,
                    group=group,
                    job=call.job,
                    call_id=call.call_id,
                    reason=Reason.CANCELLED,
                )
            )
        if token is not None:
            events.append(
                ev.Revoke(
                    now=now,
                    group=group,
                    token=token,
                    reason=Reason.NOT_DELIVERED,
                    call_id=call.call_id,
                )
            )
    return events
