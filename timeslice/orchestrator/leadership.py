"""The leader lease, as a rule: which orchestrator on a shared journal is active.

Every orchestrator on one PostgreSQL journal is a candidate. The database holds
one lease row (an epoch, its holder, when it expires on the database's clock);
exactly one candidate, the one whose epoch and id the row names, is active and
may write the journal. This module decides, from the row as read and nothing
else (no I/O, no clock of its own):

- an active renews every third of the lease, and steps down the moment a renewal
  fails, finds another holder or a higher epoch (`after_renewal`);
- a standby may take over once the lease has expired on the database's clock,
  with the next epoch (`takeover_epoch`).

The database applies the same conditions atomically (a conditional UPDATE), so
two candidates racing for one expired lease cannot both win it; the epoch is the
fencing token every journal append carries.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from timeslice.errors import InvalidArgumentError

#: How long a lease lasts by default, in seconds.
DEFAULT_LEADER_LEASE = 5.0
#: Bounds on a lease: long enough to renew over a real network, short enough to fail over.
MIN_LEADER_LEASE, MAX_LEADER_LEASE = 0.1, 3600.0


def check_lease(seconds: float) -> float:
    """`seconds`, if it is a usable lease length; InvalidArgumentError otherwise."""
    if not (isinstance(seconds, int | float) and math.isfinite(seconds)) or not (
        MIN_LEADER_LEASE <= seconds <= MAX_LEADER_LEASE
    ):
        raise InvalidArgumentError(
            f"leader lease must be between {MIN_LEADER_LEASE} and {MAX_LEADER_LEASE} seconds"
        )
    return float(seconds)


@dataclass(frozen=True, kw_only=True)
class LeaseRow:
    """The lease row as one statement read it, with the database's clock then."""

    epoch: int
    holder: str
    expires_at: float  # seconds, on the database's clock
    now: float  # the database's clock when the row was read
    address: str = ""  # where the holder serves, as it advertised at takeover ("": unknown)


class Role(enum.Enum):
    STANDBY = "standby"
    ACTIVE = "active"
    STEPPED_DOWN = "stepped_down"  # once active, deposed: it never writes again


@dataclass(frozen=True, kw_only=True)
class Standing:
    """Where one candidate stands: its role, and the epoch it holds when active."""

    role: Role
    epoch: int = 0
    why: str = ""  # why it stepped down


STANDBY = Standing(role=Role.STANDBY)


@dataclass(frozen=True, kw_only=True)
class Leadership:
    """What a status shows of one candidate: its role, the lease's epoch (its own
    when active, else the newest it saw; 0 without a lease), the lease's length
    (0: none, the only writer), the seconds the lease has left as last known,
    and the candidate holding it."""

    role: Role
    epoch: int = 0
    lease: float = 0.0
    left: float = 0.0
    holder: str = ""


def renew_every(lease: float) -> float:
    """How often an active renews: every third of the lease, so that one lost
    renewal still leaves a renewal's time before the lease runs out."""
    return lease / 3


#: The pause, as a share of the lease, before an active tries again a renewal
#: that got no answer or an error (see `renewal_wait`).
RETRY_SHARE = 1 / 30
#: Less time left than this (seconds) on an active's own clock: no renewal can
#: come back in time; it steps down.
MIN_RENEWAL_WAIT = 0.01


def renewal_wait(now: float, held_until: float, lease: float, retry: bool) -> float | None:
    """How long an active's renewal sent at `now` may wait for its answer: a third
    of the lease. A renewal that got no answer in time, or an error, is not a loss
    by itself: the active tries again (`retry`) `RETRY_SHARE` of a lease later, for
    as long as its lease surely holds by its own clock (`held_until`), each try
    waiting no longer than that; a database slow for a moment (a busy host, a
    failover's folding) must not depose it while nobody else may take the lease
    over. None: a retry has too little time left; it steps down. The first try
    after a renewal always goes out (the loop may have woken late): only the
    database's answer says whether the lease is still its own."""
    every = renew_every(lease)
    if not retry:
        return every
    left = held_until - now
    if left < MIN_RENEWAL_WAIT:
        return None
    return min(every, left)


#: The share of a lease an active counts on by its own clock after it sent the
#: statement that renewed it (see `held_until`).
LOCAL_SHARE = 0.9


def held_until(sent: float, lease: float) -> float:
    """Until when (on this process's monotonic clock) an active may act on a lease
    renewed, or taken, by a statement it sent at `sent`: the database set the
    expiry after it received the statement, so the lease lasts at least `lease`
    from `sent`; counting on only `LOCAL_SHARE` of it leaves room for the two
    clocks' rates to differ. Past it, an active that has not renewed meanwhile
    (it was frozen, its renewals hang) may have been replaced: it answers nothing
    more, even what needs no journal write."""
    return sent + lease * LOCAL_SHARE


def expired(row: LeaseRow) -> bool:
    """Whether the lease has run out on the database's clock (the takeover's
    `WHERE expires_at < now()`)."""
    return row.expires_at < row.now


def takeover_epoch(row: LeaseRow | None) -> int | None:
    """The epoch a standby takes the lease with, if it may take it now: one above
    the row's, once the row's lease has expired (no row yet: epoch 1). None: the
    lease is held; wait."""
    if row is None:
        return 1
    return row.epoch + 1 if expired(row) else None


def after_takeover(row: LeaseRow | None, me: str, epoch: int) -> Standing:
    """A standby's standing once its takeover statement ran: `row` is the row it
    wrote (None: the statement matched nothing, someone else won or the lease was
    renewed)."""
    if row is not None and row.holder == me and row.epoch == epoch:
        return Standing(role=Role.ACTIVE, epoch=epoch)
    return STANDBY


def after_renewal(standing: Standing, row: LeaseRow | None, me: str) -> Standing:
    """An active's standing once its renewal statement ran: `row` is the row the
    statement renewed (None: it matched nothing, or it failed). Anything but our
    own epoch and id, renewed, deposes it for good."""
    if standing.role is not Role.ACTIVE:
        return standing
    if row is None:
        return step_down(standing, "its leader lease could not be renewed")
    if row.epoch != standing.epoch or row.holder != me:
        return step_down(
            standing, f"another orchestrator holds the leader lease (epoch {row.epoch})"
        )
    return standing


def step_down(standing: Standing, why: str) -> Standing:
    """An active that may not write any more (a renewal or an append failed)."""
    if standing.role is Role.STANDBY:
        return standing
    if standing.role is Role.STEPPED_DOWN:
        return standing
    return Standing(role=Role.STEPPED_DOWN, epoch=standing.epoch, why=why)
