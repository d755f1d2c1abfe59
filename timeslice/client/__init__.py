"""Clients of the timeslice services.

`AsyncTimeSliceOrchestratorClient` is the asyncio client of the orchestrator;
`TimeSliceOrchestratorClient` is the blocking one, with the signatures of the
v1alpha1 Python client.
"""

from timeslice.client._bridge import AcquireCall, OnAccelerators
from timeslice.client._leases import LeaseLostCallback
from timeslice.client._sync import TimeSliceOrchestratorClient
from timeslice.client.orchestrator import AsyncTimeSliceOrchestratorClient
from timeslice.client.types import (
    AcquireResult,
    AgentJobState,
    ForceReleaseResult,
    GroupLockState,
    GroupStatus,
    LeaseInfo,
    OrchestratorGroupStatus,
    SnapshotAgentJobState,
    WatchEvent,
    WatchEventKind,
    YieldResult,
)
from timeslice.errors import (
    OrchestratorConnectionError,
    OrchestratorError,
    OrchestratorInternalError,
    OrchestratorInvalidArgumentError,
    OrchestratorTimeoutError,
)

__all__ = [
    "AcquireCall",
    "AcquireResult",
    "AgentJobState",
    "AsyncTimeSliceOrchestratorClient",
    "ForceReleaseResult",
    "GroupLockState",
    "GroupStatus",
    "LeaseInfo",
    "LeaseLostCallback",
    "OnAccelerators",
    "OrchestratorConnectionError",
    "OrchestratorError",
    "OrchestratorGroupStatus",
    "OrchestratorInternalError",
    "OrchestratorInvalidArgumentError",
    "OrchestratorTimeoutError",
    "SnapshotAgentJobState",
    "TimeSliceOrchestratorClient",
    "WatchEvent",
    "WatchEventKind",
    "YieldResult",
]
