"""The v1alpha1 client's `timeslice.snapshot_agent.workload`: `register_workload`
and the `WorkloadHandle` it returns (`timeslice.client.workload`). Called from
plain code it returns once registered, served by a thread of its own, and
``handle.close()`` ends it; where an event loop runs, the registration starts on
that loop (``await`` the handle to wait until registered)."""

from timeslice.client.workload import WorkloadHandle, register_workload

__all__ = ["WorkloadHandle", "register_workload"]
