"""The v1alpha1 client's `timeslice.snapshot_agent.types`: what the agent's clients
return (`timeslice.client.agent_types`), the v1alpha1 fields first and ours after
them, with defaults."""

from timeslice.client.agent_types import (
    AcceleratorStatus,
    GetOperationResponse,
    HealthResponse,
    JobStatus,
    RestoreResponse,
    SnapshotResponse,
    StatusResponse,
)

__all__ = [
    "AcceleratorStatus",
    "GetOperationResponse",
    "HealthResponse",
    "JobStatus",
    "RestoreResponse",
    "SnapshotResponse",
    "StatusResponse",
]
