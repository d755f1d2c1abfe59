"""What goes into the lock table (events) and what comes out of it (effects).

Events are the inputs of `LockTable.handle`. Every event that changes the table
is journaled before its effects are acted on, and a restart folds the journal
through the same `handle`, so an event carries everything the table needs,
its own `now` included: the table never reads a clock.

Each event type says whether it is journaled (`journaling`): a KeepAlive
never is (it only moves an expiry, and every start gives each holder a fresh
lease anyway), and the events the shell sends on a timer or a report (a
revocation, a wait limit, a switch's end) only when they changed the table:
one that finds its grant already ended leaves nothing to replay.

Effects are what the shell must do after the journal write: answer a waiting
call, tell watchers. They are never journaled.

Events and effects are frozen and keyword-only: `Granted(group="g", job="a", ...)`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from timeslice.kinds import Liveness


class Reason(enum.StrEnum):
    """Why a waiter left a queue or a grant ended without a yield, as the wire and
    the journal spell it."""

    CANCELLED = "cancelled"
    WAIT_TIMEOUT = "wait timeout"
    NOT_RECLAIMED = "not reclaimed after restart"
    LEASE_EXPIRED = "lease expired"
    HOLD_LIMIT = "hold limit reached"
    NOT_DELIVERED = "grant not delivered"
    OPERATOR = "released by operator"
    QUARANTINED = "quarantined"
    HOLDER_GONE = "the holder's workload is gone"
    SWITCH_FAILED = "switch failed"


class Policy(enum.StrEnum):
    """How a group picks its next holder among its waiters (see `policies`)."""

    FIFO = "fifo"  # the earliest queued
    LRS = "lrs"  # least recently served first
    PRIORITY = "priority"  # highest first, with aging


class Journaling(enum.Enum):
    """Whether an event type is journaled."""

    ALWAYS = "always"
    IF_CHANGED = "if it changed the table"  # it had effects: else it changed nothing
    NEVER = "never"


# The `group` of a setting that holds for every group without one of its own.
EVERY_GROUP: Final = ""

# --- events ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Acquire:
    """`job` asks for `group`'s lock. `call_id` names this one waiting call."""

    journaling: ClassVar[Journaling] = Journaling.ALWAYS

    now: float
    group: str
    job: str
    call_id: str
    request_id: str = ""
    lease_ttl: float | None = None  # seconds; None: no expiry by silence
    wait_deadline: float | None = None  # absolute; None: wait without limit
    priority: int = 0  # higher is served first, under the priority policy
    more_groups: tuple[str, ...] = ()  # granted together with `group`, all or none
    # Who asked ("" unnamed: no auth policy, or trusted in-process code): the grant
    # and the place in the queue are bound to it (see `Holder.principal`).
    principal: str = ""
    # Drawn by the shell for this call, so that the lease id of the grant cannot be
    # guessed from what the group's status shows; journaled, so a replay rebuilds it.
    lease_secret: str = ""


@dataclass(frozen=True, kw_only=True)
class Yield:
    """The holder gives the lock back."""

    journaling: ClassVar[Journaling] = Journaling.ALWAYS

    now: float
    group: str
    job: str
    request_id: str = ""
    token: int | None = None  # when set, must be the current grant's
    principal: str = ""  # who asks: must be the grant's own (see `Acquire.principal`)


@dataclass(frozen=True, kw_only=True)
class KeepAlive:
    """The holder renews its lease."""

    journaling: ClassVar[Journaling] = Journaling.NEVER

    now: float
    group: str
    job: str
    lease_id: str
    principal: str = ""  # who asks: must be the grant's own (see `Acquire.principal`)


@dataclass(frozen=True, kw_only=True)
class DropWaiter:
    """A waiting call left: cancelled, timed out, or never came back after a start."""

    journaling: ClassVar[Journaling] = Journaling.IF_CHANGED

    now: float
    group: str
    job: str
    call_id: str
    reason: Reason


@dataclass(frozen=True, kw_only=True)
class Revoke:
    """The grant `token` ends without a yield: lease expired, hold limit, or a
    grant whose answer could not be delivered."""

    journaling: ClassVar[Journaling] = Journaling.IF_CHANGED

    now: float
    group: str
    token: int
    reason: Reason
    call_id: str = ""  # when set, only if the grant still belongs to this call


