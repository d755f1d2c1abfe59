"""The v1alpha1 Python client's import paths and error attributes, answered by ours.

Code written for it imports `timeslice.orchestrator` (its client, types and
exceptions) and `timeslice.snapshot_agent`, and reads `code` and `details` off a
`SnapshotAgentError`, comparing `code` with grpcio's `StatusCode`. The programs
in tests/v1alpha1 run such code end to end; here each name is checked alone.
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from timeslice.api.status import from_grpc_error
from timeslice.errors import (
    Code,
    InvalidArgumentError,
    NotFoundError,
    TimeSliceError,
    UnavailableError,
    as_code,
)

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT.parent / "shared" / "reference" / "v1alpha1" / "pkg" / "client" / "python"

# What the v1alpha1 package's modules export (their __all__, or what its README imports).
V1ALPHA1_NAMES = {
    "timeslice": ["SnapshotAgentClient", "TimeSliceOrchestratorClient"],
    "timeslice.orchestrator": [
        "TimeSliceOrchestratorClient",
        "OrchestratorError",
        "OrchestratorConnectionError",
        "OrchestratorTimeoutError",
        "OrchestratorInvalidArgumentError",
        "OrchestratorInternalError",
        "AgentJobState",
        "AcquireResult",
        "GroupLockState",
        "GroupStatus",
        "OrchestratorGroupStatus",
        "SnapshotAgentJobState",
        "YieldResult",
    ],
    "timeslice.orchestrator.types": [
        "GroupLockState",
        "AgentJobState",
        "AcquireResult",
        "YieldResult",
        "SnapshotAgentJobState",
        "GroupStatus",
        "OrchestratorGroupStatus",
    ],
    "timeslice.orchestrator.exceptions": [
        "OrchestratorError",
        "OrchestratorConnectionError",
        "OrchestratorTimeoutError",
        "OrchestratorInvalidArgumentError",
        "OrchestratorInternalError",
    ],
    "timeslice.snapshot_agent": ["SnapshotAgentClient", "WorkloadHandle", "register_workload"],
    "timeslice.snapshot_agent.client": ["SnapshotAgentClient", "SnapshotAgentError"],
    "timeslice.snapshot_agent.types": [
        "SnapshotResponse",
        "RestoreResponse",
        "HealthResponse",
        "GetOperationResponse",
        "JobStatus",
        "AcceleratorStatus",
        "StatusResponse",
    ],
    "timeslice.snapshot_agent.workload": ["WorkloadHandle", "register_workload"],
    "timeslice.snapshot_agent.adapters": ["resolve_adapter"],
    "timeslice.snapshot_agent.snapshot_agent_pb2": [
        "BackendConfig",
        "CudaBackendConfig",
        "AppChannelConfig",
        "AppEndpointConfig",
        "SUSPEND_MODE_OFFLOAD",
        "SUSPEND_MODE_DISCARD",
    ],
}

# Which of our names each answers with.
OURS = {
    ("timeslice.orchestrator", "TimeSliceOrchestratorClient"): "timeslice.client._sync",
    ("timeslice.orchestrator", "OrchestratorError"): "timeslice.errors",
    ("timeslice.orchestrator", "GroupStatus"): "timeslice.client.types",
    ("timeslice.snapshot_agent", "SnapshotAgentClient"): "timeslice.client.agent",
    ("timeslice.snapshot_agent", "register_workload"): "timeslice.client.workload",
    ("timeslice.snapshot_agent.client", "SnapshotAgentError"): "timeslice.errors",
}


@pytest.mark.parametrize(
    ("module", "name"),
    [(module, name) for module, names in V1ALPHA1_NAMES.items() for name in names],
)
def test_each_v1alpha1_import_resolves(module: str, name: str) -> None:
    value = getattr(importlib.import_module(module), name)
    ours = OURS.get((module, name))
    if ours is not None:
        assert getattr(value, "__module__", None) == ours


def test_the_reference_package_exports_nothing_more() -> None:
    # Read the v1alpha1 package's own __all__ lists where its sources are at hand.
    if not REFERENCE.is_dir():
        pytest.skip(f"no v1alpha1 package at {REFERENCE}")
    for module in ("timeslice", "timeslice.orchestrator", "timeslice.snapshot_agent"):
        path = REFERENCE.joinpath(*module.split("."), "__init__.py")
        tree = ast.parse(path.read_text())
        [listed] = [
            node.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
        ]
        assert set(ast.literal_eval(listed)) == set(V1ALPHA1_NAMES[module]), module


def loaded_by(statement: str) -> set[str]:
    code = f"import json, sys; {statement}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return set(json.loads(out))


def test_the_orchestrator_package_loads_its_client_names_only_when_used() -> None:
    loaded = loaded_by("import timeslice.orchestrator, timeslice.snapshot_agent")
    heavy = {m.partition(".")[0] for m in loaded} & {"asyncio", "grpclib", "betterproto2"}
    assert not heavy, sorted(heavy)
    assert "timeslice.client" not in loaded
    used = loaded_by("from timeslice.orchestrator import TimeSliceOrchestratorClient")
    assert "timeslice.client._sync" in used


def test_unknown_names_are_attribute_errors() -> None:
    import timeslice.orchestrator
    import timeslice.snapshot_agent

    for module in (timeslice.orchestrator, timeslice.snapshot_agent):
        with pytest.raises(AttributeError, match="no attribute 'Nope'"):
            module.Nope  # noqa: B018


@pytest.mark.parametrize("status", list(grpc.StatusCode), ids=lambda s: s.name)
def test_a_code_equals_grpcios_status_code_of_its_number(status: grpc.StatusCode) -> None:
    code = Code(status.value[0])
    assert code == status and status == code
    assert not code != status
    assert code.name == status.name
    others = [s for s in grpc.StatusCode if s is not status]
    assert all(code != other and not code == other for other in others)
    assert code == int(code) and hash(code) == hash(int(code))
    assert as_code(status) is code


def test_an_error_carries_code_and_details_as_the_v1alpha1_one() -> None:
    plain = NotFoundError("unknown job 'j'")
    assert (plain.code, plain.details) == (Code.NOT_FOUND, "unknown job 'j'")
    made = TimeSliceError("gRPC error", code=grpc.StatusCode.UNAVAILABLE, details="agent down")
    assert made.code == grpc.StatusCode.UNAVAILABLE and made.code is Code.UNAVAILABLE
    assert (made.message, made.details, made.status) == (
        "gRPC error",
        "agent down",
        Status.UNAVAILABLE,
    )
    assert TimeSliceError("x", code=3).code is Code.INVALID_ARGUMENT
    with pytest.raises(ValueError, match="not a gRPC status code"):
        TimeSliceError("x", code="NOT_FOUND")
    received = from_grpc_error(GRPCError(Status.NOT_FOUND, "unknown operation 'op-9'"))
    assert isinstance(received, NotFoundError)
    assert received.code == grpc.StatusCode.NOT_FOUND
    assert received.details == "unknown operation 'op-9'"


def test_snapshot_agent_error_catches_every_error_of_ours() -> None:
    from timeslice.snapshot_agent.client import SnapshotAgentError

    assert SnapshotAgentError is TimeSliceError
    for error in (NotFoundError("a"), UnavailableError("b"), InvalidArgumentError("c")):
        assert isinstance(error, SnapshotAgentError)


def test_the_pb2_constants_are_our_enums_under_their_proto_names() -> None:
    from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
    from timeslice.snapshot_agent import snapshot_agent_pb2 as pb2

    prefixes = {
        pb.Backend: "BACKEND_",
        pb.App: "APP_",
        pb.SuspendMode: "SUSPEND_MODE_",
        pb.OperationStatus: "OPERATION_STATUS_",
        pb.JobState: "JOB_STATE_",
    }
    for enum, prefix in prefixes.items():
        for member in enum:
            assert getattr(pb2, f"{prefix}{member.name}") is member
    config = pb2.BackendConfig(cuda=pb2.CudaBackendConfig())
    assert isinstance(config, pb.BackendConfig) and config.cuda is not None
