"""The v1alpha1 Python client's `timeslice.snapshot_agent`, answered by ours: code
written for it (``from timeslice.snapshot_agent import SnapshotAgentClient,
register_workload``) runs unchanged against our agent.

The names are our clients (`timeslice.client`), imported when first used
(PEP 562). Its modules are here too: `client`, `types`, `workload`,
`adapters`, and `snapshot_agent_pb2`, whose messages are ours (betterproto2,
built with keyword arguments as the v1alpha1 README shows:
``snapshot_agent_pb2.BackendConfig(cuda=snapshot_agent_pb2.CudaBackendConfig())``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from timeslice._lazy import lazy_exports

# The public names, and the module of ours that has each.
_LAZY: dict[str, str] = {
    "AsyncSnapshotAgentClient": "timeslice.client",
    "SnapshotAgentClient": "timeslice.client",
    "SnapshotAgentError": "timeslice.client",
    "WorkloadHandle": "timeslice.client",
    "register_workload": "timeslice.client",
}

if TYPE_CHECKING:
    from timeslice.client import (
        AsyncSnapshotAgentClient,
        SnapshotAgentClient,
        SnapshotAgentError,
        WorkloadHandle,
        register_workload,
    )


__all__ = [
    "AsyncSnapshotAgentClient",
    "SnapshotAgentClient",
    "SnapshotAgentError",
    "WorkloadHandle",
    "register_workload",
]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
