"""The lock table: every group's lock, queue and lease, as a pure state machine.

One mutator, `LockTable.handle(event) -> list[effect]`. No clock, no I/O, no
randomness: each event carries its own `now`, so folding the journal through
`handle` rebuilds exactly the table that served live traffic.

A group's state is derived from its holder and its active job:

    IDLE           nobody holds it, no context is live
    LOCKED         `holder` holds it
    IDLE_YIELDED   nobody holds it; the last holder's context is still live,
                   so that job's next Acquire costs nothing
    SWITCHING      `holder` is granted, but the group spans nodes and their agents
                   are still moving the contexts: the grant is announced (and its
                   lease starts) only at `SwitchDone`

Transitions (per group; `h` the holder, `j` another job):

    state            event                 next state         effects
    IDLE             Acquire(j)            LOCKED(j)          Granted
    IDLE_YIELDED(h)  Acquire(j)            LOCKED(j)          Granted
      ... on a group with nodes, unless j's context is the one loaded:
                                           SWITCHING(j)       SwitchStarted
    SWITCHING(j)     SwitchDone(ok)        LOCKED(j)          Granted
    SWITCHING(j)     SwitchDone(failed)    as for Revoke      Revoked (j's call fails)
    LOCKED(h)        Acquire(h)            LOCKED(h)          Granted (same token: re-entrant)
    LOCKED(h)        Acquire(j)            LOCKED(h)          Queued (or the waiter re-attached)
    LOCKED(h)        Yield(h)              LOCKED(next)       Yielded, Granted(next)
                                           | IDLE_YIELDED(h)  Yielded(snapshot_deferred)
    LOCKED(h)        Revoke, ForceRelease  as for Yield       Revoked, Granted(next)
    any              SwitchDone(faults)    (jobs quarantined) Quarantined; a quarantined
                                                              job may not Acquire, and
                                                              leaves the queue
    any              ResetJob(j)           (j released)       JobReset
    any              DropWaiter(j)         unchanged          LeftQueue
    any              KeepAlive(h)          unchanged          LeaseRenewed
    LOCKED(h)        WorkloadSeen(h: every  as for Revoke      Revoked (the holder's
                     agent that saw it                        workload is gone)
                     says GONE)
    any              Recover               unchanged          (new epoch, fresh leases)

Anything else raises a `TimeSliceError` and leaves the table unchanged: every
check runs before the first write. A grant and a place in a queue are bound to
the principal whose Acquire made them (`Acquire.principal`): a Yield, KeepAlive
or Acquire of the same job by another principal is refused (PERMISSION_DENIED),
and a lease id carries the secret its Acquire drew (`Acquire.lease_secret`), so
that knowing the token is not knowing the lease. Invariants (`validate`): at most one holder
per group, the holder is never queued, a job is queued at most once, the
holder's fencing token is the group's newest, a free group has nobody queued.

Time-driven transitions (a lease running out, a wait limit) are not handled
here by magic: `due(now)` says which `Revoke` or `DropWaiter` is due (see
`deadlines`), and the shell feeds it back through `handle`, so that the journal
records it as any other decision. Which waiter is served next is `policies`';
what a retried call is answered, `answers`'; the invariants, `invariants`';
hold limits, policies, nodes and agents, `settings`'.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from timeslice.errors import (
    ConflictError,
    DeadlineExceededError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    NotHolderError,
    PermissionDeniedError,
    ResourceExhaustedError,
    YieldNotHeldError,
)
from timeslice.ids import check_id, check_node
from timeslice.kinds import Liveness
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.answers import AcquireOutcome, Answers, CallKind, Outcome
from timeslice.orchestrator.deadlines import (
    HOLDER,
    Deadline,
    Due,
    Timers,
    earliest,
    holder_deadlines,
    waiter_deadlines,
)
from timeslice.orchestrator.events import Effect, Event, Reason
from timeslice.orchestrator.invariants import check_groups
from timeslice.orchestrator.model import (
    Group,
    GroupPolicy,
    GroupState,
    Holder,
    TableLimits,
    Waiter,
    group_from_dict,
    group_to_dict,
    owned_by,
)
from timeslice.orchestrator.policies import chosen
from timeslice.orchestrator.settings import SettingEvent, Settings

__all__ = ["Group", "GroupState", "Holder", "LockTable", "Waiter", "check_id", "check_node"]

MAX_LEASE_TTL: Final = 3600.0


class LockTable:
    """Every group's lock. See the module docstring for the transitions."""

    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}
        self.epoch = 0
        # Hold limits, policies, nodes, agents and job backends (see `settings`).
        self.settings = Settings()
        # How long after a start a grant nobody has claimed is kept (from `Recover`).
        self.claim_grace = 30.0
        self.tickets = 0
        # What new Acquires may add; None while a journal is folded (what it holds
        # was admitted when it happened).
        self.limits: TableLimits | None = None
        self.answers = Answers()
        self._timers = Timers(self._deadline)

    # --- the mutator ------------------------------------------------------------------

    def handle(self, event: Event) -> list[Effect]:
        """Apply one event; return what the shell must do. Raises on an illegal event,
        leaving the table unchanged."""
        match event:
            case ev.Acquire():
                return self._acquire(event)
            case ev.Yield():
                return self._yield(event)
            case ev.KeepAlive():
                return self._keep_alive(event)
            case ev.DropWaiter():
                return self._drop_waiter(event)
            case ev.Revoke():
                return self._revoke(event)
            case ev.ForceRelease():
                return self._force_release(event)
            case (
                ev.SetHoldLimit()
                | ev.SetPolicy()
                | ev.SetGroupNodes()
                | ev.RegisterAgent()
                | ev.SetJobBackend()
            ):
                return self._set(event)
            case ev.RequestYield():
                return self._request_yield(event)
            case ev.SwitchDone():
                return self._switch_done(event)
            case ev.WorkloadSeen():
                return self._workload_seen(event)
            case ev.ResetJob():
                return self._reset_job(event)
            case ev.Recover():
                return self._recover(event)
        raise TypeError(f"not an event: {event!r}")

    # --- acquire and yield ------------------------------------------------------------

    def _acquire(self, e: ev.Acquire) -> list[Effect]:
        check_id("job_id", e.job)
        names = tuple(sorted({e.group, *e.more_groups}))
        for name in names:
            check_id("group_id", name)
        if e.lease_ttl is not None and not 0 < e.lease_ttl <= MAX_LEASE_TTL:
            raise InvalidArgumentError(f"lease TTL must be in (0, {MAX_LEASE_TTL:.0f}] seconds")
        groups = [self.groups.get(n) or Group(name=n, state_since=e.now) for n in names]
        earlier = self.answered(CallKind.ACQUIRE, e.group, e.job, e.request_id)
        if isinstance(earlier, AcquireOutcome):
            granted = self.groups.get(earlier.group)
            h = granted.holder if granted else None
            if h is None or h.token != earlier.token or h.job != e.job:
                raise LeaseLostError(
                    f"the grant made for request {e.request_id} (token {earlier.token}) has ended"
                )
        for g in groups:
            if (why := g.quarantined.get(e.job)) is not None:
                raise ConflictError(
                    f"job {e.job} is quarantined on group {g.name} ({why}); an operator must"
                    " reset it first"
                )
        bundle = names if len(names) > 1 else ()
        held = [g for g in groups if g.holder is not None and g.holder.job == e.job]
        queued = [g for g in groups if e.job in g.queue]
        if held or queued:
            bound = [g.holder.principal for g in held if g.holder]
            bound += [g.queue[e.job].principal for g in queued]
            if not all(owned_by(p, e.principal) for p in bound):
                raise _not_theirs(e.job, names)
            same = all(g.holder.bundle == bundle for g in held if g.holder) and all(
                g.queue[e.job].bundle == bundle for g in queued
            )
            if not same or len(held) + len(queued) != len(groups):
                raise ConflictError(
                    f"job {e.job} already holds or waits for some of {', '.join(names)} in"
                    " another acquire: release those first (groups held together are asked"
                    " for together)"
                )
            effects: list[Effect] = []
            for g in groups:
                h = g.holder
                if h is not None and h.job == e.job:
                    effects += self._reenter(g, h, e)
                else:
                    effects += self._reattach(g, g.queue[e.job], e)
            return effects
        self._admit(groups)
        self.tickets += 1
        for g in groups:
            self.groups[g.name] = g
            g.queue[e.job] = Waiter(
                job=e.job,
                call_id=e.call_id,
                request_id=e.request_id,
                since=e.now,
                lease_ttl=e.lease_ttl,
                wait_deadline=e.wait_deadline,
                reclaim_deadline=None,
                priority=e.priority,
                bundle=bundle,
                ticket=self.tickets,
                principal=e.principal,
                lease_secret=e.lease_secret,
            )
        effects = self._serve(groups[0], e.now)
        if e.job in groups[0].queue:  # not granted: it waits
            if e.wait_deadline is not None and e.wait_deadline <= e.now:
                self._undo_waiting(groups, e.job)
                self.tickets -= 1
                raise DeadlineExceededError(f"{', '.join(names)} not free for {e.job}")
            for g in groups:
                self._timers.arm(g.name, e.job)
                effects.append(
                    ev.Queued(
                        group=g.name, job=e.job, call_id=e.call_id, position=g.position(e.job)
                    )
                )
        return effects

    def _admit(self, groups: list[Group]) -> None:
        """Refuse a new waiter over the table's limits."""
        limits = self.limits
        if limits is None:
            return
        new = sum(g.name not in self.groups for g in groups)
        if new and len(self.groups) + new > limits.max_groups:
            raise ResourceExhaustedError(
                f"the orchestrator knows {len(self.groups)} groups, its limit: no new one"
            )
        for g in groups:
            if len(g.queue) >= limits.max_waiters_per_group:
                raise ResourceExhaustedError(
                    f"{len(g.queue)} jobs wait for group {g.name} already, its limit"
                )

    def _undo_waiting(self, groups: list[Group], job: str) -> None:
        for g in groups:
            del g.queue[job]
            if g.holder is None and not g.queue and not g.token and not g.active_job:
                del self.groups[g.name]  # made for this call only

    def _reenter(self, g: Group, h: Holder, e: ev.Acquire) -> list[Effect]:
        # The new call takes the grant over, so that an earlier call of the same
        # job going away cannot roll it back. Only a grant nobody has claimed yet
        # (made while its waiter was detached) depends on this answer arriving.
        effects: list[Effect] = []
        if h.call_id and h.call_id != e.call_id:
            effects.append(ev.Superseded(group=g.name, job=h.job, call_id=h.call_id))
        unclaimed = h.claim_deadline is not None
        h.call_id, h.claim_deadline, h.lease_ttl = e.call_id, None, e.lease_ttl
        h.principal = h.principal or e.principal
        outcome = AcquireOutcome(group=g.name, job=h.job, token=h.token)
        self.answers.remember(CallKind.ACQUIRE, g.name, h.job, e.request_id, e.now, outcome)
        if h.switching:
            return effects  # answered when the switch is done
        h.expires_at = e.now + e.lease_ttl if e.lease_ttl else None
        self._timers.arm(g.name, HOLDER)
        # A grant nobody had taken yet is delivered now, as it was made; a holder
        # asking again is told that nothing was moved for this call.
        granted = ev.Granted(
            group=g.name,
            job=h.job,
            call_id=e.call_id,
            token=h.token,
            lease=h.lease,
            waited=h.granted_at - h.queued_at if unclaimed else 0.0,
            context_restored=h.restored and unclaimed,
            must_deliver=unclaimed,
        )
        return [*effects, granted]

    def _reattach(self, g: Group, w: Waiter, e: ev.Acquire) -> list[Effect]:
        effects: list[Effect] = []
        if w.call_id and w.call_id != e.call_id:
            effects.append(ev.Superseded(group=g.name, job=w.job, call_id=w.call_id))
        w.call_id, w.request_id, w.reclaim_deadline = e.call_id, e.request_id, None
        w.lease_ttl, w.wait_deadline, w.priority = e.lease_ttl, e.wait_deadline, e.priority
        w.principal = w.principal or e.principal
        w.lease_secret = e.lease_secret or w.lease_secret
        self._timers.arm(g.name, w.job)
        queued = ev.Queued(group=g.name, job=w.job, call_id=e.call_id, position=g.position(w.job))
        return [*effects, queued]

    def _yield(self, e: ev.Yield) -> list[Effect]:
        g = self._existing(e.group)
        check_id("job_id", e.job)
        earlier = self.answered(CallKind.YIELD, e.group, e.job, e.request_id)
        if isinstance(earlier, ev.Yielded):
            return [dataclasses.replace(earlier, again=True)]
        h = g.holder
        if h is not None and h.job == e.job and not owned_by(h.principal, e.principal):
            raise _not_theirs(e.job, (e.group,))
        if e.token is not None and (h is None or h.token != e.token or h.job != e.job):
            raise LeaseLostError(
                f"stale fencing token {e.token}: that grant of {e.group} has ended"
                f" (newest token {g.token})"
            )
        if h is None or h.job != e.job:
            holder = h.job if h else "nobody"
            # PERMISSION_DENIED, as the v1alpha1 server answers it (spec/wire-api.md).
            raise YieldNotHeldError(f"job {e.job} does not hold group {e.group} ({holder} does)")
        if h.switching:
            raise NotHolderError(f"job {e.job} is not granted {e.group} yet: its switch runs")
        waiting = len(g.queue)
        g.holder = None
        granted = self._serve(g, e.now)
        answer = ev.Yielded(
            group=g.name,
            job=e.job,
            token=h.token,
            pending_waiters=waiting,
            snapshot_deferred=waiting == 0,
            next_job=g.holder.job if g.holder else "",
        )
        self.answers.remember(CallKind.YIELD, g.name, e.job, e.request_id, e.now, answer)
        return [answer, *granted]

    def _keep_alive(self, e: ev.KeepAlive) -> list[Effect]:
        g = self._existing(e.group)
        h = g.holder
        if h is not None and h.job == e.job and not owned_by(h.principal, e.principal):
            raise _not_theirs(e.job, (e.group,))
        if h is None or h.job != e.job or h.lease.lease_id != e.lease_id or h.switching:
            # (The lease id sent is not repeated: it may be the holder's own secret.)
            raise LeaseLostError(f"the lease named for job {e.job} on {e.group} is not current")
        h.claim_deadline = None
        if h.lease_ttl:
            h.expires_at = e.now + h.lease_ttl
        # Re-arm even without a lease: a claim deadline just cleared may have been
        # the only armed deadline, hiding a later hold limit.
        self._timers.arm(g.name, HOLDER)
        renewed = ev.LeaseRenewed(
            group=g.name, job=h.job, token=h.token, lease=h.lease, yield_requested=h.yield_requested
        )
        return [renewed]

    def _drop_waiter(self, e: ev.DropWaiter) -> list[Effect]:
        g = self.groups.get(e.group)
        w = g.queue.get(e.job) if g else None
        if g is None or w is None or (e.call_id and w.call_id != e.call_id):
            return []  # it left, was granted, or re-attached through another call already
        return self._leave(g, w, e.reason, "", e.now)

    def _leave(self, g: Group, w: Waiter, reason: Reason, detail: str, now: float) -> list[Effect]:
        """`w` leaves the queue of `g` and, for a bundle, of its other groups; the
        groups that were kept for it serve others."""
        effects: list[Effect] = []
        left = [self.groups[name] for name in w.bundle] if w.bundle else [g]
        for group in left:
            del group.queue[w.job]
            effects.append(
                ev.LeftQueue(
                    group=group.name, job=w.job, call_id=w.call_id, reason=reason, detail=detail
                )
            )
        for group in left:
            effects += self._serve(group, now)
        return effects

    # --- grants that end without a yield ----------------------------------------------

    def _revoke(self, e: ev.Revoke) -> list[Effect]:
        g = self.groups.get(e.group)
        h = g.holder if g else None
        if g is None or h is None or h.token != e.token or (e.call_id and h.call_id != e.call_id):
            return []  # that grant ended already
        return self._end_grant(g, h, e.reason, "", e.now)

    def _force_release(self, e: ev.ForceRelease) -> list[Effect]:
        g = self._existing(e.group)
        h = g.holder
        if h is None:
            raise NotHolderError(f"group {e.group} is not locked")
        if e.job and h.job != e.job:
            raise NotHolderError(f"job {e.job} does not hold group {e.group} ({h.job} does)")
        return self._end_grant(g, h, Reason.OPERATOR, e.reason, e.now)

    def _workload_seen(self, e: ev.WorkloadSeen) -> list[Effect]:
        g = self.groups.get(e.group)
        h = g.holder if g else None
        if g is None or h is None or h.job != e.job or h.switching:
            return []
        if Liveness.GONE not in e.seen or Liveness.ALIVE in e.seen:
            return []  # alive somewhere, or never seen: a job without a workload
        return self._end_grant(g, h, Reason.HOLDER_GONE, "", e.now)

    def _request_yield(self, e: ev.RequestYield) -> list[Effect]:
        g = self.groups.get(e.group)
        h = g.holder if g else None
        hold = self.settings.hold_limit_of(e.group)
        if g is None or h is None or h.token != e.token or h.yield_requested:
            return []  # that grant ended, or was asked already
        if hold.max_hold is None:
            return []
        h.yield_requested = True
        self._timers.arm(g.name, HOLDER)
        revoke_at = h.granted_at + hold.max_hold + hold.grace
        return [ev.YieldRequested(group=g.name, job=h.job, token=h.token, revoke_at=revoke_at)]

    def _end_grant(
        self, g: Group, h: Holder, reason: Reason, detail: str, now: float
    ) -> list[Effect]:
        g.holder = None
        if h.switching:
            # The agents may be half way: no context is known live (the group reads
            # IDLE), and the next grant switches, whoever it goes to.
            g.loaded_job = g.active_job = ""
        elif reason == Reason.NOT_DELIVERED and not self.nodes.get(g.name):
            # Nobody took the grant: its job never ran, the previous context is live.
            # (Where agents switched the contexts, the granted job's is live now.)
            g.active_job = g.loaded_job = h.previous_job
        if g.loaded_job == h.job:
            # Its context stays loaded and it did not yield: its process may be frozen.
            g.revoked_job = h.job
        # Only a grant still switching has a call waiting for it: that call fails.
        revoked = ev.Revoked(
            group=g.name,
            job=h.job,
            token=h.token,
            reason=reason,
            detail=detail,
            call_id=h.call_id if h.switching else "",
        )
        return [revoked, *self._serve(g, now)]

    # --- settings -------------------------------------------------------------------

    def _set(self, e: SettingEvent) -> list[Effect]:
        self.settings.handle(e)
        if isinstance(e, ev.SetHoldLimit):
            for g in self.groups.values():
                self._timers.arm(g.name, HOLDER)
        return []

    @property
    def nodes(self) -> dict[str, tuple[str, ...]]:
        """The nodes each group spans."""
        return self.settings.nodes

    @property
    def agents(self) -> dict[str, str]:
        """Where each node's agent is reached, as it registered."""
        return self.settings.agents

    @property
    def job_backends(self) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
        """Per group, job and node ("" every node): the backend config the job registered."""
        return self.settings.job_backends

    def registrant(self, group: str, job: str, node: str) -> str:
        """The principal that registered `job`'s backend on `node` ("" none)."""
        return self.settings.registrant(group, job, node)

    def hold_limit(self, group: str) -> float | None:
        """The longest a holder may keep `group`."""
        return self.settings.hold_limit_of(group).max_hold

    def policy(self, group: str) -> GroupPolicy:
        """How `group` picks its next holder, and the priority aging it uses."""
        return self.settings.policy(group)

    def _recover(self, e: ev.Recover) -> list[Effect]:
        self.epoch += 1
        self.claim_grace = e.grace
        for g in self.groups.values():
            if (h := g.holder) is not None:
                h.expires_at = e.now + h.lease_ttl if h.lease_ttl else None
                if h.switching:
                    # Nobody was told of this grant; the shell runs its switch again.
                    h.call_id = ""
                if h.claim_deadline is not None or h.switching:
                    h.claim_deadline = e.now + e.grace
                self._timers.arm(g.name, HOLDER)
            for w in g.queue.values():
                w.call_id, w.reclaim_deadline = "", e.now + e.grace
                self._timers.arm(g.name, w.job)
        return []

    # --- grants and switches ----------------------------------------------------------

    def _serve(self, g: Group, now: float) -> list[Effect]:
        """Grant free group `g` to the waiter its policy picks, unless it is kept for a
        bundle whose other groups are not free for it yet (see `policies`)."""
        if g.holder is not None:
            return []
        if not g.queue:
            g.state_since = now
            return []
        w = self._chosen(g, now)
        if not w.bundle:
            del g.queue[w.job]
            return self._grant(g, w, now)
        groups = [self.groups[name] for name in w.bundle]
        if any(x.holder is not None or self._chosen(x, now).job != w.job for x in groups):
            return []  # kept for w until its other groups are free for it
        effects: list[Effect] = []
        for x in groups:
            effects += self._grant(x, x.queue.pop(w.job), now)
        return effects

    def _chosen(self, g: Group, now: float) -> Waiter:
        policy = self.settings.policy(g.name)
        pick = chosen(g, policy.kind, policy.aging, now)
        if not pick.bundle:
            return pick
        # A waiter that holds another group of the bundle is served first: keeping
        # `g` for the bundle while that job waits for `g` would be a cycle (a job
        # asking for its groups one by one, in order, as v1alpha1 clients do).
        holders = {h.job for name in pick.bundle if (h := self.groups[name].holder) is not None}
        return next((w for w in g.queue.values() if w.job in holders), pick)

    def _grant(self, g: Group, w: Waiter, now: float) -> list[Effect]:
        # A group that spans nodes first has its agents move the other contexts out
        # and this job's in (SWITCHING); the grant is announced at `SwitchDone`.
        # Without nodes, or when this job's context is the one loaded, it is live
        # at once and nothing is restored.
        g.token += 1
        g.last_served[w.job] = now
        previous = g.active_job
        switching = bool(self.nodes.get(g.name)) and w.job != g.loaded_job
        g.active_job = w.job
        g.state_since = now
        g.holder = Holder(
            job=w.job,
            token=g.token,
            call_id=w.call_id,
            request_id=w.request_id,
            granted_at=now,
            lease_ttl=w.lease_ttl,
            expires_at=now + w.lease_ttl if w.lease_ttl else None,
            claim_deadline=None if w.call_id else w.reclaim_deadline,
            previous_job=previous,
            switching=switching,
            queued_at=w.since,
            bundle=w.bundle,
            principal=w.principal,
            lease_secret=w.lease_secret,
        )
        outcome = AcquireOutcome(group=g.name, job=w.job, token=g.token)
        self.answers.remember(CallKind.ACQUIRE, g.name, w.job, w.request_id, now, outcome)
        if switching:
            # `revoked_job` stays until SwitchDone: the switch reads it (again after
            # a restart) to bound the revoked job's snapshot.
            return [ev.SwitchStarted(group=g.name, job=w.job, token=g.token, previous=g.loaded_job)]
        g.loaded_job, g.revoked_job = w.job, ""
        self._timers.arm(g.name, HOLDER)
        granted = ev.Granted(
            group=g.name,
            job=w.job,
            call_id=w.call_id,
            token=g.token,
            lease=g.holder.lease,
            waited=now - w.since,
            context_restored=False,
        )
        return [granted]

    def _switch_done(self, e: ev.SwitchDone) -> list[Effect]:
        g = self.groups.get(e.group)
        h = g.holder if g else None
        if g is None or h is None or h.token != e.token or not h.switching:
            return []  # that grant ended already
        effects = self._quarantine(g, e.faults, e.now)
        if e.error or h.job in g.quarantined:
            why = e.error or g.quarantined[h.job]
            return [*effects, *self._end_grant(g, h, Reason.SWITCH_FAILED, why, e.now)]
        h.switching, h.granted_at, h.restored = False, e.now, e.restored
        h.expires_at = e.now + h.lease_ttl if h.lease_ttl else None
        if not h.call_id:
            h.claim_deadline = e.now + self.claim_grace
        g.loaded_job, g.state_since, g.revoked_job = h.job, e.now, ""
        self._timers.arm(g.name, HOLDER)
        granted = ev.Granted(
            group=g.name,
            job=h.job,
            call_id=h.call_id,
            token=h.token,
            lease=h.lease,
            waited=e.now - h.queued_at,
            context_restored=e.restored,
            switch_bytes=e.moved_bytes,
        )
        return [*effects, granted]

    def _quarantine(
        self, g: Group, faults: tuple[tuple[str, str], ...], now: float
    ) -> list[Effect]:
        effects: list[Effect] = []
        for job, reason in faults:
            if job in g.quarantined:
                continue
            g.quarantined[job] = reason
            effects.append(ev.Quarantined(group=g.name, job=job, reason=reason))
            if (w := g.queue.get(job)) is not None:
                effects += self._leave(g, w, Reason.QUARANTINED, reason, now)
        return effects

    def _reset_job(self, e: ev.ResetJob) -> list[Effect]:
        g = self._existing(e.group)
        check_id("job_id", e.job)
        if g.quarantined.pop(e.job, None) is None:
            return []
        return [ev.JobReset(group=g.name, job=e.job)]

    # --- lookups ----------------------------------------------------------------------

    def answered(self, kind: CallKind, group: str, job: str, request_id: str) -> Outcome | None:
        """What the job's call of `kind` on `group` with this request id was answered,
        if it is the latest one remembered."""
        return self.answers.find(kind, group, job, request_id)

    def _existing(self, name: str) -> Group:
        check_id("group_id", name)
        g = self.groups.get(name)
        if g is None:
            raise NotFoundError(f"unknown group {name!r}")
        return g

    # --- time -------------------------------------------------------------------------

    def _deadline(self, group: str, key: str) -> Deadline | None:
        g = self.groups.get(group)
        if g is None:
            return None
        if key == HOLDER:
            return earliest(holder_deadlines(g, self.settings.hold_limit_of(group)))
        w = g.queue.get(key)
        return earliest(waiter_deadlines(w)) if w else None

    def next_deadline(self) -> float | None:
        """When the next time-driven transition falls due (None: never)."""
        found = self._timers.next()
        return found[0] if found else None

    def due(self, now: float) -> ev.Revoke | ev.DropWaiter | ev.RequestYield | None:
        """The first time-driven event due at `now`, to be fed back through `handle`."""
        found = self._timers.next()
        if found is None or found[0] > now:
            return None
        _, group, key = found
        deadline = self._deadline(group, key)
        assert deadline is not None  # current, or `next` had dropped it
        reason = deadline[1]
        g = self.groups[group]
        if key == HOLDER:
            assert g.holder is not None
            if reason is Due.ASK_TO_YIELD:
                return ev.RequestYield(now=now, group=group, token=g.holder.token)
            assert isinstance(reason, Reason)
            return ev.Revoke(now=now, group=group, token=g.holder.token, reason=reason)
        assert isinstance(reason, Reason)
        return ev.DropWaiter(
            now=now, group=group, job=key, call_id=g.queue[key].call_id, reason=reason
        )

    # --- checks and persistence -------------------------------------------------------

    def validate(self) -> None:
        """Raise AssertionError if an invariant does not hold (see `invariants`)."""
        check_groups(self.groups)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready snapshot of the whole table."""
        return {
            "epoch": self.epoch,
            **self.settings.to_dict(),
            "claim_grace": self.claim_grace,
            "tickets": self.tickets,
            "groups": [group_to_dict(g) for g in self.groups.values()],
            "answers": self.answers.to_list(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LockTable:
        """The inverse of `to_dict`."""
        table = cls()
        table.epoch = data["epoch"]
        table.settings = Settings.from_dict(data)
        table.claim_grace = data.get("claim_grace", table.claim_grace)
        table.tickets = data.get("tickets", 0)
        for gd in data["groups"]:
            g = group_from_dict(gd)
            table.groups[g.name] = g
            table._timers.arm(g.name, HOLDER)
            for w in g.queue.values():
                table._timers.arm(g.name, w.job)
        # (Snapshots written before answers were kept per call had "recent", a
        # list of request ids alone: those are not carried over.)
        table.answers = Answers.from_list(data.get("answers", []))
        return table


def _not_theirs(job: str, groups: tuple[str, ...]) -> PermissionDeniedError:
    """A grant or a place in a queue used by a principal other than the one that
    acquired it (the same job id is not enough)."""
    return PermissionDeniedError(
        f"job {job}'s grant or place on {', '.join(groups)} was acquired by another principal"
    )
