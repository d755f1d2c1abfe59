"""Clients of the timeslice services.

`AsyncTimeSliceOrchestratorClient` is the asyncio client of the orchestrator;
`TimeSliceOrchestratorClient` is the blocking one, with the signatures of the
v1alpha1 Python client. Likewise `AsyncSnapshotAgentClient` and
`SnapshotAgentClient` for a node's agent. `register_workload` connects a
workload that does its own offload to its node's agent.
"""

from timeslice.client._bridge import AcquireCall, OnAccelerators
from timeslice.client._leases import LeaseLostCallback
from timeslice.client._sync import TimeSliceOrchestratorClient
from timeslice.client.agent import (
    AsyncSnapshotAgentClient,
    OperationFailedError,
    SnapshotAgentClient,
    SnapshotAgentError,
)
from timeslice.client.agent_types import (
    AcceleratorStatus,
    GetOperationResponse,
    HealthResponse,
    JobStatus,
    ResetJobResponse,
    RestoreResponse,
    SnapshotResponse,
    StatusResponse,
    app_channel_config,
    app_endpoint_config,
    cuda_config,
    named_backend,
)
from timeslice.client.orchestrator import AsyncTimeSliceOrchestratorClient
from timeslice.client.workload import (
    WorkloadHandle,
    WorkloadRegistration,
    register_workload,
    register_workload_in_thread,
)
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
    "AcceleratorStatus",
    "AcquireCall",
    "AcquireResult",
    "AgentJobState",
    "AsyncSnapshotAgentClient",
    "AsyncTimeSliceOrchestratorClient",
    "ForceReleaseResult",
    "GetOperationResponse",
    "GroupLockState",
    "GroupStatus",
    "HealthResponse",
    "JobStatus",
    "LeaseInfo",
    "LeaseLostCallback",
    "OnAccelerators",
    "OperationFailedError",
    "OrchestratorConnectionError",
    "OrchestratorError",
    "OrchestratorGroupStatus",
    "OrchestratorInternalError",
    "OrchestratorInvalidArgumentError",
    "OrchestratorTimeoutError",
    "ResetJobResponse",
    "RestoreResponse",
    "SnapshotAgentClient",
    "SnapshotAgentError",
    "SnapshotAgentJobState",
    "SnapshotResponse",
    "StatusResponse",
    "TimeSliceOrchestratorClient",
    "WatchEvent",
    "WatchEventKind",
    "WorkloadHandle",
    "WorkloadRegistration",
    "YieldResult",
    "app_channel_config",
    "app_endpoint_config",
    "cuda_config",
    "named_backend",
    "register_workload",
    "register_workload_in_thread",
]