@dataclass(frozen=True, kw_only=True)
class ForceRelease:
    """An operator takes the lock away (from `job` only, when set)."""

    journaling: ClassVar[Journaling] = Journaling.ALWAYS

    now: float
    group: str
    job: str = ""
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class SetHoldLimit:
    """Configures the longest a holder may keep `group` (`EVERY_GROUP`: each without
    a limit of its own; None: no limit). With a
    `grace`, the holder is first asked to yield at the limit, and revoked only
    `grace` seconds later."""

    journaling: ClassVar[Journaling] = Journaling.ALWAYS

    now: float
    group: str
    max_hold: float | None
    grace: float = 0.0


@dataclass(frozen=True, kw_only=True)
class RequestYield:
    """The holder of grant `token` reached its hold limit: ask it to yield."""

    journaling: ClassVar[Journaling] = Journaling.IF_CHANGED

    now: float
    group: str
    token: int


@dataclass(frozen=True, kw_only=True)
class SetPolicy:
    """Configures how `group` (`EVERY_GROUP`: each without a policy of its own)
    picks its next holder among its waiters; under `Policy.PRIORITY` every `aging`
    seconds waited adds one, so that no waiter starves."""

    journaling: ClassVar[Journaling] = Journaling.ALWAYS

    now: float
    group: str
    policy: Policy
    aging: float = 60.0


@dataclass(frozen=True, kw_only=True)
class SetGroupNodes:
    """Names the nodes (agents) `group` spans: a grant on it first switches the
    contexts on every one of them."""

    journaling: ClassVar[Journaling] = Journaling.ALWAYS

    now: float
    group: str
    nodes: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class RegisterAgent:
    """The agent of `node` is reached at `address`."""

    journaling: ClassVar[Journaling] = Journaling.ALWAYS

    now: float
    node: str
    address: str


@dataclass(frozen=True, kw_only=True)
class SetJobBackend:
    """The backend `job`'s contexts need on `group`'s nodes (on `node` only, when
    set); sent to the agents with every switch, with the principal that registered
    it (`by`, "" when the caller had none), for the agents to check whose processes
    it names. `backend` None forgets it."""

    journaling: ClassVar[Journaling] = Journaling.ALWAYS

    now: float
    group: str
    job: str
    node: str
    backend: dict[str, Any] | None
    by: str = ""


@dataclass(frozen=True, kw_only=True)
class SwitchDone:
    """The agents finished the switch that grant `token` started (at `began`): every
    other live context of the group is saved and the holder's is live (`restored`
    when a restore brought it back), or the switch failed (`error`). `faults` are
    the jobs the agents quarantined on the way, with why. `steps` say what each
    node did: (node, job, "snapshot" or "restore", seconds, bytes moved)."""

    journaling: ClassVar[Journaling] = Journaling.IF_CHANGED

    now: float
    group: str
    token: int
    restored: bool
    faults: tuple[tuple[str, str], ...] = ()
    error: str = ""
    moved_bytes: int = 0
    began: float = 0.0
    steps: tuple[tuple[str, str, str, float, int], ...] = ()


@dataclass(frozen=True, kw_only=True)
class WorkloadSeen:
    """What the agents of `group`'s nodes see of `job`'s workload, one liveness per
    node. A holder that some agent saw, and that every agent now sees GONE, is
    revoked; a holder nobody sees (a job with no workload registered) never is."""

    journaling: ClassVar[Journaling] = Journaling.IF_CHANGED

    now: float
    group: str
    job: str
    seen: tuple[Liveness, ...]


@dataclass(frozen=True, kw_only=True)
class ResetJob:
    """An operator lifts `job`'s quarantine on `group`."""

    journaling: ClassVar[Journaling] = Journaling.ALWAYS

    now: float
    group: str
    job: str


@dataclass(frozen=True, kw_only=True)
class Recover:
    """The orchestrator started on this journal: a new epoch. Holders get a fresh
    lease; queued jobs and unclaimed grants must be claimed again within `grace`."""

    journaling: ClassVar[Journaling] = Journaling.ALWAYS

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
    | WorkloadSeen
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
        WorkloadSeen,
        ResetJob,
        Recover,
    )
}


