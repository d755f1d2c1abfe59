"""What goes into the agent's job table (events) and what comes out of it
(effects), and the records it keeps: jobs and the operations that move them.

Events and effects are frozen and keyword-only. Every event the table handles
changes it, and the agent saves the table before it acts on the effects,
except the switch plan (`PlanSwitch`): a question about where the group's
contexts are, which changes nothing and is saved by nobody.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from timeslice.kinds import OpKind

SNAPSHOT: Final = OpKind.SNAPSHOT
RESTORE: Final = OpKind.RESTORE


class JobState(enum.Enum):
    """A job's context state, named as on the wire."""

    IDLE = "IDLE"
    RUNNING = "RUNNING"
    TRANSITIONING = "TRANSITIONING"
    SAVED = "SAVED"
    FAULTED = "FAULTED"


class OpStatus(enum.Enum):
    """An operation's status, named as on the wire."""

    PENDING = "PENDING"
    COMPLETE = "COMPLETE"
    FAILED = "FAILED"


# --- events ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Register:
    """A job becomes known with `backend`, or comes back (a workload that reconnected)."""

    now: float
    group: str
    job: str
    backend: str
    config: dict[str, Any]
    claims: tuple[str, ...] = ()
    state: JobState = JobState.RUNNING
    # Who registered it over a workload channel ("uid N" or "principal NAME"; ""
    # none): kept, so that after a restart another user cannot take the job over.
    owner: str = ""


@dataclass(frozen=True, kw_only=True)
class Start:
    """Start a snapshot or restore. `backend`/`config` name the job's backend when
    the job is not known yet (or must match it when it is)."""

    now: float
    kind: OpKind
    group: str
    job: str
    timeout: float
    token: int = 0
    backend: str | None = None
    config: dict[str, Any] | None = None
    claims: tuple[str, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)  # this operation's own (mode, tags)


@dataclass(frozen=True, kw_only=True)
class Finish:
    """The backend finished operation `op_id`."""

    now: float
    op_id: str
    ok: bool
    storage_bytes: int | None = None
    device_bytes: int | None = None
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class Lost:
    """The job's workload went away (its channel closed, its process ended)."""

    now: float
    group: str
    job: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class Forget:
    """The job's workload said goodbye: the job leaves the table (or, if an
    operation is moving it, is marked lost)."""

    now: float
    group: str
    job: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class Reset:
    """An operator clears the job's fault (through the orchestrator of `epoch`, when
    not 0: refused if a newer one has been seen)."""

    now: float
    group: str
    job: str
    epoch: int = 0


@dataclass(frozen=True, kw_only=True)
class TakeEpoch:
    """A command of orchestrator epoch `epoch` arrived, its epoch proven (or vouched
    for by the orchestrator): the table keeps the highest epoch seen, so that an
    orchestrator of a lower one (deposed, or frozen and woken) is refused. Taken
    before the command acts, so that the epoch is saved first."""

    now: float
    epoch: int


@dataclass(frozen=True, kw_only=True)
class Reconciled:
    """The backend says where the job's context is (None: it cannot tell)."""

    now: float
    group: str
    job: str
    state: JobState | None
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class Recover:
    """The agent started on its saved table."""

    now: float


@dataclass(frozen=True, kw_only=True)
class Tick:
    """Time passed: operations past their deadline fail; old ones are forgotten."""

    now: float


class SwitchStage(enum.Enum):
    """The steps of one node's part of a switch, in order."""

    SETTLE = "settle"  # wait for operations already moving the group's jobs
    EVICT = "evict"  # snapshot every other live context
    RESTORE = "restore"  # restore the next holder's, if it is saved
    REPORT = "report"  # say where the switch left the jobs


@dataclass(frozen=True, kw_only=True)
class PlanSwitch:
    """What stage `stage` of a switch of `group` to `job` (fencing `token`, sent by
    the orchestrator of `epoch`; 0: by no orchestrator) does: `jobs` are the
    group's jobs the orchestrator names, `registered` those of them with a
    backend registered (their contexts are live from their start, known here or
    not). A question: it changes nothing (its epoch is taken by `TakeEpoch`)."""

    changes_table: ClassVar[bool] = False

    now: float
    group: str
    job: str
    token: int
    stage: SwitchStage
    jobs: tuple[str, ...] = ()
    registered: tuple[str, ...] = ()
    epoch: int = 0


Event = (
    Register
    | Start
    | Finish
    | Lost
    | Forget
    | Reset
    | TakeEpoch
    | Reconciled
    | Recover
    | Tick
    | PlanSwitch
)

# --- effects --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Run:
    """Run operation `op_id` through its backend."""

    op_id: str


@dataclass(frozen=True, kw_only=True)
class Cancel:
    """Stop running operation `op_id` (its deadline passed)."""

    op_id: str


@dataclass(frozen=True, kw_only=True)
class Done:
    """Operation `op_id` finished: wake whoever waits for it."""

    op_id: str


@dataclass(frozen=True, kw_only=True)
class Reconcile:
    """Ask the job's backend where its context is."""

    group: str
    job: str


@dataclass(frozen=True, kw_only=True)
class AwaitOperations:
    """A switch waits for these operations to end first."""

    op_ids: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class StartOperations:
    """A switch starts `kind` for each of `jobs` (none: nothing to do), at once."""

    kind: OpKind
    jobs: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class SwitchEnded:
    """Where a switch left the group: whether it restored the next holder's context
    (a restore with its token, complete, the context RUNNING), the next holder's
    state (None: not known here), and the group's FAULTED jobs."""

    restored: bool
    next_state: JobState | None
    faulted: tuple[tuple[str, str], ...]


Effect = Run | Cancel | Done | Reconcile | AwaitOperations | StartOperations | SwitchEnded

# --- the table ------------------------------------------------------------------------


@dataclass(kw_only=True)
class Job:
    """One job's context on this node."""

    group: str
    job: str
    backend: str
    config: dict[str, Any]
    claims: list[str]
    state: JobState
    since: float
    fault: str = ""
    operation: str = ""  # the running or last operation
    owner: str = ""  # who registered its workload channel (see `Register.owner`)

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.job)


@dataclass(kw_only=True)
class Operation:
    """One snapshot or restore."""

    op_id: str
    kind: OpKind
    group: str
    job: str
    backend: str
    params: dict[str, Any]
    started: float
    deadline: float
    status: OpStatus = OpStatus.PENDING
    finished: float | None = None
    storage_bytes: int | None = None
    device_bytes: int | None = None
    error: str = ""
    token: int = 0  # the fencing token it was started with
