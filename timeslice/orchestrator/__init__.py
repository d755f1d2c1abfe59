"""The orchestrator: the lock table and the service around it (`server.Orchestrator`).

The package also answers the v1alpha1 Python client's import paths, so that code
written for it runs unchanged: ``from timeslice.orchestrator import
OrchestratorError, TimeSliceOrchestratorClient, AcquireResult, ...``, and the
modules `timeslice.orchestrator.types` and `timeslice.orchestrator.exceptions`.
Those names are imported when first used (PEP 562), so that importing the lock
table (`timeslice.orchestrator.state`) loads no client, gRPC or asyncio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from timeslice._lazy import lazy_exports

# The v1alpha1 client's names, and the module of ours that has each.
_LAZY: dict[str, str] = {
    "TimeSliceOrchestratorClient": "timeslice.client",
    "OrchestratorError": "timeslice.errors",
    "OrchestratorConnectionError": "timeslice.errors",
    "OrchestratorTimeoutError": "timeslice.errors",
    "OrchestratorInvalidArgumentError": "timeslice.errors",
    "OrchestratorInternalError": "timeslice.errors",
    "AgentJobState": "timeslice.client",
    "AcquireResult": "timeslice.client",
    "GroupLockState": "timeslice.client",
    "GroupStatus": "timeslice.client",
    "OrchestratorGroupStatus": "timeslice.client",
    "SnapshotAgentJobState": "timeslice.client",
    "YieldResult": "timeslice.client",
}

if TYPE_CHECKING:
    from timeslice.client import (
        AcquireResult,
        AgentJobState,
        GroupLockState,
        GroupStatus,
        OrchestratorGroupStatus,
        SnapshotAgentJobState,
        TimeSliceOrchestratorClient,
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
    "AcquireResult",
    "AgentJobState",
    "GroupLockState",
    "GroupStatus",
    "OrchestratorConnectionError",
    "OrchestratorError",
    "OrchestratorGroupStatus",
    "OrchestratorInternalError",
    "OrchestratorInvalidArgumentError",
    "OrchestratorTimeoutError",
    "SnapshotAgentJobState",
    "TimeSliceOrchestratorClient",
    "YieldResult",
]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
