# ruff: noqa: E402  (torch is imported through `need`, before what uses it)
"""A PyTorch model and its Adam optimizer, trained with a snapshot and a restore
through a real Agent between every step (Snapshot and Restore RPCs, the app_channel
backend, the workload channel, the registration's worker thread), end bit for bit
where the same training without them ends; the agent reports the bytes the
workload moved. CI installs the test extra (torch included): there a missing torch
fails instead of skipping."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.optional import need

torch = need("torch")  # the imports below need it first

from torch import nn

from tests.waiting import until
from timeslice.agent.server import Agent
from timeslice.client import AsyncSnapshotAgentClient, app_channel_config
from timeslice.client.workload import WorkloadRegistration, register_workload
from timeslice.workloads.torch import TensorSavedError, TorchWorkload

pytestmark = pytest.mark.timeout(90)

JOB, GROUP = "trainer", "g"


def make_model() -> nn.Module:
    torch.manual_seed(11)
    return nn.Sequential(nn.Linear(16, 64), nn.LayerNorm(64), nn.Tanh(), nn.Linear(64, 4))


def train_step(model: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    data = torch.Generator().manual_seed(1000 + step)
    x, target = torch.randn(64, 16, generator=data), torch.randn(64, 4, generator=data)
    opt.zero_grad()
    nn.functional.mse_loss(model(x), target).backward()
    opt.step()


def snapshot_of(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor | None]:
    found: dict[str, torch.Tensor | None] = {}
    for name, param in model.named_parameters():
        found[name] = param.detach().clone()
        found[f"{name}.grad"] = None if param.grad is None else param.grad.clone()
    names = {id(p): n for n, p in model.named_parameters()}
    for param, state in opt.state.items():
        for key, value in state.items():
            found[f"state[{names[id(param)]}].{key}"] = value.clone()
    return found


def assert_bit_identical(
    a: dict[str, torch.Tensor | None], b: dict[str, torch.Tensor | None]
) -> None:
    assert a.keys() == b.keys()
    for name, value in a.items():
        other = b[name]
        if value is None or other is None:
            assert value is other, name
        else:
            assert value.dtype == other.dtype and torch.equal(value, other), name


@pytest.fixture
async def client(agent: Agent) -> AsyncIterator[AsyncSnapshotAgentClient]:
    async with AsyncSnapshotAgentClient(agent.address) as running:
        yield running


async def registered(agent: Agent, workload: TorchWorkload) -> WorkloadRegistration:
    registration = await register_workload(
        agent.address, JOB, GROUP, workload=workload, connect_timeout_sec=5
    )
    await until(lambda: agent.channels.get(GROUP, JOB) is not None, "the workload registered")
    return registration


async def test_training_switched_out_and_back_through_the_agent_every_step_ends_bit_identical(
    agent: Agent, client: AsyncSnapshotAgentClient
) -> None:
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    ids = [id(p) for p in model.parameters()]
    group_ids = [[id(p) for p in g["params"]] for g in opt.param_groups]
    reference = make_model()
    ref_opt = torch.optim.Adam(reference.parameters(), lr=3e-3)

    workload = TorchWorkload(chunk_bytes=4096)
    workload.add_module(model, name="policy")
    workload.add_optimizer(opt, name="adam")
    registration = await registered(agent, workload)
    try:
        phases = [[], ["optimizer"], ["weights"]]
        for step in range(12):
            train_step(model, opt, step)
            train_step(reference, ref_opt, step)
            tags = phases[step * len(phases) // 12]  # 4 steps each: all, optimizer, weights
            expected = workload.moved_bytes(tags)
            keys = {id(p): sorted(s) for p, s in opt.state.items()}

            done = await client.snapshot_and_wait(
                JOB, GROUP, backend_config=app_channel_config("offload", tags), timeout_sec=30
            )
            assert (done.storage_bytes, done.snapshot_device_bytes) == (expected, expected), step
            assert workload.state == "SAVED"
            assert (await client.status()).job_statuses[0].state == "JOB_STATE_SAVED"
            with pytest.raises(TensorSavedError, match="restore first"):
                model(torch.randn(2, 16)) if tags != ["optimizer"] else opt.step()

            back = await client.restore_and_wait(
                JOB, GROUP, backend_config=app_channel_config(tags=tags), timeout_sec=30
            )
            assert back.storage_bytes == expected, step
            assert workload.state == "RUNNING" and workload.saved == frozenset()
            assert [id(p) for p in model.parameters()] == ids
            assert [[id(p) for p in g["params"]] for g in opt.param_groups] == group_ids
            assert {id(p): sorted(s) for p, s in opt.state.items()} == keys
    finally:
        await registration.close()
    assert_bit_identical(snapshot_of(model, opt), snapshot_of(reference, ref_opt))


async def test_gradients_discarded_through_the_agent_come_back_as_none(
    agent: Agent, client: AsyncSnapshotAgentClient
) -> None:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train_step(model, opt, 0)
    workload = TorchWorkload()
    workload.add_module(model, name="policy")
    workload.add_optimizer(opt, name="sgd")
    grads = workload.moved_bytes(["grads"])
    assert grads == sum(p.numel() * 4 for p in model.parameters())
    registration = await registered(agent, workload)
    try:
        done = await client.snapshot_and_wait(
            JOB, GROUP, backend_config=app_channel_config("discard", ["grads"]), timeout_sec=30
        )
        assert (done.storage_bytes, done.snapshot_device_bytes) == (0, grads)
        with pytest.raises(TensorSavedError, match=r"\.grad' .* discarded"):
            opt.step()
        await client.restore_and_wait(JOB, GROUP, timeout_sec=30)
        assert all(p.grad is None for p in model.parameters())
        assert workload.state == "RUNNING"
        train_step(model, opt, 1)  # training goes on
        assert all(p.grad is not None for p in model.parameters())
    finally:
        await registration.close()
