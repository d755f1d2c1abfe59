"""The lock table under random sequences of events, against a small model.

The model keeps, per group, the holder and the queue in the order jobs joined
it, the newest token, the group's nodes, whether a switch is running, which
jobs are quarantined, and which job's context is active and which is loaded.
Every effect the table returns is checked against the model before the model
follows it.
"""

from __future__ import annotations

import dataclasses
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
    ConflictError,
    DeadlineExceededError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    NotHolderError,
    PermissionDeniedError,
    TimeSliceError,
)
from timeslice.kinds import Liveness
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.state import LockTable

GROUPS = ("g1", "g2", "g3")
JOBS = ("a", "b", "c", "d", "e")

groups = st.sampled_from(GROUPS)
jobs = st.sampled_from(JOBS)
lease_ttls = st.one_of(st.none(), st.sampled_from([1.0, 5.0, 20.0]))
wait_limits = st.one_of(st.none(), st.sampled_from([0.0, 2.0, 10.0, 40.0]))
node_lists = st.sampled_from([(), ("n1",), ("n1", "n2"), ("10.0.0.1:7070", "gpu-02.rack")])
bad_node_lists = st.sampled_from([("n1", "n1"), ("n1", "bad node"), ("-n1",)])
# A fault names a job by index into [*queue, target, *JOBS]: waiters are faulted often.
fault_picks = st.lists(
    st.tuples(st.integers(0, 9), st.sampled_from(["xid 79", "ecc error"])), max_size=2
)
faults = st.lists(st.tuples(jobs, st.sampled_from(["xid 79", "ecc error"])), max_size=2)


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
        self.since: dict[tuple[str, str], float] = {}  # when a waiter or holder joined
        self.nodes: dict[str, tuple[str, ...]] = dict.fromkeys(GROUPS, ())
        self.switching: dict[str, bool] = dict.fromkeys(GROUPS, False)
        self.quarantined: dict[str, dict[str, str]] = {g: {} for g in GROUPS}
        self.active: dict[str, str] = dict.fromkeys(GROUPS, "")
        self.loaded: dict[str, str] = dict.fromkeys(GROUPS, "")
        self.previous: dict[str, str] = dict.fromkeys(GROUPS, "")  # active before the grant
        # A grant nobody has claimed yet, and the (waited, restored) it was made with.
        self.unclaimed: dict[str, bool] = dict.fromkeys(GROUPS, False)
        self.made: dict[str, tuple[float, bool]] = {}
        # The lease secret a waiter's or holder's grant has (each job acquires as
        # principal "p-<job>").
        self.secret: dict[tuple[str, str], str] = {}

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
                case ev.SwitchStarted():
                    assert e.previous == self.loaded[e.group], (e, self.loaded[e.group])
                    self.start_grant(e.group, e.job, e.token, switch=True)
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
                    if e.reason is ev.Reason.QUARANTINED:
                        assert e.job in self.quarantined[e.group], e
                    self.queue[e.group].remove(e.job)
                case ev.Yielded():
                    assert self.holder[e.group] == e.job, e
                    assert not self.switching[e.group], e
                    assert e.token == self.newest[e.group], e
                    assert e.pending_waiters == len(self.queue[e.group])
                    assert e.snapshot_deferred == (not self.queue[e.group])
                    assert e.next_job == (self.queue[e.group] or [""])[0]
                    self.holder[e.group] = None
                case ev.Revoked():
                    g = e.group
                    assert self.holder[g] == e.job, e
                    assert e.token == self.newest[g], e
                    if self.switching[g]:
                        # the waiting call fails; no context is known live
                        assert e.call_id == self.call[g, e.job], e
                        self.switching[g] = False
                        self.loaded[g] = self.active[g] = ""
                    else:
                        assert e.call_id == "", e
                        if e.reason == ev.Reason.NOT_DELIVERED and not self.nodes[g]:
                            self.active[g] = self.loaded[g] = self.previous[g]
                    self.holder[g] = None
                case ev.Superseded():
                    assert e.job in self.queue[e.group] or self.holder[e.group] == e.job, e
                case ev.LeaseRenewed():
                    assert self.holder[e.group] == e.job, e
                    assert e.token == self.newest[e.group], e
                    assert not self.switching[e.group], e
                    self.unclaimed[e.group] = False
                case ev.Quarantined():
                    assert e.job not in self.quarantined[e.group], e
                    assert e.job != self.holder[e.group] or self.switching[e.group], e
                    self.quarantined[e.group][e.job] = e.reason
                case ev.JobReset():
                    assert e.job in self.quarantined[e.group], e
                    del self.quarantined[e.group][e.job]
                case _:
                    raise AssertionError(f"unexpected effect {e!r}")

    def follow_grant(self, e: ev.Granted) -> None:
        g = e.group
        # every grant, re-entrant ones too, starts its lease now
        assert e.lease.expires_at == (self.now + e.lease.ttl if e.lease.ttl else None), e
        if self.holder[g] == e.job and self.switching[g]:  # the switch is done
            assert e.token == self.newest[g], e
            assert e.call_id == self.call[g, e.job], e
            assert e.waited == self.now - self.since[g, e.job], e
            assert e.must_deliver, e
            self.switching[g] = False
            self.loaded[g] = e.job
            self.made[g] = (e.waited, e.context_restored)
            self.unclaimed[g] = not e.call_id
            return
        self.call[g, e.job] = e.call_id
        if self.holder[g] == e.job:  # re-entrant: the same grant
            assert e.token == self.newest[g], e
            # claiming a grant nobody had taken: it is told as it was made
            assert e.must_deliver == self.unclaimed[g], e
            made = self.made[g] if self.unclaimed[g] else (0.0, False)
            assert (e.waited, e.context_restored, e.switch_bytes) == (*made, 0), e
            self.unclaimed[g] = False
            return
        self.start_grant(g, e.job, e.token, switch=False)
        assert e.waited == self.now - self.since[g, e.job], e
        assert (e.context_restored, e.must_deliver, e.switch_bytes) == (False, True, 0), e
        self.loaded[g] = e.job
        self.made[g] = (e.waited, False)
        self.unclaimed[g] = not e.call_id

    def start_grant(self, g: str, job: str, token: int, switch: bool) -> None:
        """A new grant (switching or not) of `g` to `job`."""
        assert self.holder[g] is None, (g, job, self.holder[g])
        if self.queue[g]:
            # from the queue: always its first waiter
            assert job == self.queue[g][0], (job, self.queue[g])
            self.queue[g].pop(0)
        assert job not in self.quarantined[g], (g, job)
        # a switch exactly when the group spans nodes and the job's context is not loaded
        assert switch == (bool(self.nodes[g]) and job != self.loaded[g]), (g, job, switch)
        assert token > self.newest[g], (token, self.newest[g])
        assert all(token > t for t in self.tokens_seen[g])
        self.tokens_seen[g].append(token)
        self.newest[g] = token
        self.holder[g] = job
        self.switching[g] = switch
        self.previous[g] = self.active[g]
        self.active[g] = job

    def acquire_event(self, e: ev.Acquire) -> list[ev.Effect] | TimeSliceError:
        """Apply an Acquire, and learn what no effect tells: when the job joined (for
        the wait its grant reports), and the call a switching grant waits on."""
        holding = self.holder[e.group] == e.job
        if not holding and e.job not in self.queue[e.group]:
            self.since[e.group, e.job] = e.now  # unused unless it joins
        outcome = self.apply(e)
        if isinstance(outcome, list) and not holding:
            # a new waiter or grant takes its call's secret, a waiter re-attached too;
            # a holder asking again keeps the lease it has
            self.secret[e.group, e.job] = e.lease_secret
        if isinstance(outcome, list) and self.holder[e.group] == e.job and self.switching[e.group]:
            self.call[e.group, e.job] = e.call_id
        return outcome

    def current_token(self, group: str, job: str) -> int | None:
        return self.newest[group] if self.holder[group] == job else None

    # --- rules ------------------------------------------------------------------------

    @initialize(lease_ttl=lease_ttls, with_nodes=st.sampled_from([(), GROUPS[:1], GROUPS]))
    def two_groups_in_use(self, lease_ttl: float | None, with_nodes: tuple[str, ...]) -> None:
        """Most runs would otherwise spend their first steps on unknown groups; the
        last group stays unknown until some Acquire names it. Some groups span nodes
        from the start, so that their first grant switches."""
        for group in with_nodes:
            self.set_group_nodes(group, ("n1", "n2"))
        for group in GROUPS[:2]:
            event = ev.Acquire(
                now=self.now,
                group=group,
                job="a",
                call_id=self.fresh("call"),
                request_id="",
                lease_ttl=lease_ttl,
                principal="p-a",
                lease_secret=self.fresh("s"),
            )
            assert isinstance(self.acquire_event(event), list)

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
        event = ev.Acquire(
            now=self.now,
            group=group,
            job=job,
            call_id=self.fresh("call"),
            request_id=rid,
            lease_ttl=lease_ttl,
            wait_deadline=deadline,
            principal=f"p-{job}",
            lease_secret=self.fresh("s"),
        )
        holding = self.holder[group] == job
        there = holding or job in self.queue[group]
        busy = self.holder[group] is not None
        earlier = self.table.answered("acquire", group, job, rid)
        outcome = self.acquire_event(event)
        if isinstance(outcome, LeaseLostError):
            assert earlier is not None and not isinstance(earlier, ev.Yielded), earlier
            return
        if job in self.quarantined[group]:
            assert type(outcome) is ConflictError, outcome
            return
        late = wait == 0.0 and busy and not there
        if late:
            assert isinstance(outcome, DeadlineExceededError), outcome
            return
        assert isinstance(outcome, list), outcome
        kinds = [type(e) for e in outcome if not isinstance(e, ev.Superseded)]
        if holding and self.switching[group]:
            assert kinds == [], outcome  # answered when the switch is done
        elif holding or busy:
            assert kinds == [ev.Granted if holding else ev.Queued], outcome
        else:
            assert kinds in ([ev.Granted], [ev.SwitchStarted]), outcome

    @rule(group=groups, job=jobs)
    def acquire_past_deadline(self, group: str, job: str) -> None:
        """On a busy group, from a job not already there: refused, nothing changes."""
        h = self.holder[group]
        if h is None or h == job or job in self.queue[group]:
            return
        before = self.table.to_dict()
        event = ev.Acquire(
            now=self.now,
            group=group,
            job=job,
            call_id=self.fresh("call"),
            request_id="",
            lease_ttl=None,
            wait_deadline=self.now,
        )
        refusal = ConflictError if job in self.quarantined[group] else DeadlineExceededError
        try:
            self.table.handle(event)
        except refusal:
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
        earlier = self.table.answered("yield", group, job, rid)
        before = self.table.to_dict()
        known = group in self.table.groups
        try:
            effects = self.table.handle(
                ev.Yield(now=self.now, group=group, job=job, request_id=rid, token=fencing)
            )
        except NotFoundError:
            assert not known
            assert self.table.to_dict() == before
            return
        except (NotHolderError, LeaseLostError) as exc:
            assert not isinstance(earlier, ev.Yielded)
            if current is not None and token != "stale":
                # the holder of a switch not done yet does not hold the group yet
                assert self.switching[group] and isinstance(exc, NotHolderError), exc
            assert self.table.to_dict() == before
            return
        if isinstance(earlier, ev.Yielded):
            assert effects == [dataclasses.replace(earlier, again=True)]  # given again
            assert self.table.to_dict() == before
            return
        assert current is not None and token != "stale" and not self.switching[group]
        self.follow(effects)

    @precondition(lambda self: self.held())
    @rule(pick=st.integers(0, 2))
    def holder_keeps_alive(self, pick: int) -> None:
        group = self.held()[pick % len(self.held())]
        holder = self.holder[group]
        assert holder is not None
        self.keep_alive(group, holder)

    @precondition(lambda self: self.held())
    @rule(pick=st.integers(0, 2), force=st.booleans())
    def holder_loses_the_grant(self, pick: int, force: bool) -> None:
        """The current grant ends without a yield (undelivered, or by an operator):
        while switching too, where it fails the waiting call."""
        group = self.held()[pick % len(self.held())]
        holder = self.holder[group]
        assert holder is not None
        if force:
            self.force_release(group, holder)
        else:
            self.revoke(group, 0, False)

    def left_with_a_context(self) -> list[str]:
        return [g for g in GROUPS if self.holder[g] is None and self.active[g]]

    @precondition(lambda self: self.left_with_a_context())
    @rule(pick=st.integers(0, 2), lease_ttl=lease_ttls)
    def last_job_acquires_again(self, pick: int, lease_ttl: float | None) -> None:
        """The job whose context was left active asks again: at no cost where its
        context is still the loaded one."""
        group = self.left_with_a_context()[pick % len(self.left_with_a_context())]
        self.acquire(group, self.active[group], lease_ttl, None, False, None)

    @rule(group=groups, job=jobs, shown=st.booleans())
    def keep_alive(self, group: str, job: str, shown: bool = False) -> None:
        """With the lease id its grant was told, or (`shown`) the one its group's
        status shows, which lacks the secret and renews nothing."""
        token = self.current_token(group, job)
        lease_id = f"lease-{token if token is not None else 0}"
        if token is not None and not shown:
            lease_id += f"-{self.secret[group, job]}"
        outcome = self.apply(ev.KeepAlive(now=self.now, group=group, job=job, lease_id=lease_id))
        if shown and token is not None and group in self.table.groups:
            assert isinstance(outcome, LeaseLostError), outcome
        elif token is not None and not self.switching[group]:
            assert isinstance(outcome, list) and isinstance(outcome[0], ev.LeaseRenewed)
        elif group in self.table.groups:
            assert isinstance(outcome, LeaseLostError), outcome
        else:
            assert isinstance(outcome, NotFoundError), outcome

    @precondition(lambda self: self.held())
    @rule(pick=st.integers(0, 2), kind=st.sampled_from(["yield", "keep_alive", "acquire"]))
    def another_principal_uses_the_grant(self, pick: int, kind: str) -> None:
        """The holder's job id, its lease and its fencing token, used by a principal
        other than the one that acquired: refused, nothing changes."""
        group = self.held()[pick % len(self.held())]
        job = self.holder[group]
        assert job is not None
        token = self.newest[group]
        lease_id = f"lease-{token}-{self.secret[group, job]}"
        event: ev.Event = {
            "yield": ev.Yield(
                now=self.now, group=group, job=job, token=token, principal="intruder"
            ),
            "keep_alive": ev.KeepAlive(
                now=self.now, group=group, job=job, lease_id=lease_id, principal="intruder"
            ),
            "acquire": ev.Acquire(
                now=self.now,
                group=group,
                job=job,
                call_id=self.fresh("call"),
                request_id=self.fresh("acq"),
                principal="intruder",
            ),
        }[kind]
        outcome = self.apply(event)
        if kind == "acquire" and job in self.quarantined[group]:
            assert isinstance(outcome, ConflictError), outcome
        else:
            assert isinstance(outcome, PermissionDeniedError), outcome

    @rule(group=groups, job=jobs, stale=st.booleans())
    def drop_waiter(self, group: str, job: str, stale: bool) -> None:
        call = "stale-call" if stale else self.call.get((group, job), "")
        queued = job in self.queue[group]
        effects = self.apply(
            ev.DropWaiter(
                now=self.now, group=group, job=job, call_id=call, reason=ev.Reason.CANCELLED
            )
        )
        if queued and not stale:
            assert effects == [
                ev.LeftQueue(group=group, job=job, call_id=call, reason=ev.Reason.CANCELLED)
            ]
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
        effects = self.apply(
            ev.Revoke(
                now=self.now, group=group, token=token, reason=ev.Reason.NOT_DELIVERED, call_id=call
            )
        )
        if h is not None and offset == 0 and not stale_call:
            assert isinstance(effects, list), effects
            waiting_call = h.call_id if h.switching else ""
            assert effects[0] == ev.Revoked(
                group=group,
                job=h.job,
                token=token,
                reason=ev.Reason.NOT_DELIVERED,
                call_id=waiting_call,
            )
        else:
            assert effects == []
            assert self.table.to_dict() == before

    @rule(group=groups, job=jobs, seen=st.lists(st.sampled_from(list(Liveness)), max_size=3))
    def workload_seen(self, group: str, job: str, seen: list[Liveness]) -> None:
        """The agents report what they see of a job's workload: the holder is revoked
        when some agent saw it and every one says it is gone; nothing else changes."""
        h = self.table.groups[group].holder if group in self.table.groups else None
        before = self.table.to_dict()
        event = ev.WorkloadSeen(now=self.now, group=group, job=job, seen=tuple(seen))
        effects = self.apply(event)
        gone = Liveness.GONE in seen and Liveness.ALIVE not in seen
        if h is not None and h.job == job and not h.switching and gone:
            assert isinstance(effects, list), effects
            assert effects[0] == ev.Revoked(
                group=group, job=job, token=h.token, reason=ev.Reason.HOLDER_GONE
            )
            assert ev.journaled(event, effects)
        else:
            assert effects == []
            assert self.table.to_dict() == before
            assert not ev.journaled(event, effects)

    @rule(group=groups, job=st.one_of(st.just(""), jobs))
    def force_release(self, group: str, job: str) -> None:
        h, token = self.holder[group], self.newest[group]
        waiting_call = self.call[group, h] if h is not None and self.switching[group] else ""
        outcome = self.apply(ev.ForceRelease(now=self.now, group=group, job=job))
        if group not in self.table.groups:
            assert isinstance(outcome, NotFoundError), outcome
        elif h is None or job not in ("", h):
            assert isinstance(outcome, NotHolderError), outcome
        else:
            assert isinstance(outcome, list) and outcome[0] == ev.Revoked(
                group=group, job=h, token=token, reason=ev.Reason.OPERATOR, call_id=waiting_call
            ), outcome

    @rule(group=st.sampled_from(("",) + GROUPS), limit=st.sampled_from([None, 3.0, 30.0]))
    def set_hold_limit(self, group: str, limit: float | None) -> None:
        assert self.apply(ev.SetHoldLimit(now=self.now, group=group, max_hold=limit)) == []

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
        assert self.apply(ev.Recover(now=self.now, grace=grace)) == []
        assert self.table.epoch == epoch + 1
        for g in GROUPS:
            for job in self.queue[g]:
                self.call[g, job] = ""
            if (h := self.holder[g]) is not None and self.switching[g]:
                self.call[g, h] = ""  # nobody was told of that grant yet

    @rule(group=groups, nodes=node_lists)
    def set_group_nodes(self, group: str, nodes: tuple[str, ...]) -> None:
        """Takes effect from the next grant on: a switch under way is not touched."""
        assert self.apply(ev.SetGroupNodes(now=self.now, group=group, nodes=nodes)) == []
        self.nodes[group] = nodes

    @rule(group=groups, nodes=bad_node_lists)
    def set_bad_group_nodes(self, group: str, nodes: tuple[str, ...]) -> None:
        outcome = self.apply(ev.SetGroupNodes(now=self.now, group=group, nodes=nodes))
        assert isinstance(outcome, InvalidArgumentError), outcome

    def switching_groups(self) -> list[str]:
        return [g for g in GROUPS if self.switching[g]]

    @precondition(lambda self: self.switching_groups())
    @rule(
        pick=st.integers(0, 2),
        restored=st.booleans(),
        picks=fault_picks,
        error=st.sampled_from(["", "", "agent n2 unreachable"]),
        moved=st.sampled_from([0, 4096]),
    )
    def switch_done(
        self,
        pick: int,
        restored: bool,
        picks: list[tuple[int, str]],
        error: str,
        moved: int,
    ) -> None:
        group = self.switching_groups()[pick % len(self.switching_groups())]
        target, token = self.holder[group], self.newest[group]
        assert target is not None
        candidates = [*self.queue[group], target, *JOBS]
        faults = [(candidates[i % len(candidates)], reason) for i, reason in picks]
        h = self.table.groups[group].holder
        assert h is not None and h.switching
        # what the model expects: the faults first, in order, then the grant or its end
        expected: list[ev.Effect] = []
        quarantined = dict(self.quarantined[group])
        for job, reason in faults:
            if job in quarantined:
                continue
            quarantined[job] = reason
            expected.append(ev.Quarantined(group=group, job=job, reason=reason))
            if job in self.queue[group]:
                expected.append(
                    ev.LeftQueue(
                        group=group,
                        job=job,
                        call_id=self.call[group, job],
                        reason=ev.Reason.QUARANTINED,
                        detail=reason,
                    )
                )
        call = self.call[group, target]
        if error or target in quarantined:
            why = error or quarantined[target]
            expected.append(
                ev.Revoked(
                    group=group,
                    job=target,
                    token=token,
                    reason=ev.Reason.SWITCH_FAILED,
                    detail=why,
                    call_id=call,
                )
            )
        else:
            expires = self.now + h.lease_ttl if h.lease_ttl else None
            lease = ev.LeaseInfo(
                lease_id=f"lease-{token}-{self.secret[group, target]}",
                ttl=h.lease_ttl or 0.0,
                expires_at=expires,
            )
            waited = self.now - self.since[group, target]
            expected.append(
                ev.Granted(
                    group=group,
                    job=target,
                    call_id=call,
                    token=token,
                    lease=lease,
                    waited=waited,
                    context_restored=restored,
                    must_deliver=True,
                    switch_bytes=moved,
                )
            )
        event = ev.SwitchDone(
            now=self.now,
            group=group,
            token=token,
            restored=restored,
            faults=tuple(faults),
            error=error,
            moved_bytes=moved,
        )
        effects = self.apply(event)
        assert isinstance(effects, list), effects
        assert effects[: len(expected)] == expected, (effects, expected)
        if not (error or target in quarantined):
            assert effects == expected  # nobody else is granted
            assert self.table.groups[group].holder.claim_deadline == (  # type: ignore[union-attr]
                None if call else self.now + self.table.claim_grace
            )

    @rule(group=groups, offset=st.integers(-1, 1), restored=st.booleans(), faults=faults)
    def stale_switch_done(
        self, group: str, offset: int, restored: bool, faults: list[tuple[str, str]]
    ) -> None:
        """A SwitchDone for a grant that is not switching (any more): nothing happens,
        its faults included."""
        token = self.newest[group] + offset
        if self.switching[group] and offset == 0:
            return
        before = self.table.to_dict()
        event = ev.SwitchDone(
            now=self.now,
            group=group,
            token=token,
            restored=restored,
            faults=tuple(faults),
            error="late",
        )
        assert self.apply(event) == []
        assert self.table.to_dict() == before

    @rule(group=groups, job=jobs)
    def reset_job(self, group: str, job: str) -> None:
        was_quarantined = job in self.quarantined[group]
        outcome = self.apply(ev.ResetJob(now=self.now, group=group, job=job))
        if group not in self.table.groups:
            assert isinstance(outcome, NotFoundError), outcome
        else:
            assert outcome == ([ev.JobReset(group=group, job=job)] if was_quarantined else []), (
                outcome
            )
        assert job not in self.quarantined[group]

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
                assert w.since == self.since[name, job]
            if g.holder is not None:
                assert g.holder.switching == self.switching[name]
                assert g.holder.call_id == self.call[name, g.holder.job]
            assert (g.active_job, g.loaded_job) == (self.active[name], self.loaded[name])
            assert g.quarantined == self.quarantined[name]

    @invariant()
    def nodes_match_the_model(self) -> None:
        assert self.table.nodes == {g: n for g, n in self.nodes.items() if n}


TestLockTable = LockTableMachine.TestCase
TestLockTable.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
