"""The v1alpha1 client's `timeslice.snapshot_agent.client`: the agent's clients
(`timeslice.client.agent`). `SnapshotAgentError` is the base of every error
timeslice raises, with `code` and `details` as the v1alpha1 one has them."""

from timeslice.client.agent import (
    AsyncSnapshotAgentClient,
    SnapshotAgentClient,
    SnapshotAgentError,
)

__all__ = ["AsyncSnapshotAgentClient", "SnapshotAgentClient", "SnapshotAgentError"]
