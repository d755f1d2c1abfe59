"""Workloads that register with an agent and do their own offload.

`HostMemoryWorkload` is the reference: named numpy arrays standing for a job's
accelerator memory, moved to host memory (or files) and back, so that tests and
the demo can run the whole protocol on a machine with no accelerator.
"""

from timeslice.workloads.hostmem import ArraySavedError, HostMemoryWorkload

__all__ = ["ArraySavedError", "HostMemoryWorkload"]
