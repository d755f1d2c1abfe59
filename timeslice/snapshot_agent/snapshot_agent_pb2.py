"""The v1alpha1 client's `timeslice.snapshot_agent.snapshot_agent_pb2`: the agent's
messages and enums, as our generated (betterproto2) classes, and the enum values
at module level under their proto names, as protobuf's generated modules have them.

Messages are built with keyword arguments, as with protobuf
(``BackendConfig(cuda=CudaBackendConfig())``), and our clients take them. They
are not protobuf messages: protobuf's own methods (``HasField``,
``SerializeToString``) are not there and raise AttributeError.
"""

from timeslice.api.gen.snapshot_agent.v1alpha1 import (
    AcceleratorStatus,
    AgentCommand,
    App,
    AppChannelConfig,
    AppEndpointConfig,
    Backend,
    BackendConfig,
    CommandResult,
    CudaBackendConfig,
    DirectMemoryBackendConfig,
    GetOperationRequest,
    GetOperationResponse,
    JobState,
    JobStatus,
    MemoryRegion,
    MemoryRegionsBackendConfig,
    OperationStatus,
    ProcessTarget,
    RegisterWorkload,
    RestoreCommand,
    RestoreRequest,
    RestoreResponse,
    SnapshotCommand,
    SnapshotRequest,
    SnapshotResponse,
    StatusRequest,
    StatusResponse,
    SuspendMode,
    WorkloadCapabilities,
    WorkloadMessage,
)

BACKEND_UNSPECIFIED = Backend.UNSPECIFIED
BACKEND_CUDA = Backend.CUDA
APP_UNSPECIFIED = App.UNSPECIFIED
APP_VLLM = App.VLLM
APP_SGLANG = App.SGLANG
SUSPEND_MODE_UNSPECIFIED = SuspendMode.UNSPECIFIED
SUSPEND_MODE_OFFLOAD = SuspendMode.OFFLOAD
SUSPEND_MODE_DISCARD = SuspendMode.DISCARD
OPERATION_STATUS_UNSPECIFIED = OperationStatus.UNSPECIFIED
OPERATION_STATUS_PENDING = OperationStatus.PENDING
OPERATION_STATUS_COMPLETE = OperationStatus.COMPLETE
OPERATION_STATUS_FAILED = OperationStatus.FAILED
JOB_STATE_UNSPECIFIED = JobState.UNSPECIFIED
JOB_STATE_IDLE = JobState.IDLE
JOB_STATE_RUNNING = JobState.RUNNING
JOB_STATE_TRANSITIONING = JobState.TRANSITIONING
JOB_STATE_SAVED = JobState.SAVED
JOB_STATE_FAULTED = JobState.FAULTED

__all__ = [
    "APP_SGLANG",
    "APP_UNSPECIFIED",
    "APP_VLLM",
    "BACKEND_CUDA",
    "BACKEND_UNSPECIFIED",
    "JOB_STATE_FAULTED",
    "JOB_STATE_IDLE",
    "JOB_STATE_RUNNING",
    "JOB_STATE_SAVED",
    "JOB_STATE_TRANSITIONING",
    "JOB_STATE_UNSPECIFIED",
    "OPERATION_STATUS_COMPLETE",
    "OPERATION_STATUS_FAILED",
    "OPERATION_STATUS_PENDING",
    "OPERATION_STATUS_UNSPECIFIED",
    "SUSPEND_MODE_DISCARD",
    "SUSPEND_MODE_OFFLOAD",
    "SUSPEND_MODE_UNSPECIFIED",
    "AcceleratorStatus",
    "AgentCommand",
    "App",
    "AppChannelConfig",
    "AppEndpointConfig",
    "Backend",
    "BackendConfig",
    "CommandResult",
    "CudaBackendConfig",
    "DirectMemoryBackendConfig",
    "GetOperationRequest",
    "GetOperationResponse",
    "JobState",
    "JobStatus",
    "MemoryRegion",
    "MemoryRegionsBackendConfig",
    "OperationStatus",
    "ProcessTarget",
    "RegisterWorkload",
    "RestoreCommand",
    "RestoreRequest",
    "RestoreResponse",
    "SnapshotCommand",
    "SnapshotRequest",
    "SnapshotResponse",
    "StatusRequest",
    "StatusResponse",
    "SuspendMode",
    "WorkloadCapabilities",
    "WorkloadMessage",
]
