"""Clients of the timeslice services.

`AsyncTimeSliceOrchestratorClient` is the asyncio client of the orchestrator;
`TimeSliceOrchestratorClient` is the blocking one, with the signatures of the
v1alpha1 Python client. Likewise `AsyncSnapshotAgentClient` and
`SnapshotAgentClient` for a node's agent. `register_workload` connects a
workload that does its own offload to its node's agent.

Each name is imported when first used (PEP 562), so that a program that needs
only the orchestrator's client loads neither the agent's nor the workload
channel's code, nor their generated messages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from timeslice._lazy import lazy_exports
from timeslice.errors import (
    OrchestratorConnectionError,
    OrchestratorError,
    OrchestratorInternalError,
    OrchestratorInvalidArgumentError,
    OrchestratorTimeoutError,
)

# The public names imported on first use, and where each lives.
_LAZY: dict[str, str] = {
    "AcceleratorStatus": "timeslice.client.agent_types",
    "AcquireCall": "timeslice.client._bridge",
    "AcquireResult": "timeslice.client.types",
    "AgentJobState": "timeslice.client.types",
    "AgentList": "timeslice.client.types",
    "Leadership": "timeslice.client.types",
    "AsyncSnapshotAgentClient": "timeslice.client.agent",
    "AsyncTimeSliceOrchestratorClient": "timeslice.client.orchestrator",
    "ForceReleaseResult": "timeslice.client.types",
    "GetOperationResponse": "timeslice.client.agent_types",
    "GroupLockState": "timeslice.client.types",
    "GroupStatus": "timeslice.client.types",
    "HealthResponse": "timeslice.client.agent_types",
    "JobStatus": "timeslice.client.agent_types",
    "KnownAgent": "timeslice.client.types",
    "LeaseInfo": "timeslice.client.types",
    "LeaseLostCallback": "timeslice.client._leases",
    "OnAccelerators": "timeslice.client._bridge",
    "OperationFailedError": "timeslice.client.agent",
    "OrchestratorGroupStatus": "timeslice.client.types",
    "ResetJobResponse": "timeslice.client.agent_types",
    "RestoreResponse": "timeslice.client.agent_types",
    "SnapshotAgentClient": "timeslice.client.agent",
    "SnapshotAgentError": "timeslice.client.agent",
    "SnapshotAgentJobState": "timeslice.client.types",
    "SnapshotResponse": "timeslice.client.agent_types",
    "StatusResponse": "timeslice.client.agent_types",
    "TimeSliceOrchestratorClient": "timeslice.client._sync",
    "WatchEvent": "timeslice.client.types",
    "WatchEventKind": "timeslice.client.types",
    "WorkloadHandle": "timeslice.client.workload",
    "WorkloadRegistration": "timeslice.client.workload",
    "YieldResult": "timeslice.client.types",
    "app_channel_config": "timeslice.client.agent_types",
    "app_endpoint_config": "timeslice.client.agent_types",
    "cuda_config": "timeslice.client.agent_types",
    "named_backend": "timeslice.client.agent_types",
    "register_workload": "timeslice.client.workload",
    "register_workload_in_thread": "timeslice.client.workload",
}

if TYPE_CHECKING:  # what the names are, for type checkers and editors
    from timeslice.client._bridge import (
        AcquireCall,
        OnAccelerators,
    )
    from timeslice.client._leases import (
        LeaseLostCallback,
    )
    from timeslice.client._sync import (
        TimeSliceOrchestratorClient,
    )
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
    from timeslice.client.orchestrator import (
        AsyncTimeSliceOrchestratorClient,
    )
    from timeslice.client.types import (
        AcquireResult,
        AgentJobState,
        AgentList,
        ForceReleaseResult,
        GroupLockState,
        GroupStatus,
        KnownAgent,
        Leadership,
        LeaseInfo,
        OrchestratorGroupStatus,
        SnapshotAgentJobState,
        WatchEvent,
        WatchEventKind,
        YieldResult,
    )
    from timeslice.client.workload import (
        WorkloadHandle,
        WorkloadRegistration,
        register_workload,
        register_workload_in_thread,
    )


__all__ = [
    "AcceleratorStatus",
    "AcquireCall",
    "AcquireResult",
    "AgentJobState",
    "AgentList",
    "AsyncSnapshotAgentClient",
    "AsyncTimeSliceOrchestratorClient",
    "ForceReleaseResult",
    "GetOperationResponse",
    "GroupLockState",
    "GroupStatus",
    "HealthResponse",
    "JobStatus",
    "KnownAgent",
    "Leadership",
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

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
