"""Another gRPC implementation speaks to our TLS: a program with the official
`grpcio` stubs of the v1alpha1 protocol, over mTLS with its token as grpcio's own
call credentials (`authorization: Bearer ...`), acquires and yields a group on a
secured Orchestrator; with an unknown token it is UNAUTHENTICATED."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import grpc
import pytest

from tests.certs import Certs
from timeslice.orchestrator.server import Orchestrator
from timeslice.security.principals import AuthPolicy, Principal, Role, token_sha256
from timeslice.security.tls import ServerTls

from grpcio_compat import compiled, serving_in_thread

pytestmark = pytest.mark.timeout(60)

TOKEN = "grpcio-job-token"


@pytest.fixture(scope="module")
def v1alpha1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModuleType, ModuleType]]:
    with compiled(["v1alpha1_orchestrator.proto"], tmp_path_factory.mktemp("gen")) as modules:
        yield modules["v1alpha1_orchestrator_pb2"], modules["v1alpha1_orchestrator_pb2_grpc"]


def test_a_grpcio_program_acquires_over_mtls_with_its_token(
    v1alpha1: tuple[ModuleType, ModuleType], certs: Certs, tmp_path: Path
) -> None:
    pb2, pb2_grpc = v1alpha1
    policy = AuthPolicy(
        principals=(
            Principal(
                name="trainer",
                role=Role.JOB,
                token_sha256=token_sha256(TOKEN),
                jobs=("trainer-a",),
                groups=("g",),
            ),
        )
    )
    tls = ServerTls(cert=certs.server.cert, key=certs.server.key, client_ca=certs.ca)
    pair = certs.client("trainer-a")

    def channel(token: str) -> grpc.Channel:
        credentials = grpc.composite_channel_credentials(
            grpc.ssl_channel_credentials(
                root_certificates=Path(certs.ca).read_bytes(),
                private_key=Path(pair.key).read_bytes(),
                certificate_chain=Path(pair.cert).read_bytes(),
            ),
            grpc.access_token_call_credentials(token),
        )
        return grpc.secure_channel(address, credentials, options=[("grpc.enable_http_proxy", 0)])

    with serving_in_thread(
        lambda: Orchestrator(db=f"sqlite:///{tmp_path / 'j.db'}", tls=tls, auth=policy),
        "orchestrator",
    ) as address:
        with channel(TOKEN) as ch:
            stub = pb2_grpc.TimeSliceOrchestratorServiceStub(ch)
            granted = stub.Acquire(pb2.AcquireRequest(job_id="trainer-a", group_id="g"), timeout=10)
            assert granted.success
            status = stub.GetGroupStatus(pb2.GetGroupStatusRequest(group_id="g"), timeout=10)
            assert status.group.locking_job == "trainer-a"
            assert stub.Yield(pb2.YieldRequest(job_id="trainer-a", group_id="g"), timeout=10)
        with channel("not-the-token") as ch:
            stub = pb2_grpc.TimeSliceOrchestratorServiceStub(ch)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Acquire(pb2.AcquireRequest(job_id="trainer-a", group_id="g"), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
