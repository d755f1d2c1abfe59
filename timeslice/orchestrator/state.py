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
    any              Recover               unchanged          (new epoch, fresh leases)

Anything else raises a `TimeSliceError` and leaves the table unchanged: every
check runs before the first write. Invariants (`validate`): at most one holder
per group, the holder is never queued, a job is queued at most once, the
holder's fencing token is the group's newest, a free group has nobody queued.

Time-driven transitions (a lease running out, a wait limit) are not handled
here by magic: `due(now)` says which `Revoke` or `DropWaiter` is due, and the
shell feeds it back through `handle`, so that the journal records it as any
other decision.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from copy import deepcopy
from dataclasses import asdict, dataclass
from typing import Any, Final

from timeslice.client._transport import parse_target
from timeslice.errors import (
    ConflictError,
    DeadlineExceededError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    NotHolderError,
    ResourceExhaustedError,
)
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.events import Effect, Event
from timeslice.api.bounds import MAX_ID_BYTES
from timeslice.orchestrator.model import (
    Group,
    TableLimits,
    GroupState,
    Holder,
    Waiter,
    check_id,
    check_node,
    holder_from_dict,
    waiter_from_dict,
)
from timeslice.orchestrator.policies import chosen

__all__ = ["MAX_ID_BYTES", "Group", "GroupState", "Holder", "LockTable", "Waiter", "check_id",
           "check_node"]  # fmt: skip

MAX_LEASE_TTL: Final = 3600.0
# A call's request id is remembered, for an idempotent retry, per kind of call,
# group and job: a job retries only its latest call of a kind, so one answer
# each is enough, and another job's ids never match. Answers older than
# ANSWER_MEMORY_SEC are forgotten (clients give up retrying well before), and
# never more than MAX_ANSWERS are kept: a snapshot of the table carries no more.
ANSWER_MEMORY_SEC: Final = 120.0
MAX_ANSWERS: Final = 100_000


@dataclass(frozen=True)
class _AcquireOutcome:
    group: str
    job: str
    token: int


@dataclass(frozen=True)
class _Answer:
    """The answer to a job's latest call of a kind on a group, for its retries."""

    request_id: str
    at: float
    outcome: _AcquireOutcome | ev.Yielded


_ACQUIRE: Final = "acquire"
_YIELD: Final = "yield"


_HOLDER: Final = ""  # timer key of a group's holder; a waiter's key is its job id
_ASK_TO_YIELD: Final = "ask to yield"  # a holder deadline that asks rather than revokes


