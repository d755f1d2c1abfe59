"""The fault schedule of one run, drawn from its seed alone: the same seed gives the
same faults at the same offsets, so a failing run can be run again as it was.

What is drawn at plan time is what the seed can decide: the kind, when, which
node or job, how long it stays down. Who holds the group when a fault strikes
is only known then: a fault aimed at "the holder" names `HOLDER`, and the
campaign resolves it when the fault runs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final

KILL_ORCHESTRATOR: Final = "kill-orchestrator"  # SIGKILL, then restart on its journal
KILL_AGENT: Final = "kill-agent"  # SIGKILL, then restart on its job table
STOP_HOLDER: Final = "stop-holder"  # SIGSTOP past its lease, then SIGCONT
KILL_JOB: Final = "kill-job"  # SIGKILL, then restarted or not
KINDS: Final = (KILL_ORCHESTRATOR, KILL_AGENT, STOP_HOLDER, KILL_JOB)
# How often each kind is drawn, relative to the others.
WEIGHTS: Final = (3, 3, 3, 3)

# With several orchestrators on one PostgreSQL journal, the faults of the active:
KILL_ACTIVE: Final = "kill-active"  # SIGKILL; restarted later, as a standby
STOP_ACTIVE: Final = "stop-active"  # SIGSTOP past the leader lease, then SIGCONT
CUT_ACTIVE: Final = "cut-active"  # cut off from PostgreSQL, its jobs still reaching it
ACTIVE_KINDS: Final = (KILL_ACTIVE, STOP_ACTIVE, CUT_ACTIVE)
# Those drawn in such a run, and how often (the active's faults most).
HA_KINDS: Final = (*ACTIVE_KINDS, KILL_AGENT, STOP_HOLDER, KILL_JOB)
HA_WEIGHTS: Final = (4, 4, 4, 1, 1, 1)

HOLDER: Final = "@holder"


@dataclass(frozen=True)
class Fault:
    """One fault: `kind` at `at` seconds into the fault phase, on `target` (a node
    for an agent, a job or `HOLDER` for a job), down or stopped for `down` seconds;
    a killed job comes back only when `restart`."""

    at: float
    kind: str
    target: str = ""
    down: float = 0.0
    restart: bool = True

    def describe(self) -> str:
        target = f" {self.target}" if self.target else ""
        back = "" if self.restart else ", not restarted"
        return f"{self.at:5.1f}s {self.kind}{target} ({self.down:.1f}s{back})"


@dataclass(frozen=True)
class Plan:
    """Every fault of one run, in the order they run."""

    seed: int
    duration: float
    faults: tuple[Fault, ...]


def plan_faults(
    seed: int,
    *,
    duration: float,
    nodes: tuple[str, ...],
    jobs: tuple[str, ...],
    lease: float,
    min_faults: int = 3,
    max_faults: int = 8,
    min_live_jobs: int = 2,
    leader_lease: float | None = None,
) -> Plan:
    """`min_faults` to `max_faults` faults spread over `duration` seconds. A job is
    killed for good only while at least `min_live_jobs` others stay, so that the
    group still has jobs to hand over between. With `leader_lease` (several
    orchestrators), the faults are mostly the active's (`HA_KINDS`)."""
    rng = random.Random(seed)
    count = rng.randint(min_faults, max_faults)
    offsets = sorted(rng.uniform(0.0, duration) for _ in range(count))
    live = list(jobs)
    faults = []
    kinds, weights = (HA_KINDS, HA_WEIGHTS) if leader_lease is not None else (KINDS, WEIGHTS)
    for at in offsets:
        kind = rng.choices(kinds, weights)[0]
        if kind in ACTIVE_KINDS:
            assert leader_lease is not None
            # A frozen or cut-off active stays so past its lease; a killed one
            # stays down a while before its supervisor starts it again.
            faults.append(Fault(at, kind, down=leader_lease + rng.uniform(0.5, 2.0)))
        elif kind == KILL_ORCHESTRATOR:
            faults.append(Fault(at, kind, down=rng.uniform(0.1, 2.0)))
        elif kind == KILL_AGENT:
            faults.append(Fault(at, kind, rng.choice(nodes), down=rng.uniform(0.1, 2.0)))
        elif kind == STOP_HOLDER:
            # Past its lease: the orchestrator revokes it while it cannot answer.
            faults.append(Fault(at, kind, HOLDER, down=lease + rng.uniform(0.5, 4.0)))
        else:
            target = HOLDER if rng.random() < 0.5 else rng.choice(live)
            restart = rng.random() < 0.7 or target == HOLDER or len(live) <= min_live_jobs
            if not restart:
                live.remove(target)
            faults.append(Fault(at, kind, target, down=rng.uniform(0.1, 2.0), restart=restart))
    return Plan(seed, duration, tuple(faults))
