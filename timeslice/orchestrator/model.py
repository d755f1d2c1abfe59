"""The lock table's data: groups, holders and waiters, and the checks of the names
they carry. What changes them is `state.LockTable`."""

from __future__ import annotations

import enum
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Final

from timeslice.api.bounds import id_problem
from timeslice.client._transport import parse_target
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


@dataclass
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

    @property
    def lease(self) -> ev.LeaseInfo:
        return ev.LeaseInfo(f"lease-{self.token}", self.lease_ttl or 0.0, self.expires_at)


@dataclass
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


@dataclass
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


def holder_from_dict(data: dict[str, Any]) -> Holder:
    return Holder(**{**data, "bundle": tuple(data.get("bundle", ()))})


def waiter_from_dict(data: dict[str, Any]) -> Waiter:
    return Waiter(**{**data, "bundle": tuple(data.get("bundle", ()))})


def check_id(name: str, value: str) -> None:
    if not value:
        raise InvalidArgumentError(f"{name} must not be empty")
    if (problem := id_problem(value)) is not None:
        raise InvalidArgumentError(f"{name} {problem}")


_NODE_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")


def check_node(value: str) -> None:
    """A node is named as its agent registers (a host-like name) or by its agent's
    address (HOST:PORT, or unix:PATH)."""
    check_id("node", value)
    if _NODE_NAME.match(value):
        return
    if value != value.strip():
        raise InvalidArgumentError(f"node {value!r} begins or ends with white space")
    try:
        parse_target(value)
    except InvalidArgumentError:
        raise InvalidArgumentError(
            f"node {value!r} is neither a node name (letters, digits, '.', '_', '-')"
            " nor an agent address (HOST:PORT or unix:PATH)"
        ) from None
