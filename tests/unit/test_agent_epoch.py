"""The agent's job table fences the orchestrator's epoch: it keeps the highest
epoch taken, saved with the table, and refuses a switch or a reset of a lower
one (a deposed orchestrator's), naming both epochs; epoch 0 (no orchestrator's
command) is not fenced."""

from __future__ import annotations

import json

import pytest
from grpclib.const import Status

from tests.unit.test_agent_state import Harness
from timeslice.agent.state import (
    AwaitOperations,
    JobState,
    JobTable,
    PlanSwitch,
    Reconcile,
    Reset,
    StartOperations,
    SwitchEnded,
    SwitchStage,
    TakeEpoch,
)
from timeslice.api.status import to_grpc_error
from timeslice.errors import ConflictError, InvalidArgumentError
from timeslice.fencing import new_key, proves, token_proof

REFUSED = "a command of orchestrator epoch 3, but epoch 4 has taken over: refused"


def plan(stage: SwitchStage, epoch: int, token: int = 0) -> PlanSwitch:
    return PlanSwitch(now=1.0, group="g", job="b", token=token, stage=stage, epoch=epoch)


@pytest.fixture
def t() -> Harness:
    harness = Harness()
    harness.register("a")
    harness.register("b", state=JobState.SAVED)
    return harness


def test_the_table_keeps_the_highest_epoch_and_refuses_a_lower_one(t: Harness) -> None:
    for epoch in (2, 4, 4):
        assert t.handle(TakeEpoch(now=1.0, epoch=epoch)) == []
    assert t.table.orchestrator_epoch == 4
    error = t.refuse(TakeEpoch(now=2.0, epoch=3), ConflictError)
    assert error.message == REFUSED
    assert to_grpc_error(error).status is Status.FAILED_PRECONDITION
    assert t.table.orchestrator_epoch == 4


@pytest.mark.parametrize("stage", list(SwitchStage))
def test_every_stage_of_a_deposed_orchestrators_switch_is_refused(
    t: Harness, stage: SwitchStage
) -> None:
    t.handle(TakeEpoch(now=1.0, epoch=4))
    error = t.refuse(plan(stage, 3), ConflictError)
    assert error.message == REFUSED
    for epoch in (4, 5, 0):  # the newest, one not taken yet, and no orchestrator's
        [answer] = t.handle(plan(stage, epoch))
        assert isinstance(answer, AwaitOperations | StartOperations | SwitchEnded)


def test_a_deposed_orchestrators_switch_is_refused_before_its_token_is_looked_at(
    t: Harness,
) -> None:
    t.snapshot("a", token=7)
    t.handle(TakeEpoch(now=1.0, epoch=4))
    # Its token is the newest the group has seen: only the epoch tells it apart.
    error = t.refuse(plan(SwitchStage.SETTLE, 3, token=7), ConflictError)
    assert "epoch 4 has taken over" in error.message


def test_a_reset_of_a_deposed_orchestrator_is_refused_and_the_job_stays_faulted(
    t: Harness,
) -> None:
    t.faulted("a")
    t.handle(TakeEpoch(now=1.0, epoch=4))
    error = t.refuse(Reset(now=2.0, group="g", job="a", epoch=3), ConflictError)
    assert error.message == REFUSED
    assert t.state("a") is JobState.FAULTED
    assert t.handle(Reset(now=3.0, group="g", job="a", epoch=4)) == [Reconcile(group="g", job="a")]


def test_epoch_zero_is_not_fenced(t: Harness) -> None:
    t.handle(TakeEpoch(now=1.0, epoch=4))
    assert t.handle(TakeEpoch(now=1.0, epoch=0)) == []
    assert t.table.orchestrator_epoch == 4
    t.faulted("a")
    assert t.handle(Reset(now=2.0, group="g", job="a")) == [Reconcile(group="g", job="a")]


@pytest.mark.parametrize("epoch", [-1, 2**63])
def test_an_epoch_out_of_range_is_refused(t: Harness, epoch: int) -> None:
    t.refuse(TakeEpoch(now=1.0, epoch=epoch), InvalidArgumentError)


def test_the_epoch_is_saved_with_the_table(t: Harness) -> None:
    t.handle(TakeEpoch(now=1.0, epoch=4))
    saved = json.loads(json.dumps(t.table.to_dict()))
    assert saved["orchestrator_epoch"] == 4
    loaded = Harness(JobTable.from_dict(saved))
    assert loaded.table.orchestrator_epoch == 4
    assert loaded.refuse(plan(SwitchStage.SETTLE, 3), ConflictError).message == REFUSED


def test_a_table_saved_before_epochs_were_kept_loads_as_epoch_zero(t: Harness) -> None:
    saved = t.table.to_dict()
    del saved["orchestrator_epoch"]
    loaded = Harness(JobTable.from_dict(saved))
    assert loaded.table.orchestrator_epoch == 0
    assert loaded.table.jobs.keys() == t.table.jobs.keys()
    assert loaded.handle(TakeEpoch(now=1.0, epoch=1)) == []


def test_a_switchs_proof_covers_its_epoch() -> None:
    key = new_key()
    proof = token_proof(key, "g", 7, epoch=3)
    assert proves(key, "g", 7, proof, epoch=3)
    assert not proves(key, "g", 7, proof, epoch=4)  # an epoch it was not made for
    assert not proves(key, "g", 8, proof, epoch=3)
    assert not proves(new_key(), "g", 7, proof, epoch=3)
    assert not proves(key, "g", 7, b"", epoch=3)
