"""timeslice: accelerators shared between RL jobs, one holder at a time.

async with Orchestrator() as orch:                      # the lock service
    client = AsyncTimeSliceOrchestratorClient(orch.address, job_id="a", group_id="g")
    async with client.acquire():                         # exclusive accelerators
        train_step()

`import timeslice` loads only the exceptions: every other public name is
imported when first used (PEP 562), so that a client program loads no server,
SQL or numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from timeslice._lazy import lazy_exports
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
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
)

__version__ = "0.1.0"

# The public names imported on first use, and where each lives.
_LAZY: dict[str, str] = {
    "AcquireResult": "timeslice.client",
    "Agent": "timeslice.agent.server",
    "AgentConfig": "timeslice.agent.server",
    "AsyncSnapshotAgentClient": "timeslice.client",
    "AsyncTimeSliceOrchestratorClient": "timeslice.client",
    "GroupLockState": "timeslice.client",
    "GroupStatus": "timeslice.client",
    "HostMemoryWorkload": "timeslice.workloads",
    "Orchestrator": "timeslice.orchestrator.server",
    "OrchestratorConfig": "timeslice.orchestrator.server",
    "OrchestratorGroupStatus": "timeslice.client",
    "SnapshotAgentClient": "timeslice.client",
    "TimeSliceOrchestratorClient": "timeslice.client",
    "YieldResult": "timeslice.client",
    "register_workload": "timeslice.client",
    "register_workload_in_thread": "timeslice.client",
}

if TYPE_CHECKING:  # what the names are, for type checkers and editors
    from timeslice.agent.server import (
        Agent,
        AgentConfig,
    )
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
    from timeslice.orchestrator.server import (
        Orchestrator,
        OrchestratorConfig,
    )
    from timeslice.workloads import (
        HostMemoryWorkload,
    )


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
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "YieldResult",
    "__version__",
    "register_workload",
    "register_workload_in_thread",
]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