class LockTable:
    """Every group's lock. See the module docstring for the transitions."""

    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}
        self.epoch = 0
        # Hold limit per group name; the "" entry is the default for every group.
        self.hold_limits: dict[str, float | None] = {}
        # Seconds between the yield request at the hold limit and the revocation.
        self.hold_graces: dict[str, float] = {}
        # (policy, aging) per group name, likewise; FIFO when none is set.
        self.policies: dict[str, tuple[str, float]] = {}
        # The nodes each group spans, and where each node's agent is reached.
        self.nodes: dict[str, tuple[str, ...]] = {}
        self.agents: dict[str, str] = {}
        # Per group, job and node ("" every node): the backend config the job registered.
        self.job_backends: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
        # How long after a start a grant nobody has claimed is kept (from `Recover`).
        self.claim_grace = 30.0
        self.tickets = 0
        # What new Acquires may add; None while a journal is folded (what it holds
        # was admitted when it happened).
        self.limits: TableLimits | None = None
        # (kind of call, group, job) -> its latest answer, the oldest first.
        self.answers: OrderedDict[tuple[str, str, str], _Answer] = OrderedDict()
        # (deadline, group, key): a lazy heap; stale entries are skipped when met.
        self._timers: list[tuple[float, str, str]] = []

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
            case ev.SetHoldLimit():
                return self._set_hold_limit(event)
            case ev.SetPolicy():
                return self._set_policy(event)
            case ev.RequestYield():
                return self._request_yield(event)
            case ev.SetGroupNodes():
                return self._set_group_nodes(event)
            case ev.RegisterAgent():
                return self._register_agent(event)
            case ev.SetJobBackend():
                return self._set_job_backend(event)
            case ev.SwitchDone():
                return self._switch_done(event)
            case ev.ResetJob():
                return self._reset_job(event)
            case ev.Recover():
                return self._recover(event)
        raise TypeError(f"not an event: {event!r}")

    def _acquire(self, e: ev.Acquire) -> list[Effect]:
        check_id("job_id", e.job)
        names = tuple(sorted({e.group, *e.more_groups}))
        for name in names:
            check_id("group_id", name)
        if e.lease_ttl is not None and not 0 < e.lease_ttl <= MAX_LEASE_TTL:
            raise InvalidArgumentError(f"lease TTL must be in (0, {MAX_LEASE_TTL:.0f}] seconds")
        groups = [self.groups.get(n) or Group(n, state_since=e.now) for n in names]
        earlier = self.answered(_ACQUIRE, e.group, e.job, e.request_id)
        if isinstance(earlier, _AcquireOutcome):
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
            g.queue[e.job] = Waiter(e.job, e.call_id, e.request_id, e.now, e.lease_ttl,
                                    e.wait_deadline, None, e.priority, bundle, self.tickets)  # fmt: skip
        effects = self._serve(groups[0], e.now)
        if e.job in groups[0].queue:  # not granted: it waits
            if e.wait_deadline is not None and e.wait_deadline <= e.now:
                self._undo_waiting(groups, e.job)
                self.tickets -= 1
                raise DeadlineExceededError(f"{', '.join(names)} not free for {e.job}")
            for g in groups:
                self._arm_waiter(g, g.queue[e.job])
                effects.append(ev.Queued(g.name, e.job, e.call_id, g.position(e.job)))
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
            effects.append(ev.Superseded(g.name, h.job, h.call_id))
        unclaimed = h.claim_deadline is not None
        h.call_id, h.claim_deadline, h.lease_ttl = e.call_id, None, e.lease_ttl
        self._remember(_ACQUIRE, g.name, h.job, e.request_id, e.now,
                       _AcquireOutcome(g.name, h.job, h.token))  # fmt: skip
        if h.switching:
            return effects  # answered when the switch is done
        h.expires_at = e.now + e.lease_ttl if e.lease_ttl else None
        self._arm_holder(g)
        # A grant nobody had taken yet is delivered now, as it was made; a holder
        # asking again is told that nothing was moved for this call.
        waited = h.granted_at - h.queued_at if unclaimed else 0.0
        restored = h.restored and unclaimed
        granted = ev.Granted(
            g.name, h.job, e.call_id, h.token, h.lease, waited, restored, unclaimed
        )
        return [*effects, granted]

    def _reattach(self, g: Group, w: Waiter, e: ev.Acquire) -> list[Effect]:
        effects: list[Effect] = []
        if w.call_id and w.call_id != e.call_id:
            effects.append(ev.Superseded(g.name, w.job, w.call_id))
        w.call_id, w.request_id, w.reclaim_deadline = e.call_id, e.request_id, None
        w.lease_ttl, w.wait_deadline, w.priority = e.lease_ttl, e.wait_deadline, e.priority
        self._arm_waiter(g, w)
        return [*effects, ev.Queued(g.name, w.job, e.call_id, g.position(w.job))]

    def _yield(self, e: ev.Yield) -> list[Effect]:
        g = self._existing(e.group)
        check_id("job_id", e.job)
        earlier = self.answered(_YIELD, e.group, e.job, e.request_id)
        if isinstance(earlier, ev.Yielded):
            return [earlier]
        h = g.holder
        if e.token is not None and (h is None or h.token != e.token or h.job != e.job):
            raise LeaseLostError(
                f"stale fencing token {e.token}: that grant of {e.group} has ended"
                f" (newest token {g.token})"
            )
        if h is None or h.job != e.job:
            holder = h.job if h else "nobody"
            raise NotHolderError(f"job {e.job} does not hold group {e.group} ({holder} does)")
        if h.switching:
            raise NotHolderError(f"job {e.job} is not granted {e.group} yet: its switch runs")
        waiting = len(g.queue)
        g.holder = None
        granted = self._serve(g, e.now)
        next_job = g.holder.job if g.holder else ""
        answer = ev.Yielded(g.name, e.job, h.token, waiting, waiting == 0, next_job)
        self._remember(_YIELD, g.name, e.job, e.request_id, e.now, answer)
        return [answer, *granted]

    def _keep_alive(self, e: ev.KeepAlive) -> list[Effect]:
        g = self._existing(e.group)
        h = g.holder
        if h is None or h.job != e.job or h.lease.lease_id != e.lease_id or h.switching:
            raise LeaseLostError(f"lease {e.lease_id} of job {e.job} on {e.group} is not current")
        h.claim_deadline = None
        if h.lease_ttl:
            h.expires_at = e.now + h.lease_ttl
        # Re-arm even without a lease: a claim deadline just cleared may have been
        # the only armed deadline, hiding a later hold limit.
        self._arm_holder(g)
        return [ev.LeaseRenewed(g.name, h.job, h.token, h.lease, h.yield_requested)]

    def _drop_waiter(self, e: ev.DropWaiter) -> list[Effect]:
        g = self.groups.get(e.group)
        w = g.queue.get(e.job) if g else None
        if g is None or w is None or (e.call_id and w.call_id != e.call_id):
            return []  # it left, was granted, or re-attached through another call already
        return self._leave(g, w, e.reason, e.now)

    def _leave(self, g: Group, w: Waiter, reason: str, now: float) -> list[Effect]:
        """`w` leaves the queue of `g` and, for a bundle, of its other groups; the
        groups that were kept for it serve others."""
        effects: list[Effect] = []
        left = [self.groups[name] for name in w.bundle] if w.bundle else [g]
        for group in left:
            del group.queue[w.job]
            effects.append(ev.LeftQueue(group.name, w.job, w.call_id, reason))
        for group in left:
            effects += self._serve(group, now)
        return effects

    def _revoke(self, e: ev.Revoke) -> list[Effect]:
        g = self.groups.get(e.group)
        h = g.holder if g else None
        if g is None or h is None or h.token != e.token or (e.call_id and h.call_id != e.call_id):
            return []  # that grant ended already
        return self._end_grant(g, h, e.reason, e.now)

    def _force_release(self, e: ev.ForceRelease) -> list[Effect]:
        g = self._existing(e.group)
        h = g.holder
        if h is None:
            raise NotHolderError(f"group {e.group} is not locked")
        if e.job and h.job != e.job:
            raise NotHolderError(f"job {e.job} does not hold group {e.group} ({h.job} does)")
        reason = f"{ev.REASON_OPERATOR}: {e.reason}" if e.reason else ev.REASON_OPERATOR
        return self._end_grant(g, h, reason, e.now)

    def _set_hold_limit(self, e: ev.SetHoldLimit) -> list[Effect]:
        if e.max_hold is not None and e.max_hold <= 0:
            raise InvalidArgumentError("a hold limit must be positive")
        if not e.grace >= 0:
            raise InvalidArgumentError("a hold limit's grace must not be negative")
        self.hold_limits[e.group] = e.max_hold
        self.hold_graces[e.group] = e.grace
        for g in self.groups.values():
            self._arm_holder(g)
        return []

    def _request_yield(self, e: ev.RequestYield) -> list[Effect]:
        g = self.groups.get(e.group)
        h = g.holder if g else None
        limit = self.hold_limit(e.group)
        if g is None or h is None or h.token != e.token or h.yield_requested or limit is None:
            return []  # that grant ended, or was asked already
        h.yield_requested = True
        self._arm_holder(g)
        revoke_at = h.granted_at + limit + self.hold_grace(g.name)
        return [ev.YieldRequested(g.name, h.job, h.token, revoke_at)]

    def _set_policy(self, e: ev.SetPolicy) -> list[Effect]:
        if e.policy not in ev.POLICIES:
            raise InvalidArgumentError(
                f"unknown policy {e.policy!r}; expected one of {', '.join(ev.POLICIES)}"
            )
        if not e.aging > 0:
            raise InvalidArgumentError("priority aging must be a positive number of seconds")
        self.policies[e.group] = (e.policy, e.aging)
        return []

    def policy(self, group: str) -> tuple[str, float]:
        """How `group` picks its next holder, and the priority aging it uses."""
        return self.policies.get(group) or self.policies.get("") or (ev.POLICY_FIFO, 60.0)

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
                self._arm_holder(g)
            for w in g.queue.values():
                w.call_id, w.reclaim_deadline = "", e.now + e.grace
                self._arm_waiter(g, w)
        return []

    # --- grants -----------------------------------------------------------------------

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
        )
        self._remember(_ACQUIRE, g.name, w.job, w.request_id, now,
                       _AcquireOutcome(g.name, w.job, g.token))  # fmt: skip
        if switching:
            # `revoked_job` stays until SwitchDone: the switch reads it (again after
            # a restart) to bound the revoked job's snapshot.
            return [ev.SwitchStarted(g.name, w.job, g.token, g.loaded_job)]
        g.loaded_job, g.revoked_job = w.job, ""
        self._arm_holder(g)
        return [ev.Granted(g.name, w.job, w.call_id, g.token, g.holder.lease, now - w.since, False)]

    def _switch_done(self, e: ev.SwitchDone) -> list[Effect]:
        g = self.groups.get(e.group)
        h = g.holder if g else None
        if g is None or h is None or h.token != e.token or not h.switching:
            return []  # that grant ended already
        effects = self._quarantine(g, e.faults, e.now)
        if e.error or h.job in g.quarantined:
            why = e.error or g.quarantined[h.job]
            return [*effects, *self._end_grant(g, h, f"switch failed: {why}", e.now)]
        h.switching, h.granted_at, h.restored = False, e.now, e.restored
        h.expires_at = e.now + h.lease_ttl if h.lease_ttl else None
        if not h.call_id:
            h.claim_deadline = e.now + self.claim_grace
        g.loaded_job, g.state_since, g.revoked_job = h.job, e.now, ""
        self._arm_holder(g)
        granted = ev.Granted(g.name, h.job, h.call_id, h.token, h.lease, e.now - h.queued_at,
                             e.restored, switch_bytes=e.moved_bytes)  # fmt: skip
        return [*effects, granted]

    def _quarantine(
        self, g: Group, faults: tuple[tuple[str, str], ...], now: float
    ) -> list[Effect]:
        effects: list[Effect] = []
        for job, reason in faults:
            if job in g.quarantined:
                continue
            g.quarantined[job] = reason
            effects.append(ev.Quarantined(g.name, job, reason))
            if (w := g.queue.get(job)) is not None:
                effects += self._leave(g, w, f"{ev.REASON_QUARANTINED}: {reason}", now)
        return effects

    def _reset_job(self, e: ev.ResetJob) -> list[Effect]:
        g = self._existing(e.group)
        check_id("job_id", e.job)
        if g.quarantined.pop(e.job, None) is None:
            return []
        return [ev.JobReset(g.name, e.job)]

    def _set_group_nodes(self, e: ev.SetGroupNodes) -> list[Effect]:
        check_id("group_id", e.group)
        for node in e.nodes:
            check_node(node)
        if len(set(e.nodes)) != len(e.nodes):
            raise InvalidArgumentError(f"group {e.group} names a node twice: {list(e.nodes)}")
        if e.nodes:
            self.nodes[e.group] = tuple(e.nodes)
        else:
            self.nodes.pop(e.group, None)
        return []

    def _register_agent(self, e: ev.RegisterAgent) -> list[Effect]:
        check_node(e.node)
        parse_target(e.address)
        self.agents[e.node] = e.address
        return []

    def _set_job_backend(self, e: ev.SetJobBackend) -> list[Effect]:
        check_id("group_id", e.group)
        check_id("job_id", e.job)
        if e.node:
            check_node(e.node)
        jobs = self.job_backends.setdefault(e.group, {})
        per_node = jobs.setdefault(e.job, {})
        if e.backend is None:
            per_node.pop(e.node, None)
        else:
            per_node[e.node] = dict(e.backend)
        if not per_node:
            del jobs[e.job]
        if not jobs:
            del self.job_backends[e.group]
        return []

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
        return chosen(g, *self.policy(g.name), now)

    def _end_grant(self, g: Group, h: Holder, reason: str, now: float) -> list[Effect]:
        g.holder = None
        if h.switching:
            # The agents may be half way: no context is known live (the group reads
            # IDLE), and the next grant switches, whoever it goes to.
            g.loaded_job = g.active_job = ""
        elif reason == ev.REASON_NOT_DELIVERED and not self.nodes.get(g.name):
            # Nobody took the grant: its job never ran, the previous context is live.
            # (Where agents switched the contexts, the granted job's is live now.)
            g.active_job = g.loaded_job = h.previous_job
        if g.loaded_job == h.job:
            # Its context stays loaded and it did not yield: its process may be frozen.
            g.revoked_job = h.job
        # Only a grant still switching has a call waiting for it: that call fails.
        revoked = ev.Revoked(g.name, h.job, h.token, reason, h.call_id if h.switching else "")
        return [revoked, *self._serve(g, now)]

    def answered(
        self, kind: str, group: str, job: str, request_id: str
    ) -> _AcquireOutcome | ev.Yielded | None:
        """What the job's call of `kind` ("acquire", "yield") on `group` with this
        request id was answered, if it is the latest one remembered."""
        answer = self.answers.get((kind, group, job)) if request_id else None
        return answer.outcome if answer is not None and answer.request_id == request_id else None

    def _remember(
        self,
        kind: str,
        group: str,
        job: str,
        request_id: str,
        now: float,
        outcome: _AcquireOutcome | ev.Yielded,
    ) -> None:
        if not request_id:
            return
        key = (kind, group, job)
        self.answers.pop(key, None)
        self.answers[key] = _Answer(request_id, now, outcome)
        while self.answers:
            oldest = next(iter(self.answers.values()))
            if len(self.answers) <= MAX_ANSWERS and oldest.at >= now - ANSWER_MEMORY_SEC:
                break
            self.answers.popitem(last=False)

    def _existing(self, name: str) -> Group:
        check_id("group_id", name)
        g = self.groups.get(name)
        if g is None:
            raise NotFoundError(f"unknown group {name!r}")
        return g

    # --- time -------------------------------------------------------------------------

    def hold_limit(self, group: str) -> float | None:
        """The longest a holder may keep `group`."""
        return self.hold_limits.get(group, self.hold_limits.get(""))

    def hold_grace(self, group: str) -> float:
        """How long after its yield request a holder of `group` is revoked."""
        return self.hold_graces.get(group, self.hold_graces.get("", 0.0))

    def _holder_deadlines(self, g: Group) -> list[tuple[float, str]]:
        h = g.holder
        if h is None or h.switching:
            return []  # a switch is bounded by the shell's deadline; the lease starts after
        found = []
        if h.expires_at is not None:
            found.append((h.expires_at, ev.REASON_LEASE_EXPIRED))
        if (limit := self.hold_limit(g.name)) is not None:
            grace = self.hold_grace(g.name)
            if grace > 0 and not h.yield_requested:
                found.append((h.granted_at + limit, _ASK_TO_YIELD))
            found.append((h.granted_at + limit + grace, ev.REASON_HOLD_LIMIT))
        if h.claim_deadline is not None:
            found.append((h.claim_deadline, ev.REASON_NOT_DELIVERED))
        return found

    @staticmethod
    def _waiter_deadlines(w: Waiter) -> list[tuple[float, str]]:
        found = []
        if w.wait_deadline is not None:
            found.append((w.wait_deadline, ev.REASON_WAIT_TIMEOUT))
        if w.reclaim_deadline is not None:
            found.append((w.reclaim_deadline, ev.REASON_NOT_RECLAIMED))
        return found

    def _deadline(self, group: str, key: str) -> tuple[float, str] | None:
        g = self.groups.get(group)
        if g is None:
            return None
        if key == _HOLDER:
            found = self._holder_deadlines(g)
        else:
            w = g.queue.get(key)
            found = self._waiter_deadlines(w) if w else []
        return min(found) if found else None

    def _arm_holder(self, g: Group) -> None:
        if (d := self._deadline(g.name, _HOLDER)) is not None:
            heapq.heappush(self._timers, (d[0], g.name, _HOLDER))

    def _arm_waiter(self, g: Group, w: Waiter) -> None:
        if (d := self._deadline(g.name, w.job)) is not None:
            heapq.heappush(self._timers, (d[0], g.name, w.job))

    def next_deadline(self) -> float | None:
        """When the next time-driven transition falls due (None: never)."""
        while self._timers:
            at, group, key = self._timers[0]
            current = self._deadline(group, key)
            if current is not None and current[0] == at:
                return at
            heapq.heappop(self._timers)
        return None

    def due(self, now: float) -> ev.Revoke | ev.DropWaiter | ev.RequestYield | None:
        """The first time-driven event due at `now`, to be fed back through `handle`."""
        at = self.next_deadline()
        if at is None or at > now:
            return None
        _, group, key = self._timers[0]
        _, reason = self._deadline(group, key) or (at, "")
        g = self.groups[group]
        if key == _HOLDER:
            assert g.holder is not None
            if reason == _ASK_TO_YIELD:
                return ev.RequestYield(now, group, g.holder.token)
            return ev.Revoke(now, group, g.holder.token, reason)
        return ev.DropWaiter(now, group, key, g.queue[key].call_id, reason)

    # --- checks and persistence -------------------------------------------------------

    def validate(self) -> None:
        """Raise AssertionError if an invariant does not hold."""
        # call id -> (job, bundle) of every place the call is attached to
        calls: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
        for name, g in self.groups.items():
            assert g.name == name, (name, g.name)
            assert g.token >= 0
            assert not set(g.queue) & set(g.quarantined), f"{name}: a quarantined job waits"
            for job, w in g.queue.items():
                assert w.job == job, (job, w.job)
                assert not w.bundle or name in w.bundle, f"{name}: {job}'s bundle {w.bundle}"
                for other in w.bundle:
                    peer = self.groups[other].queue.get(job)
                    assert peer is not None and peer.ticket == w.ticket, f"{job} not in {other}"
                calls.setdefault(w.call_id, []).append((job, w.bundle))
            h = g.holder
            if h is None:
                kept = any(w.bundle for w in g.queue.values())
                assert kept or not g.queue, f"{name}: waiters queued on a free group"
                continue
            assert h.job not in g.queue, f"{name}: holder {h.job} is also queued"
            assert h.token == g.token, f"{name}: holder token {h.token} is not {g.token}"
            assert h.job not in g.quarantined, f"{name}: quarantined {h.job} holds it"
            assert h.switching or not g.revoked_job, f"{name}: {h.job} holds, revoked set"
            if h.switching:
                assert g.active_job == h.job, f"{name}: switching to {h.job}, not active"
                assert g.loaded_job != h.job, f"{name}: switching to {h.job}, already loaded"
            else:
                assert g.active_job == g.loaded_job == h.job, f"{name}: holder's context not live"
            calls.setdefault(h.call_id, []).append((h.job, h.bundle))
        for call, places in calls.items():
            if call and len(places) > 1:
                job, bundle = places[0]
                assert bundle and set(places) == {(job, bundle)}, f"call {call} in {places}"
                assert len(places) <= len(bundle), f"call {call} in {places}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready snapshot of the whole table."""
        return {
            "epoch": self.epoch,
            "hold_limits": dict(self.hold_limits),
            "hold_graces": dict(self.hold_graces),
            "policies": {name: list(p) for name, p in self.policies.items()},
            "nodes": {name: list(nodes) for name, nodes in self.nodes.items()},
            "agents": dict(self.agents),
            "job_backends": deepcopy(self.job_backends),
            "claim_grace": self.claim_grace,
            "tickets": self.tickets,
            "groups": [
                {
                    "name": g.name,
                    "state_since": g.state_since,
                    "token": g.token,
                    "holder": asdict(g.holder) if g.holder else None,
                    "queue": [asdict(w) for w in g.queue.values()],
                    "active_job": g.active_job,
                    "loaded_job": g.loaded_job,
                    "last_served": dict(g.last_served),
                    "quarantined": dict(g.quarantined),
                    "revoked_job": g.revoked_job,
                }
                for g in self.groups.values()
            ],
            "answers": [
                [*key, a.request_id, a.at, type(a.outcome).__name__, asdict(a.outcome)]
                for key, a in self.answers.items()
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LockTable:
        """The inverse of `to_dict`."""
        table = cls()
        table.epoch = data["epoch"]
        table.hold_limits = dict(data["hold_limits"])
        table.hold_graces = dict(data.get("hold_graces", {}))
        table.policies = {name: (p, a) for name, (p, a) in data.get("policies", {}).items()}
        table.nodes = {name: tuple(nodes) for name, nodes in data.get("nodes", {}).items()}
        table.agents = dict(data.get("agents", {}))
        table.job_backends = deepcopy(data.get("job_backends", {}))
        table.claim_grace = data.get("claim_grace", table.claim_grace)
        table.tickets = data.get("tickets", 0)
        for gd in data["groups"]:
            g = Group(
                name=gd["name"],
                state_since=gd["state_since"],
                token=gd["token"],
                holder=holder_from_dict(gd["holder"]) if gd["holder"] else None,
                queue=OrderedDict((w["job"], waiter_from_dict(w)) for w in gd["queue"]),
                active_job=gd["active_job"],
                loaded_job=gd["loaded_job"],
                last_served=dict(gd.get("last_served", {})),
                quarantined=dict(gd.get("quarantined", {})),
                revoked_job=gd.get("revoked_job", ""),
            )
            table.groups[g.name] = g
            table._arm_holder(g)
            for w in g.queue.values():
                table._arm_waiter(g, w)
        outcome_types = {"_AcquireOutcome": _AcquireOutcome, "Yielded": ev.Yielded}
        # (Snapshots written before answers were kept per call had "recent", a
        # list of request ids alone: those are not carried over.)
        for kind, group, job, rid, at, outcome, fields in data.get("answers", ()):
            answer = _Answer(rid, at, outcome_types[outcome](**fields))
            table.answers[(kind, group, job)] = answer
        return table


def _holder(data: dict[str, Any]) -> Holder:
    return Holder(**{**data, "bundle": tuple(data.get("bundle", ()))})


def _waiter(data: dict[str, Any]) -> Waiter:
    return Waiter(**{**data, "bundle": tuple(data.get("bundle", ()))})
