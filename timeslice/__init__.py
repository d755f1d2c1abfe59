"""timeslice: accelerators shared between RL jobs, one holder at a time.

async with Orchestrator() as orch:                      # the lock service
    client = AsyncTimeSliceOrchestratorClient(orch.address, job_id="a", group_id="g")
    async with client.acquire():                         # exclusive accelerators
        train_step()
"""

from timeslice.agent.server import Agent, AgentConfig
from timeslice.client import (
    AcquireResult,
    AsyncSnapshotAgentClient,
    AsyncTimeSliceOrchestratorClient,
    GroupLockState,
    GroupStatus,
    OrchestratorGroupStatus,
    SnapshotAgentClient,
    TimeSliceOrchestratorClient,
    YieldResult,
    register_workload,
    register_workload_in_thread,
)
from timeslice.errors import (
    AlreadyExistsError,
    CancelledError,
    ConflictError,
    DeadlineExceededError,
    InternalError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    NotHolderError,
    OrchestratorConnectionError,
    OrchestratorError,
    OrchestratorInternalError,
    OrchestratorInvalidArgumentError,
    OrchestratorTimeoutError,
    PermissionDeniedError,
    ResourceExhaustedError,
    TimeSliceError,
    UnavailableError,
    UnimplementedError,
)
from timeslice.orchestrator.server import Orchestrator, OrchestratorConfig
from timeslice.workloads import HostMemoryWorkload

__version__ = "0.1.0"

__all__ = [
    "AcquireResult",
    "Agent",
    "AgentConfig",
    "AlreadyExistsError",
    "AsyncSnapshotAgentClient",
    "AsyncTimeSliceOrchestratorClient",
    "CancelledError",
    "ConflictError",
    "DeadlineExceededError",
    "GroupLockState",
    "GroupStatus",
    "HostMemoryWorkload",
    "InternalError",
    "InvalidArgumentError",
    "LeaseLostError",
    "NotFoundError",
    "NotHolderError",
    "Orchestrator",
    "OrchestratorConfig",
    "OrchestratorConnectionError",
    "OrchestratorError",
    "OrchestratorGroupStatus",
    "OrchestratorInternalError",
    "OrchestratorInvalidArgumentError",
    "OrchestratorTimeoutError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "SnapshotAgentClient",
    "TimeSliceError",
    "TimeSliceOrchestratorClient",
    "UnavailableError",
    "UnimplementedError",
    "YieldResult",
    "__version__",
    "register_workload",
    "register_workload_in_thread",
]
