"""timeslice: accelerators shared between RL jobs, one holder at a time.

async with Orchestrator() as orch:                      # the lock service
    client = AsyncTimeSliceOrchestratorClient(orch.address, job_id="a", group_id="g")
    async with client.acquire():                         # exclusive accelerators
        train_step()
"""

from timeslice.client import (
    AcquireResult,
    AsyncTimeSliceOrchestratorClient,
    GroupLockState,
    GroupStatus,
    OrchestratorGroupStatus,
    TimeSliceOrchestratorClient,
    YieldResult,
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

__version__ = "0.1.0"

__all__ = [
    "AcquireResult",
    "AlreadyExistsError",
    "AsyncTimeSliceOrchestratorClient",
    "CancelledError",
    "ConflictError",
    "DeadlineExceededError",
    "GroupLockState",
    "GroupStatus",
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
    "TimeSliceError",
    "TimeSliceOrchestratorClient",
    "UnavailableError",
    "UnimplementedError",
    "YieldResult",
    "__version__",
]
