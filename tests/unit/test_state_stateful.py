"""The lock table under random sequences of events, against a small model.

The model keeps, per group, the holder and the queue in the order jobs joined
it, and the newest token. Every effect the table returns is checked against
the model before the model follows it.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from timeslice.errors import (
    DeadlineExceededError,
    LeaseLostError,
    NotFoundError,
    NotHolderError,
    TimeSliceError,
)
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.state import LockTable

GROUPS = ("g1", "g2", "g3")
JOBS = ("a", "b", "c", "d", "e")

groups = st.sampled_from(GROUPS)
jobs = st.sampled_from(JOBS)
lease_ttls = st.one_of(st.none(), st.sampled_from([1.0, 5.0, 20.0]))
wait_limits = st.one_of(st.none(), st.sampled_from([0.0, 2.0, 10.0, 40.0]))


class LockTableMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.table = LockTable()
        self.now = 0.0
        self.holder: dict[str, str | None] = dict.fromkeys(GROUPS)
        self.queue: dict[str, list[str]] = {g: [] for g in GROUPS}
        self.call: dict[tuple[str, str], str] = {}  # a waiter's or holder's current call
        self.newest: dict[str, int] = dict.fromkeys(GROUPS, 0)
        self.tokens_seen: dict[str, list[int]] = {g: [] for g in GROUPS}
        self.request_ids: list[str] = []
        self.counter = 0

    # --- helpers ----------------------------------------------------------------------

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{self.table.epoch}.{prefix}{self.counter}"

    def request_id(self, kind: str, reuse: int | None) -> str:
        if reuse is not None and self.request_ids:
            return self.request_ids[reuse % len(self.request_ids)]
        rid = self.fresh(kind)
        self.request_ids.append(rid)
        return rid

    def apply(self, event: ev.Event) -> list[ev.Effect] | TimeSliceError:
        """Handle `event` and follow its effects; a refusal is returned, after checking
        that it changed nothing."""
        before = self.table.to_dict()
        deadline = self.table.next_deadline()
        try:
            effects = self.table.handle(event)
        except TimeSliceError as exc:
            assert self.table.to_dict() == before, (event, exc)
            assert self.table.next_deadline() == deadline
            return exc
        self.follow(effects)
        return effects

    def follow(self, effects: list[ev.Effect]) -> None:
        """Check each effect against the model, then update the model."""
        for e in effects:
            match e:
                case ev.Granted():
                    self.follow_grant(e)
                case ev.Queued():
                    q = self.queue[e.group]
                    assert self.holder[e.group] is not None, e
                    assert self.holder[e.group] != e.job, e
                    if e.job not in q:
                        q.append(e.job)
                    assert e.position == q.index(e.job), (e, q)
                    self.call[e.group, e.job] = e.call_id
                case ev.LeftQueue():
                    assert e.job in self.queue[e.group], (e, self.queue[e.group])
                    self.queue[e.group].remove(e.job)
                case ev.Yielded():
                    assert self.holder[e.group] == e.job, e
                    assert e.token == self.newest[e.group], e
                    assert e.pending_waiters == len(self.queue[e.group])
                    assert e.snapshot_deferred == (not self.queue[e.group])
                    assert e.next_job == (self.queue[e.group] or [""])[0]
                    self.holder[e.group] = None
                case ev.Revoked():
                    assert self.holder[e.group] == e.job, e
                    assert e.token == self.newest[e.group], e
                    self.holder[e.group] = None
                case ev.Superseded():
                    assert e.job in self.queue[e.group] or self.holder[e.group] == e.job, e
                case ev.LeaseRenewed():
                    assert self.holder[e.group] == e.job, e
                    assert e.token == self.newest[e.group], e
                case _:
                    raise AssertionError(f"unexpected effect {e!r}")

    def follow_grant(self, e: ev.Granted) -> None:
        g = e.group
        self.call[g, e.job] = e.call_id
        if self.holder[g] == e.job:  # re-entrant: the same grant
            assert e.token == self.newest[g], e
            return
        assert self.holder[g] is None, (e, self.holder[g])
        if self.queue[g]:
            # from the queue: always its first waiter
            assert e.job == self.queue[g][0], (e, self.queue[g])
            self.queue[g].pop(0)
        assert e.token > self.newest[g], (e, self.newest[g])
        assert all(e.token > t for t in self.tokens_seen[g])
        self.tokens_seen[g].append(e.token)
        self.newest[g] = e.token
        self.holder[g] = e.job

    def current_token(self, group: str, job: str) -> int | None:
        return self.newest[group] if self.holder[group] == job else None

    # --- rules ------------------------------------------------------------------------

    @initialize(lease_ttl=lease_ttls)
    def two_groups_in_use(self, lease_ttl: float | None) -> None:
        """Most runs would otherwise spend their first steps on unknown groups; the
        last group stays unknown until some Acquire names it."""
        for group in GROUPS[:2]:
            self.apply(ev.Acquire(self.now, group, "a", self.fresh("call"), "", lease_ttl))

    @rule(
        group=groups,
        job=jobs,
        lease_ttl=lease_ttls,
        wait=wait_limits,
        with_request=st.booleans(),
        reuse=st.one_of(st.none(), st.integers(0, 50)),
    )
    def acquire(
        self,
        group: str,
        job: str,
        lease_ttl: float | None,
        wait: float | None,
        with_request: bool,
        reuse: int | None,
    ) -> None:
        rid = self.request_id("acq", reuse) if with_request else ""
        deadline = None if wait is None else self.now + wait
        event = ev.Acquire(self.now, group, job, self.fresh("call"), rid, lease_ttl, deadline)
        there = self.holder[group] == job or job in self.queue[group]
        busy = self.holder[group] is not None
        earlier = self.table.recent.get(rid) if rid else None
        outcome = self.apply(event)
        if isinstance(outcome, LeaseLostError):
            assert earlier is not None and not isinstance(earlier, ev.Yielded), earlier
            return
        late = wait == 0.0 and busy and not there
        if late:
            assert isinstance(outcome, DeadlineExceededError), outcome
            return
        assert isinstance(outcome, list), outcome
        assert [type(e) for e in outcome if not isinstance(e, ev.Superseded)] in (
            [ev.Granted],
            [ev.Queued],
        ), outcome

    @rule(group=groups, job=jobs)
    def acquire_past_deadline(self, group: str, job: str) -> None:
        """On a busy group, from a job not already there: refused, nothing changes."""
        h = self.holder[group]
        if h is None or h == job or job in self.queue[group]:
            return
        before = self.table.to_dict()
        event = ev.Acquire(self.now, group, job, self.fresh("call"), "", None, self.now)
        try:
            self.table.handle(event)
        except DeadlineExceededError:
            pass
        else:
            raise AssertionError("a passed wait deadline on a busy group was accepted")
        assert self.table.to_dict() == before

    def held(self) -> list[str]:
        return [g for g in GROUPS if self.holder[g] is not None]

    @precondition(lambda self: self.held())
    @rule(
        pick=st.integers(0, 2),
        token=st.sampled_from(["none", "current", "stale"]),
        reuse=st.one_of(st.none(), st.integers(0, 50)),
    )
    def holder_yields(self, pick: int, token: str, reuse: int | None) -> None:
        group = self.held()[pick % len(self.held())]
        holder = self.holder[group]
        assert holder is not None
        self.yield_(group, holder, token, reuse)

    @rule(
        group=groups,
        job=jobs,
        token=st.sampled_from(["none", "current", "stale"]),
        reuse=st.one_of(st.none(), st.integers(0, 50)),
    )
    def yield_(self, group: str, job: str, token: str, reuse: int | None) -> None:
        rid = self.request_id("yield", reuse)
        current = self.current_token(group, job)
        fencing = {
            "none": None,
            "current": current,
            "stale": max(self.newest[group] - 1, 0),
        }[token]
        earlier = self.table.recent.get(rid)
        before = self.table.to_dict()
        known = group in self.table.groups
        try:
            effects = self.table.handle(ev.Yield(self.now, group, job, rid, fencing))
        except NotFoundError:
            assert not known
            assert self.table.to_dict() == before
            return
        except (NotHolderError, LeaseLostError):
            assert not isinstance(earlier, ev.Yielded)
            assert current is None or (token == "stale"), (group, job, token)
            assert self.table.to_dict() == before
            return
        if isinstance(earlier, ev.Yielded):
            assert effects == [earlier]
            assert self.table.to_dict() == before
            return
        assert current is not None and token != "stale"
        self.follow(effects)

    @precondition(lambda self: self.held())
    @rule(pick=st.integers(0, 2))
    def holder_keeps_alive(self, pick: int) -> None:
        group = self.held()[pick % len(self.held())]
        holder = self.holder[group]
        assert holder is not None
        self.keep_alive(group, holder)

    @rule(group=groups, job=jobs)
    def keep_alive(self, group: str, job: str) -> None:
        token = self.current_token(group, job)
        lease_id = f"lease-{token if token is not None else 0}"
        outcome = self.apply(ev.KeepAlive(self.now, group, job, lease_id))
        if token is not None:
            assert isinstance(outcome, list) and isinstance(outcome[0], ev.LeaseRenewed)
        elif group in self.table.groups:
            assert isinstance(outcome, LeaseLostError), outcome
        else:
            assert isinstance(outcome, NotFoundError), outcome

    @rule(group=groups, job=jobs, stale=st.booleans())
    def drop_waiter(self, group: str, job: str, stale: bool) -> None:
        call = "stale-call" if stale else self.call.get((group, job), "")
        queued = job in self.queue[group]
        effects = self.apply(ev.DropWaiter(self.now, group, job, call, ev.REASON_CANCELLED))
        if queued and not stale:
            assert effects == [ev.LeftQueue(group, job, call, ev.REASON_CANCELLED)]
        else:
            assert effects == []

    @rule(group=groups, offset=st.integers(-2, 1), stale_call=st.booleans())
    def revoke(self, group: str, offset: int, stale_call: bool) -> None:
        """The shell could not answer the holder's call (offset 0), or a Revoke of a
        grant that has ended already, or of its call after it was superseded."""
        h = self.table.groups[group].holder if group in self.table.groups else None
        token = self.newest[group] + offset
        call = "stale-call" if stale_call else (h.call_id if h else "")
        before = self.table.to_dict()
        effects = self.apply(ev.Revoke(self.now, group, token, ev.REASON_NOT_DELIVERED, call))
        if h is not None and offset == 0 and not stale_call:
            assert isinstance(effects, list), effects
            assert effects[0] == ev.Revoked(group, h.job, token, ev.REASON_NOT_DELIVERED)
        else:
            assert effects == []
            assert self.table.to_dict() == before

    @rule(group=groups, job=st.one_of(st.just(""), jobs))
    def force_release(self, group: str, job: str) -> None:
        h, token = self.holder[group], self.newest[group]
        outcome = self.apply(ev.ForceRelease(self.now, group, job))
        if group not in self.table.groups:
            assert isinstance(outcome, NotFoundError), outcome
        elif h is None or job not in ("", h):
            assert isinstance(outcome, NotHolderError), outcome
        else:
            assert isinstance(outcome, list) and outcome[0] == ev.Revoked(
                group, h, token, ev.REASON_OPERATOR
            ), outcome

    @rule(group=st.sampled_from(("",) + GROUPS), limit=st.sampled_from([None, 3.0, 30.0]))
    def set_hold_limit(self, group: str, limit: float | None) -> None:
        assert self.apply(ev.SetHoldLimit(self.now, group, limit)) == []

    @rule(dt=st.sampled_from([0.0, 0.5, 1.0, 3.0, 10.0, 50.0]))
    def advance(self, dt: float) -> None:
        self.now += dt
        for _ in range(1000):
            event = self.table.due(self.now)
            if event is None:
                break
            effects = self.apply(event)
            assert isinstance(effects, list) and effects, f"due() gave {event!r}: no effect"
        else:
            raise AssertionError("due() never ran dry")
        nxt = self.table.next_deadline()
        assert nxt is None or nxt > self.now

    @rule(grace=st.sampled_from([1.0, 5.0, 20.0]))
    def recover(self, grace: float) -> None:
        epoch = self.table.epoch
        assert self.apply(ev.Recover(self.now, grace)) == []
        assert self.table.epoch == epoch + 1
        for g in GROUPS:
            for job in self.queue[g]:
                self.call[g, job] = ""

    @precondition(lambda self: self.table.groups)
    @rule()
    def snapshot_round_trip(self) -> None:
        data = self.table.to_dict()
        deadline = self.table.next_deadline()
        self.table = LockTable.from_dict(json.loads(json.dumps(data)))
        assert self.table.to_dict() == data
        assert self.table.next_deadline() == deadline

    # --- invariants -------------------------------------------------------------------

    @invariant()
    def table_is_valid(self) -> None:
        self.table.validate()

    @invariant()
    def table_matches_the_model(self) -> None:
        for name in GROUPS:
            g = self.table.groups.get(name)
            if g is None:
                assert self.holder[name] is None and not self.queue[name]
                assert self.newest[name] == 0
                continue
            assert (g.holder.job if g.holder else None) == self.holder[name]
            # no waiter lost, none invented, in the order they came
            assert list(g.queue) == self.queue[name]
            assert g.token == self.newest[name]
            for job, w in g.queue.items():
                assert w.call_id == self.call[name, job]


TestLockTable = LockTableMachine.TestCase
TestLockTable.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
