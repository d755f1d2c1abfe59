"""What goes into the lock table (events) and what comes out of it (effects).

Events are the inputs of `LockTable.handle`. Every event that changes the table
is journaled before its effects are acted on, and a restart folds the journal
through the same `handle`, so an event carries everything the table needs,
its own `now` included: the table never reads a clock.

Effects are what the shell must do after the journal write: answer a waiting
call, tell watchers. They are never journaled.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Final

# --- events ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Acquire:
    """`job` asks for `group`'s lock. `call_id` names this one waiting call."""

    now: float
    group: str
    job: str
    call_id: str
    request_id: str = ""
    lease_ttl: float | None = None  # seconds; None: no expiry by silence
    wait_deadline: float | None = None  # absolute; None: wait without limit
    priority: int = 0  # higher is served first, under the priority policy
    more_groups: tuple[str, ...] = ()  # granted together with `group`, all or none


@dataclass(frozen=True)
class Yield:
    """The holder gives the lock back."""

    now: float
    group: str
    job: str
    request_id: str = ""
    token: int | None = None  # when set, must be the current grant's


@dataclass(frozen=True)
class KeepAlive:
    """The holder renews its lease. Not journaled: it only moves an expiry, and
    every start gives each holder a fresh lease anyway."""

    now: float
    group: str
    job: str
    lease_id: str


@dataclass(frozen=True)
class DropWaiter:
    """A waiting call left: cancelled, timed out, or never came back after a start."""

    now: float
    group: str
    job: str
    call_id: str
    reason: str


@dataclass(frozen=True)
class Revoke:
    """The grant `token` ends without a yield: lease expired, hold limit, or a
    grant whose answer could not be delivered."""

    now: float
    group: str
    token: int
    reason: str
    call_id: str = ""  # when set, only if the grant still belongs to this call


@dataclass(frozen=True)
class ForceRelease:
    """An operator takes the lock away (from `job` only, when set)."""

    now: float
    group: str
    job: str = ""
    reason: str = ""


@dataclass(frozen=True)
class SetHoldLimit:
    """Configures the longest a holder may keep `group` (None: no limit). With a
    `grace`, the holder is first asked to yield at the limit, and revoked only
    `grace` seconds later."""

    now: float
    group: str
    max_hold: float | None
    grace: float = 0.0


@dataclass(frozen=True)
class RequestYield:
    """The holder of grant `token` reached its hold limit: ask it to yield."""

    now: float
    group: str
    token: int


@dataclass(frozen=True)
class SetPolicy:
    """Configures how `group` picks its next holder among its waiters ("" group: the
    default for every group): "fifo", "lrs" (least recently served first) or
    "priority" (highest first; every `aging` seconds waited adds one, so that no
    waiter starves)."""

    now: float
    group: str
    policy: str
    aging: float = 60.0


@dataclass(frozen=True)
class SetGroupNodes:
    """Names the nodes (agents) `group` spans: a grant on it first switches the
    contexts on every one of them."""

    now: float
    group: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class RegisterAgent:
    """The agent of `node` is reached at `address`."""

    now: float
    node: str
    address: str


@dataclass(frozen=True)
class SetJobBackend:
    """The backend `job`'s contexts need on `group`'s nodes (on `node` only, when
    set); sent to the agents with every switch. `backend` None forgets it."""

    now: float
    group: str
    job: str
    node: str
    backend: dict[str, Any] | None


@dataclass(frozen=True)
class SwitchDone:
    """The agents finished the switch that grant `token` started (at `began`): every
    other live context of the group is saved and the holder's is live (`restored`
    when a restore brought it back), or the switch failed (`error`). `faults` are
    the jobs the agents quarantined on the way, with why. `steps` say what each
    node did: (node, job, "snapshot" or "restore", seconds, bytes moved)."""

    now: float
    group: str
    token: int
    restored: bool
    faults: tuple[tuple[str, str], ...] = ()
    error: str = ""
    moved_bytes: int = 0
    began: float = 0.0
    steps: tuple[tuple[str, str, str, float, int], ...] = ()


@dataclass(frozen=True)
class ResetJob:
    """An operator lifts `job`'s quarantine on `group`."""

    now: float
    group: str
    job: str


@dataclass(frozen=True)
class Recover:
    """The orchestrator started on this journal: a new epoch. Holders get a fresh
    lease; queued jobs and unclaimed grants must be claimed again within `grace`."""

    now: float
    grace: float


Event = (
    Acquire
    | Yield
    | KeepAlive
    | DropWaiter
    | Revoke
    | ForceRelease
    | SetHoldLimit
    | SetPolicy
    | RequestYield
    | SetGroupNodes
    | RegisterAgent
    | SetJobBackend
    | SwitchDone
    | ResetJob
    | Recover
)

