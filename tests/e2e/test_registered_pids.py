"""A `cuda` job registered through the orchestrator names only its principal's
processes: the orchestrator journals who registered each backend and sends the
name with every switch; the agent checks the job's pids as that principal's
(its `uids` in the agent's auth file) before it first acts on the job, refuses
the step otherwise, and the orchestrator quarantines the job with the reason.
Nothing is done to the processes the job named.

The processes are real and run under other users (a forked child switched to an
unused uid), so the test needs root; the CUDA driver is a stand-in that knows
them. It is skipped without root, except under CI=true, where it fails.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
from collections.abc import Iterator

import pytest

from tests.fakes.fake_cuda import FakeCuda, FakeNvml
from tests.optional import need_root
from tests.waiting import until
from timeslice.agent.server import Agent
from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
from timeslice.backends import BackendContext
from timeslice.backends.cuda import CudaBackend
from timeslice.client.orchestrator import AsyncTimeSliceOrchestratorClient
from timeslice.orchestrator.server import Orchestrator
from timeslice.security.principals import AuthPolicy, Principal, Role, token_sha256

pytestmark = pytest.mark.timeout(60)

TRAINER_UID, MALLORY_UID, VICTIM_UID = 48301, 48302, 48303  # no accounts needed
TOKENS = {name: f"t-{name}" for name in ("orchestrator", "agent-n1", "trainer", "mallory", "plain")}


def principal(name: str, role: Role, **rest: object) -> Principal:
    return Principal(name=name, role=role, token_sha256=token_sha256(TOKENS[name]), **rest)  # type: ignore[arg-type]


POLICY = AuthPolicy(
    (
        principal("orchestrator", Role.OPERATOR),
        principal("agent-n1", Role.AGENT, nodes=("n1",)),
        principal("trainer", Role.JOB, jobs=("a",), groups=("g",), uids=(TRAINER_UID,)),
        principal("mallory", Role.JOB, jobs=("m",), groups=("g",), uids=(MALLORY_UID,)),
        # No uids: of an agent that runs as root, it may name no process.
        principal("plain", Role.JOB, jobs=("p",), groups=("g",)),
    )
)


# What needs root here (the tests are skipped without it, but fail under CI=true).
NEEDS_ROOT = "processes of other users need root to start"


@pytest.fixture
def sleepers() -> Iterator[dict[int, subprocess.Popen[bytes]]]:
    """A sleeping process of each test user, by uid."""
    need_root(NEEDS_ROOT)
    started = {
        uid: subprocess.Popen(["sleep", "60"], user=uid) for uid in (TRAINER_UID, VICTIM_UID)
    }
    yield started
    for process in started.values():
        process.kill()
        process.wait()


def cuda(pid: int) -> pb.BackendConfig:
    return pb.BackendConfig(cuda=pb.CudaBackendConfig(explicit_target=pb.ProcessTarget(pids=[pid])))


async def test_a_registered_job_names_only_its_principals_processes(
    sleepers: dict[int, subprocess.Popen[bytes]], caplog: pytest.LogCaptureFixture
) -> None:
    mine, victim = sleepers[TRAINER_UID].pid, sleepers[VICTIM_UID].pid
    driver = FakeCuda()
    for pid in (mine, victim):
        driver.add_process(pid, device_bytes=1 << 20)
    async with (
        Orchestrator(auth=POLICY, agent_token=TOKENS["orchestrator"], switch_timeout=10) as orch,
        Agent(node_name="n1", backends=("noop",), orchestrator=orch.address, groups=("g",),
              auth=POLICY, orchestrator_token=TOKENS["agent-n1"]) as agent,
    ):  # fmt: skip
        context = BackendContext(agent.config.node_name, agent.channels)
        agent.backends["cuda"] = CudaBackend(context, driver.module(), FakeNvml(driver).module())
        await until(lambda: "n1" in orch.table.nodes.get("g", ()), "the agent joined g")
        clients = {
            job: AsyncTimeSliceOrchestratorClient(orch.address, job, "g", token=TOKENS[name],
                                                  credentials_from_env=False)
            for job, name in (("a", "trainer"), ("m", "mallory"), ("p", "plain"))
        }  # fmt: skip
        try:
            # Each registers a pid; only the trainer's is its own user's.
            await clients["a"].register_job(cuda(mine), node="n1")
            await clients["m"].register_job(cuda(victim), node="n1")
            await clients["p"].register_job(cuda(mine), node="n1")
            assert orch.table.registrant("g", "m", "n1") == "mallory"

            with caplog.at_level(logging.WARNING):
                # m's grant moves the other live contexts out: a's (its own
                # process, checkpointed) and p's (refused: quarantined).
                first = await clients["m"].acquire(timeout_sec=10)
                assert first.success
                await until(lambda: "p" in orch.table.groups["g"].quarantined, "p quarantined")
                assert driver.state_of(mine).name == "CU_PROCESS_STATE_CHECKPOINTED"
                # The switch to a moves m out: refused, m quarantined; a back in.
                waiter = asyncio.ensure_future(clients["a"].acquire(timeout_sec=10))
                await until(lambda: "a" in orch.table.groups["g"].queue, "a waits")
                await clients["m"].release()
                second = await waiter
                assert second.success and second.fencing_token > first.fencing_token
                await until(lambda: "m" in orch.table.groups["g"].quarantined, "m quarantined")
            assert driver.state_of(mine).name == "CU_PROCESS_STATE_RUNNING"

            quarantined = orch.table.groups["g"].quarantined
            assert f"pid {victim} is not principal mallory's" in quarantined["m"]
            assert f"it is uid {VICTIM_UID}'s" in quarantined["m"]
            assert "principal plain may name no processes" in quarantined["p"]
            # The victim's process was never touched; neither refused job is known.
            assert all(pid != victim for _, pid in driver.calls)
            assert driver.state_of(victim).name == "CU_PROCESS_STATE_RUNNING"
            assert agent.table.find("g", "m") is None and agent.table.find("g", "p") is None
            assert agent.table.find("g", "a") is not None
            assert "principal mallory" in caplog.text and f"pid {victim}" in caplog.text
            await clients["a"].release()
        finally:
            for client in clients.values():
                await client.close()