def journaled(event: Event, effects: list[Any]) -> bool:
    """Whether `event`, handled with these `effects`, goes into the journal."""
    match event.journaling:
        case Journaling.ALWAYS:
            return True
        case Journaling.IF_CHANGED:
            return bool(effects)
        case Journaling.NEVER:
            return False
    raise TypeError(f"not a journaling: {event.journaling!r}")


def event_to_dict(event: Event) -> dict[str, Any]:
    """A JSON-ready dict of `event`, with its type under "kind". Its fields as they
    are: plain values, tuples of them, enums of strings, and one dict of plain values
    (`SetJobBackend.backend`), all of which JSON writes without a copy (a deep copy
    by `dataclasses.asdict` took three quarters of a journal row's encoding)."""
    return {"kind": type(event).__name__, **vars(event)}


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
    # Nor enums: give the fields of one back theirs.
    for name, kind in _ENUM_FIELDS.get(cls, {}).items():
        if name in fields:
            fields[name] = kind(fields[name])
    if cls is WorkloadSeen:
        fields["seen"] = tuple(Liveness(x) for x in fields["seen"])
    event: Event = cls(**fields)
    return event


_ENUM_FIELDS: Final[dict[type[Any], dict[str, type[enum.Enum]]]] = {
    DropWaiter: {"reason": Reason},
    Revoke: {"reason": Reason},
    SetPolicy: {"policy": Policy},
}


# --- effects --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LeaseInfo:
    """A holder's lease as the wire shows it. `ttl` 0: never expires by silence."""

    lease_id: str
    ttl: float
    expires_at: float | None


@dataclass(frozen=True, kw_only=True)
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


@dataclass(frozen=True, kw_only=True)
class Queued:
    """`job` waits for `group` at `position` (0: next)."""

    group: str
    job: str
    call_id: str
    position: int


@dataclass(frozen=True, kw_only=True)
class LeftQueue:
    """`job` no longer waits; fail its call `call_id` with `reason` (and `detail`:
    why a job was quarantined, say)."""

    group: str
    job: str
    call_id: str
    reason: Reason
    detail: str = ""

    @property
    def why(self) -> str:
        """The reason as the wire spells it."""
        return f"{self.reason}: {self.detail}" if self.detail else str(self.reason)


@dataclass(frozen=True, kw_only=True)
class Superseded:
    """A newer call of the same job took over the place of `call_id`."""

    group: str
    job: str
    call_id: str


@dataclass(frozen=True, kw_only=True)
class Yielded:
    """The answer to a `Yield`. `again`: the answer to a retry of a Yield already
    answered (the same request id): nothing happened now, so watchers, logs,
    metrics and timelines leave it out."""

    group: str
    job: str
    token: int
    pending_waiters: int
    snapshot_deferred: bool
    next_job: str
    again: bool = False


@dataclass(frozen=True, kw_only=True)
class Revoked:
    """`job` lost `group` without yielding, for `reason` (and `detail`: an
    operator's words, why a switch failed); its call `call_id` fails if it still
    waits (a grant whose switch failed)."""

    group: str
    job: str
    token: int
    reason: Reason
    detail: str = ""
    call_id: str = ""

    @property
    def why(self) -> str:
        """The reason as the wire spells it."""
        return f"{self.reason}: {self.detail}" if self.detail else str(self.reason)


@dataclass(frozen=True, kw_only=True)
class LeaseRenewed:
    """The answer to a `KeepAlive`; `yield_requested` once the hold limit is reached."""

    group: str
    job: str
    token: int
    lease: LeaseInfo
    yield_requested: bool = False


@dataclass(frozen=True, kw_only=True)
class YieldRequested:
    """`job` reached its hold limit: it is asked to yield before `revoke_at`."""

    group: str
    job: str
    token: int
    revoke_at: float


@dataclass(frozen=True, kw_only=True)
class SwitchStarted:
    """Grant `token` of `group` goes to `job` once the agents have switched the
    contexts: `previous` was the live one (as far as the table knows)."""

    group: str
    job: str
    token: int
    previous: str


@dataclass(frozen=True, kw_only=True)
class Quarantined:
    """`job` failed on `group`'s accelerators: it may not hold it until reset."""

    group: str
    job: str
    reason: str


@dataclass(frozen=True, kw_only=True)
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
