"""What a workload registers as `pipelined`, on the wire and as the agent reads it."""

from __future__ import annotations

from timeslice.agent.messages import capabilities_of
from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
from timeslice.client.adapters import resolve_adapter
from timeslice.client.registration import _wire_capabilities
from timeslice.workloads import HostMemoryWorkload


class Whole:
    """A workload of its own that moves everything whatever the tags."""

    pipelined = "yes"  # not True: not taken for it

    def snapshot(self, mode: str, tags: list[str]) -> None:
        return None

    def restore(self, tags: list[str]) -> None:
        return None


class Tagged(Whole):
    pipelined = True


def registered(workload: object | None = None, **callbacks: object) -> pb.WorkloadCapabilities:
    adapter = resolve_adapter(workload, **callbacks)  # type: ignore[arg-type]
    return _wire_capabilities(adapter.capabilities())


def test_the_reference_workloads_register_as_pipelined() -> None:
    with HostMemoryWorkload() as memory:
        wire = registered(memory)
    assert wire.pipelined
    register = pb.RegisterWorkload(job_id="j", capabilities=wire)
    assert capabilities_of(register).pipelined


def test_only_a_workload_that_says_true_is_pipelined() -> None:
    assert registered(Tagged()).pipelined
    assert not registered(Whole()).pipelined
    assert not registered(on_snapshot=lambda m, t: None, on_restore=lambda t: None).pipelined
    unsaid = pb.RegisterWorkload(job_id="j", capabilities=pb.WorkloadCapabilities())
    assert not capabilities_of(unsaid).pipelined
