"""A job known by its pod (`ProcessTarget.pod_uid`), through the real services with
auth on both: registered by the orchestrator's discovery, its pod's CUDA processes
(found in a synthetic cgroup tree) are checkpointed when another job takes the
group; a job principal naming a pod, to the orchestrator or to the agent, is
PERMISSION_DENIED; and no auth file principal may take discovery's name."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.fake_cuda import FakeCuda, FakeNvml
from tests.unit.test_cgroups import UID, container, systemd_pod
from tests.waiting import until
from timeslice.agent.server import Agent
from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
from timeslice.backends import BackendContext
from timeslice.backends.cuda import CudaBackend
from timeslice.client.agent import AsyncSnapshotAgentClient
from timeslice.client.orchestrator import AsyncTimeSliceOrchestratorClient
from timeslice.errors import InvalidArgumentError, PermissionDeniedError
from timeslice.orchestrator.discovery import pod_backend
from timeslice.orchestrator.server import Orchestrator
from timeslice.security.principals import (
    DISCOVERY_REGISTRANT,
    AuthPolicy,
    Principal,
    Role,
    parse_auth,
    token_sha256,
)

pytestmark = pytest.mark.timeout(30)

TOKENS = {name: f"t-{name}" for name in ("orchestrator", "agent-n1", "trainer")}
POLICY = AuthPolicy(
    (
        Principal(name="orchestrator", role=Role.OPERATOR, token_sha256=token_sha256(TOKENS["orchestrator"])),
        Principal(name="agent-n1", role=Role.AGENT, token_sha256=token_sha256(TOKENS["agent-n1"]), nodes=("n1",)),
        Principal(name="trainer", role=Role.JOB, token_sha256=token_sha256(TOKENS["trainer"]), jobs=("a",), groups=("g",)),
    )
)  # fmt: skip


def pod_config(uid: str = UID) -> pb.BackendConfig:
    return pb.BackendConfig(
        cuda=pb.CudaBackendConfig(explicit_target=pb.ProcessTarget(pod_uid=uid))
    )


@pytest.fixture
def sleeper() -> Iterator[int]:
    child = subprocess.Popen(["sleep", "30"])
    yield child.pid
    child.kill()
    child.wait()


async def test_a_discovered_pod_is_switched_and_a_job_may_not_name_one(
    tmp_path: Path, sleeper: int
) -> None:
    driver = FakeCuda()
    driver.add_process(sleeper, device_bytes=1 << 20)
    container(systemd_pod(tmp_path, UID), "cri-containerd-main.scope", [sleeper])
    async with (
        Orchestrator(auth=POLICY, agent_token=TOKENS["orchestrator"], switch_timeout=10) as orch,
        Agent(node_name="n1", backends=("noop",), orchestrator=orch.address, groups=("g",),
              auth=POLICY, orchestrator_token=TOKENS["agent-n1"]) as agent,
    ):  # fmt: skip
        context = BackendContext("n1", agent.channels, cgroup_root=str(tmp_path))
        agent.backends["cuda"] = CudaBackend(context, driver.module(), FakeNvml(driver).module())
        await until(lambda: "n1" in orch.table.nodes.get("g", ()), "the agent joined g")
        trainer = AsyncTimeSliceOrchestratorClient(
            orch.address, "a", "g", token=TOKENS["trainer"], credentials_from_env=False
        )
        direct = AsyncSnapshotAgentClient(
            agent.address, token=TOKENS["trainer"], credentials_from_env=False
        )
        try:
            # Discovery registers the pod's job; the trainer's acquire moves it out.
            await orch.register_job("g", "d", "n1", pod_backend(UID), by=DISCOVERY_REGISTRANT)
            await orch.acquire("g", "d", wait_timeout=5)
            await orch.force_release("g", "d", reason="test")
            grant = await trainer.acquire(timeout_sec=10)
            assert grant.success
            await until(
                lambda: driver.state_of(sleeper).name == "CU_PROCESS_STATE_CHECKPOINTED",
                "the pod's process checkpointed",
            )
            assert "d" not in orch.table.groups["g"].quarantined
            assert agent.table.find("g", "d") is not None
            # A job principal may name no pod, to either service.
            with pytest.raises(PermissionDeniedError, match="may not name a pod"):
                await trainer.register_job(pod_config(), node="n1")
            with pytest.raises(PermissionDeniedError, match="may name a pod"):
                await direct.snapshot("a", "g", pod_config())
            # Nor act on the job known by its pod.
            with pytest.raises(PermissionDeniedError):
                await direct.snapshot("d", "g")
            await trainer.release()
        finally:
            await trainer.close()
            await direct.close()


async def test_a_pod_registered_by_anyone_else_is_refused_by_the_agent(
    tmp_path: Path, sleeper: int
) -> None:
    driver = FakeCuda()
    driver.add_process(sleeper, device_bytes=1 << 20)
    container(systemd_pod(tmp_path, UID), "c.scope", [sleeper])
    async with (
        Orchestrator(auth=POLICY, agent_token=TOKENS["orchestrator"], switch_timeout=10) as orch,
        Agent(node_name="n1", backends=("noop",), orchestrator=orch.address, groups=("g",),
              auth=POLICY, orchestrator_token=TOKENS["agent-n1"]) as agent,
    ):  # fmt: skip
        context = BackendContext("n1", agent.channels, cgroup_root=str(tmp_path))
        agent.backends["cuda"] = CudaBackend(context, driver.module(), FakeNvml(driver).module())
        await until(lambda: "n1" in orch.table.nodes.get("g", ()), "the agent joined g")
        # Registered in the table by a job's name (as an orchestrator without the
        # check would): the agent refuses it, and the job is quarantined.
        await orch.register_job("g", "d", "n1", pod_backend(UID), by="trainer")
        await orch.acquire("g", "d", wait_timeout=5)
        await orch.force_release("g", "d", reason="test")
        await orch.acquire("g", "other", wait_timeout=5)
        await until(lambda: "d" in orch.table.groups["g"].quarantined, "d quarantined")
        assert "may name a pod" in orch.table.groups["g"].quarantined["d"]
        assert driver.state_of(sleeper).name == "CU_PROCESS_STATE_RUNNING"


def test_no_principal_may_take_discoverys_name() -> None:
    entry = {"name": DISCOVERY_REGISTRANT, "role": "operator", "token_sha256": "0" * 64}
    with pytest.raises(InvalidArgumentError, match="reserved"):
        parse_auth({"principal": [entry]}, "auth.toml")