EVENT_TYPES: Final[dict[str, type[Any]]] = {
    cls.__name__: cls
    for cls in (
        Acquire,
        Yield,
        KeepAlive,
        DropWaiter,
        Revoke,
        ForceRelease,
        SetHoldLimit,
        SetPolicy,
        RequestYield,
        SetGroupNodes,
        RegisterAgent,
        SetJobBackend,
        SwitchDone,
        ResetJob,
        Recover,
    )
}


def event_to_dict(event: Event) -> dict[str, Any]:
    """A JSON-ready dict of `event`, with its type under "kind"."""
    return {"kind": type(event).__name__, **dataclasses.asdict(event)}


def event_from_dict(data: dict[str, Any]) -> Event:
    """The inverse of `event_to_dict`."""
    fields = dict(data)
    cls = EVENT_TYPES.get(fields.pop("kind", ""))
    if cls is None:
        raise ValueError(f"unknown event kind in {data!r}")
    # JSON has no tuples: give the tuple fields back their type.
    for name in ("nodes", "faults", "more_groups", "steps"):
        if name in fields:
            fields[name] = tuple(tuple(f) if isinstance(f, list) else f for f in fields[name])
    event: Event = cls(**fields)
    return event


# --- effects --------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseInfo:
    """A holder's lease as the wire shows it. `ttl` 0: never expires by silence."""

    lease_id: str
    ttl: float
    expires_at: float | None


@dataclass(frozen=True)
class Granted:
    """`job` now holds `group`; answer its waiting call `call_id` (if any).

    `must_deliver`: nobody has this grant yet, so if the answer cannot be
    delivered the grant is rolled back. False when a holder asks again for a
    grant it already took: losing that answer takes nothing away.
    """

    group: str
    job: str
    call_id: str
    token: int
    lease: LeaseInfo
    waited: float
    context_restored: bool
    must_deliver: bool = True
    switch_bytes: int = 0  # what the switch before this grant moved, on all nodes


@dataclass(frozen=True)
class Queued:
    """`job` waits for `group` at `position` (0: next)."""

    group: str
    job: str
    call_id: str
    position: int


@dataclass(frozen=True)
class LeftQueue:
    """`job` no longer waits; fail its call `call_id` with `reason`."""

    group: str
    job: str
    call_id: str
    reason: str


@dataclass(frozen=True)
class Superseded:
    """A newer call of the same job took over the place of `call_id`."""

    group: str
    job: str
    call_id: str


@dataclass(frozen=True)
class Yielded:
    """The answer to a `Yield`."""

    group: str
    job: str
    token: int
    pending_waiters: int
    snapshot_deferred: bool
    next_job: str


@dataclass(frozen=True)
class Revoked:
    """`job` lost `group` without yielding; its call `call_id` fails if it still
    waits (a grant whose switch failed)."""

    group: str
    job: str
    token: int
    reason: str
    call_id: str = ""


@dataclass(frozen=True)
class LeaseRenewed:
    """The answer to a `KeepAlive`; `yield_requested` once the hold limit is reached."""

    group: str
    job: str
    token: int
    lease: LeaseInfo
    yield_requested: bool = False


@dataclass(frozen=True)
class YieldRequested:
    """`job` reached its hold limit: it is asked to yield before `revoke_at`."""

    group: str
    job: str
    token: int
    revoke_at: float


@dataclass(frozen=True)
class SwitchStarted:
    """Grant `token` of `group` goes to `job` once the agents have switched the
    contexts: `previous` was the live one (as far as the table knows)."""

    group: str
    job: str
    token: int
    previous: str


@dataclass(frozen=True)
class Quarantined:
    """`job` failed on `group`'s accelerators: it may not hold it until reset."""

    group: str
    job: str
    reason: str


@dataclass(frozen=True)
class JobReset:
    """An operator lifted `job`'s quarantine on `group`."""

    group: str
    job: str


Effect = (
    Granted
    | Queued
    | LeftQueue
    | Superseded
    | Yielded
    | Revoked
    | LeaseRenewed
    | YieldRequested
    | SwitchStarted
    | Quarantined
    | JobReset
)

# Reasons, as the wire and the journal spell them.
REASON_CANCELLED: Final = "cancelled"
REASON_WAIT_TIMEOUT: Final = "wait timeout"
REASON_NOT_RECLAIMED: Final = "not reclaimed after restart"
REASON_LEASE_EXPIRED: Final = "lease expired"
REASON_HOLD_LIMIT: Final = "hold limit reached"
REASON_NOT_DELIVERED: Final = "grant not delivered"
REASON_OPERATOR: Final = "released by operator"
REASON_QUARANTINED: Final = "quarantined"
REASON_HOLDER_GONE: Final = "the holder's workload is gone"

# How a group picks its next holder.
POLICY_FIFO: Final = "fifo"
POLICY_LRS: Final = "lrs"
POLICY_PRIORITY: Final = "priority"
POLICIES: Final = (POLICY_FIFO, POLICY_LRS, POLICY_PRIORITY)
