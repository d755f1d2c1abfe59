"""The v1alpha1 client's `timeslice.orchestrator.types`: what the orchestrator's
clients return (`timeslice.client.types`), the v1alpha1 fields first and ours
after them, with defaults."""

from timeslice.client.types import (
    AcquireResult,
    AgentJobState,
    GroupLockState,
    GroupStatus,
    OrchestratorGroupStatus,
    SnapshotAgentJobState,
    YieldResult,
)

__all__ = [
    "AcquireResult",
    "AgentJobState",
    "GroupLockState",
    "GroupStatus",
    "OrchestratorGroupStatus",
    "SnapshotAgentJobState",
    "YieldResult",
]
