"""The v1alpha1 client's `timeslice.snapshot_agent.adapters`: how `register_workload`
drives a workload (`timeslice.client.adapters`), in the same order: explicit
callbacks, then a vLLM engine recognized by its class, then any object with
``snapshot(mode, tags)`` and ``restore(tags)``. The adapter `resolve_adapter`
returns is ours: its modes are named ("offload", "discard"), not wire numbers."""

from timeslice.client.adapters import (
    Capabilities,
    WorkloadAdapter,
    is_vllm_engine,
    resolve_adapter,
)

__all__ = ["Capabilities", "WorkloadAdapter", "is_vllm_engine", "resolve_adapter"]
