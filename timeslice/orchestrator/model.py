"""The lock table's data: groups, holders and waiters, each group's settings, and
their snapshot form. What changes them is `state.LockTable`."""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from timeslice.errors import InvalidArgumentError
from timeslice.orchestrator import events as ev


class GroupState(enum.Enum):
    """A group's lock state, named as on the wire."""

    IDLE = "IDLE"
    IDLE_YIELDED = "IDLE_YIELDED"
    LOCKED = "LOCKED"
    SWITCHING = "SWITCHING"


@dataclass(frozen=True, kw_only=True)
class TableLimits:
    """How much one orchestrator's table admits: every group stays known (its fencing
    token must only grow), and each waiter costs every later one its place."""

    max_groups: int = 10_000
    max_waiters_per_group: int = 10_000

    def __post_init__(self) -> None:
        if self.max_groups < 1 or self.max_waiters_per_group < 1:
            raise InvalidArgumentError("max_groups and max_waiters_per_group must be positive")


@dataclass(kw_only=True)
class Holder:
    """The job holding a group, and its grant."""

    job: str
    token: int
    call_id: str  # the Acquire call that took the grant; "" while nobody has claimed it
    request_id: str
    granted_at: float
    lease_ttl: float | None
    expires_at: float | None
    claim_deadline: float | None  # an unclaimed grant is revoked then
    previous_job: str = ""  # the active job before this grant, restored if it is never taken
    yield_requested: bool = False  # it reached its hold limit and was asked to yield
    switching: bool = False  # the agents are still moving contexts for this grant
    queued_at: float = 0.0  # when its Acquire began waiting
    bundle: tuple[str, ...] = ()  # the groups granted together with this one
    restored: bool = False  # its switch brought its context back (told when it is claimed)
    # The principal that acquired it ("" unnamed): only it may yield, renew or take
    # the grant again (see `owned_by`).
    principal: str = ""
    # The secret part of its lease id, known only to the call that took the grant.
    lease_secret: str = ""

    @property
    def lease(self) -> ev.LeaseInfo:
        """The lease as its holder is told it: the id carries the secret (grants of
        journals written before secrets existed have none)."""
        lease_id = f"lease-{self.token}-{self.lease_secret}" if self.lease_secret else ""
        return ev.LeaseInfo(
            lease_id=lease_id or f"lease-{self.token}",
            ttl=self.lease_ttl or 0.0,
            expires_at=self.expires_at,
        )

    @property
    def shown_lease(self) -> ev.LeaseInfo:
        """The lease as anyone else may see it (a group's status, a watch): its id
        without the secret, which is useless for a KeepAlive."""
        return ev.LeaseInfo(
            lease_id=f"lease-{self.token}", ttl=self.lease_ttl or 0.0, expires_at=self.expires_at
        )


@dataclass(kw_only=True)
class Waiter:
    """A queued job."""

    job: str
    call_id: str  # "" while detached (after a restart, until its client comes back)
    request_id: str
    since: float
    lease_ttl: float | None
    wait_deadline: float | None
    reclaim_deadline: float | None
    priority: int = 0
    # All the groups it asks for at once (sorted), when more than this one.
    bundle: tuple[str, ...] = ()
    ticket: int = 0  # grows with every new acquire in the table: bundles' age order
    principal: str = ""  # who asked: the grant it gets is bound to it
    lease_secret: str = ""  # the secret of the lease its grant will have


def owned_by(bound: str, caller: str) -> bool:
    """Whether a grant or a place in a queue bound to principal `bound` is the
    caller's: unnamed on either side ("": no auth policy, trusted in-process code,
    or a grant journaled before principals were recorded) binds nobody."""
    return not bound or not caller or bound == caller


@dataclass(kw_only=True)
class Group:
    """One group's lock."""

    name: str
    state_since: float
    token: int = 0
    holder: Holder | None = None
    queue: OrderedDict[str, Waiter] = field(default_factory=OrderedDict)
    active_job: str = ""
    loaded_job: str = ""
    # When each job was last granted the group: what least-recently-served goes by.
    last_served: dict[str, float] = field(default_factory=dict)
    # Jobs that failed on the group's accelerators, with why, until an operator resets them.
    quarantined: dict[str, str] = field(default_factory=dict)
    # The job whose grant ended without a yield (revoked, force-released) while its
    # context stayed loaded: its process may be frozen and never answer, so a switch
    # away from it bounds its snapshot by the shorter revoked-snapshot deadline.
    # Cleared once another job's context is loaded, or the job is granted again.
    revoked_job: str = ""

    @property
    def state(self) -> GroupState:
        if self.holder is not None:
            return GroupState.SWITCHING if self.holder.switching else GroupState.LOCKED
        return GroupState.IDLE_YIELDED if self.active_job else GroupState.IDLE

    def position(self, job: str) -> int:
        return list(self.queue).index(job)


class GroupPolicy(NamedTuple):
    """How a group picks its next holder, and the aging `Policy.PRIORITY` uses."""

    kind: ev.Policy = ev.Policy.FIFO
    aging: float = 60.0


class HoldLimit(NamedTuple):
    """The longest a holder may keep a group (None: no limit), and how long after
    its yield request at that limit it is revoked."""

    max_hold: float | None = None
    grace: float = 0.0


def group_to_dict(g: Group) -> dict[str, Any]:
    """A JSON-ready snapshot of one group."""
    return {
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


def group_from_dict(data: dict[str, Any]) -> Group:
    """The inverse of `group_to_dict`."""
    holder = data["holder"]
    return Group(
        name=data["name"],
        state_since=data["state_since"],
        token=data["token"],
        holder=Holder(**{**holder, "bundle": tuple(holder.get("bundle", ()))}) if holder else None,
        queue=OrderedDict(
            (w["job"], Waiter(**{**w, "bundle": tuple(w.get("bundle", ()))})) for w in data["queue"]
        ),
        active_job=data["active_job"],
        loaded_job=data["loaded_job"],
        last_served=dict(data.get("last_served", {})),
        quarantined=dict(data.get("quarantined", {})),
        revoked_job=data.get("revoked_job", ""),
    )
