"""`TimeSliceCallback` on a real `transformers.Trainer` (a one-layer GPT-2 built from
its config, CPU, no downloads).

First the hook logic, with a recording client: the group is held for every
forward of training and evaluation and for every checkpoint, acquired once per
optimizer step (with gradient accumulation too) and yielded after it. Then two
Trainers sharing a group through a real orchestrator and agent: each one's model
and optimizer state is out (SAVED, its tensors empty) whenever the other steps,
and both train to exactly the results they reach alone.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.optional import need

torch = need("torch")
transformers = need("transformers")

from plugin_cluster import Cluster  # noqa: E402
from plugin_fakes import RecordingClient  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from timeslice.integrations.transformers import TimeSliceCallback  # noqa: E402
from timeslice.orchestrator.events import Granted  # noqa: E402

pytestmark = pytest.mark.timeout(90)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
VOCAB = 64


def tiny_model(seed: int) -> Any:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=16,
        n_embd=16,
        n_layer=1,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config)


def tiny_data(seed: int, n: int = 16, length: int = 8) -> list[dict[str, Any]]:
    ids = torch.randint(0, VOCAB, (n, length), generator=torch.Generator().manual_seed(seed))
    return [{"input_ids": row, "labels": row} for row in ids]


def arguments(out: Path, **overrides: Any) -> Any:
    settings: dict[str, Any] = {
        "output_dir": str(out),
        "use_cpu": True,
        "report_to": [],
        "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 4,
        "max_steps": 3,
        "logging_steps": 1,
        "save_strategy": "no",
        "disable_tqdm": True,
        "log_level": "error",
        "seed": 7,
        "dataloader_num_workers": 0,
    }
    settings.update(overrides)
    return TrainingArguments(**settings)


class Probe(TrainerCallback):
    """Records, after the time-slice callback has run at each hook, whether it holds."""

    def __init__(self, callback: TimeSliceCallback) -> None:
        self.callback = callback
        self.after_log: list[tuple[int, bool]] = []

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.after_log.append((state.global_step, self.callback.holding))


class SaveRecordingTrainer(Trainer):
    """Records whether the group was held while each checkpoint was written."""

    callback: TimeSliceCallback
    saves_held: list[bool]

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        self.saves_held.append(self.callback.holding)
        super()._save_checkpoint(model, trial)


def forwards_held(model: Any, callback: TimeSliceCallback) -> list[bool]:
    """Whether the callback held the group at each forward of ``model`` from now on."""
    seen: list[bool] = []
    model.register_forward_pre_hook(lambda module, args: seen.append(callback.holding))
    return seen


# --- the hook logic ---------------------------------------------------------------------


def test_each_optimizer_step_is_one_turn_even_with_gradient_accumulation(tmp_path: Path) -> None:
    client = RecordingClient()
    callback = TimeSliceCallback("a", "g", client=client)
    probe = Probe(callback)
    model = tiny_model(1)
    held = forwards_held(model, callback)
    args = arguments(tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=2)
    trainer = Trainer(
        model=model, args=args, train_dataset=tiny_data(2), callbacks=[callback, probe]
    )
    trainer.train()

    assert client.calls == [("acquire", ("g",)), ("release", "g")] * 3
    assert held == [True] * 6, "every micro-batch's forward ran while the group was held"
    # Yielded after each step; the last one is held until training ends.
    assert probe.after_log[:2] == [(1, False), (2, False)]
    assert callback.steps == 3 and not callback.holding

    # After training, a block holds the group through the Trainer's own hooks.
    trainer.eval_dataset = tiny_data(3, n=4)
    with callback.on_accelerators():
        trainer.evaluate()  # calls on_evaluate, which yields only outside such a block
        assert callback.holding
        trainer.save_model(str(tmp_path / "final"))
    assert not callback.holding and client.held == set()
    assert held[6:] == [True], "the evaluation's forward held the group"
    callback.close()
    assert not client.closed, "a client passed in is the caller's to close"


@pytest.mark.parametrize("strategy", ["steps", "epoch"])
def test_evaluations_and_checkpoints_run_while_the_group_is_held(
    tmp_path: Path, strategy: str
) -> None:
    client = RecordingClient()
    callback = TimeSliceCallback("a", "g", client=client)
    model = tiny_model(1)
    held = forwards_held(model, callback)
    args = arguments(
        tmp_path,
        max_steps=-1,
        num_train_epochs=2,
        per_device_train_batch_size=4,  # 2 steps an epoch
        eval_strategy=strategy,
        save_strategy=strategy,
        eval_steps=2,
        save_steps=2,
        eval_on_start=True,
    )
    trainer = SaveRecordingTrainer(
        model=model,
        args=args,
        train_dataset=tiny_data(2, n=8),
        eval_dataset=tiny_data(3, n=8),
        callbacks=[callback],
    )
    trainer.callback, trainer.saves_held = callback, []
    trainer.train()

    train_forwards, eval_forwards = 4, 3 * 2  # 3 evaluations (start, twice) of 2 batches
    assert held == [True] * (train_forwards + eval_forwards)
    assert trainer.saves_held == [True, True]
    assert not callback.holding and client.held == set()


# --- through a real orchestrator and agent ----------------------------------------------


class Contender(TrainerCallback):
    """One of two Trainers sharing group ``g``: waits for the other to register, then
    checks at every step that the other's state is out."""

    def __init__(
        self,
        cluster: Cluster,
        me: TimeSliceCallback,
        other: TimeSliceCallback,
        both_registered: threading.Barrier,
    ) -> None:
        self.cluster, self.me, self.other = cluster, me, other
        self.both_registered = both_registered
        self.others_state_at_steps: list[str] = []
        self.others_numel_at_steps: list[int] = []
        self.holder_at_steps: list[str | None] = []
        self.holder_after_steps: list[tuple[int, str | None]] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.both_registered.wait(30)
        self.cluster.wait_registered("g", [self.me.job_id, self.other.job_id])

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        workload: Any = self.other.workload
        self.others_state_at_steps.append(workload.state)
        self.others_numel_at_steps.append(
            sum(p.data.numel() for p in workload._modules["model"].module.parameters())
        )
        self.holder_at_steps.append(self.cluster.holder("g"))

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step < state.max_steps:
            self.holder_after_steps.append((state.global_step, self.cluster.holder("g")))


def train_alone(out: Path, seed: int) -> tuple[list[float], dict[str, Any]]:
    model = tiny_model(seed)
    trainer = Trainer(model=model, args=arguments(out, max_steps=4), train_dataset=tiny_data(seed))
    trainer.train()
    return losses(trainer), {k: v.clone() for k, v in model.state_dict().items()}


def losses(trainer: Any) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path, ["g"]) as running:
        yield running


def test_two_trainers_take_turns_and_each_ones_state_is_out_while_the_other_steps(
    tmp_path: Path, cluster: Cluster
) -> None:
    alone = {
        job: train_alone(tmp_path / f"alone-{job}", seed) for job, seed in (("a", 1), ("b", 2))
    }

    callbacks = {
        job: TimeSliceCallback(
            job,
            "g",
            orchestrator=cluster.orchestrator_address,
            agent=cluster.agent_address,
            chunk_bytes=64 << 10,
        )
        for job in ("a", "b")
    }
    barrier = threading.Barrier(2)
    contenders = {
        job: Contender(cluster, callbacks[job], callbacks[other], barrier)
        for job, other in (("a", "b"), ("b", "a"))
    }
    models = {"a": tiny_model(1), "b": tiny_model(2)}
    trainers = {
        job: Trainer(
            model=models[job],
            args=arguments(tmp_path / job, max_steps=4),
            train_dataset=tiny_data(seed),
            callbacks=[callbacks[job], contenders[job]],
        )
        for job, seed in (("a", 1), ("b", 2))
    }
    errors: list[BaseException] = []

    def train(job: str) -> None:
        try:
            trainers[job].train()
        except BaseException as error:  # reported below, in the test's thread
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=train, args=(job,)) for job in ("a", "b")]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors, errors
        for job in ("a", "b"):
            contender = contenders[job]
            # Every step ran while this job held the group, the other's state out.
            assert contender.holder_at_steps == [job] * 4
            assert contender.others_state_at_steps == ["SAVED"] * 4
            assert contender.others_numel_at_steps == [0] * 4
            # Yielded after each step but the last.
            assert all(holder != job for _, holder in contender.holder_after_steps)
            assert callbacks[job].locks.acquisitions <= 4
        # The job that did not hold last is out, optimizer state and all.
        out = [job for job, c in callbacks.items() if getattr(c.workload, "state", "") == "SAVED"]
        assert len(out) == 1
        saved: Any = callbacks[out[0]].workload
        assert any(label.startswith("optimizer.state[") for label in saved.saved)
        granted = [e.job for e in cluster.effects(Granted)]
        assert granted.count("a") >= 1 and granted.count("b") >= 1
        assert any(x != y for x, y in zip(granted, granted[1:])), "the group changed hands"
    finally:
        for callback in callbacks.values():
            callback.close()  # brings a state left out back
        cluster.close()

    for job in ("a", "b"):
        workload: Any = callbacks[job].workload
        assert workload is None  # the registration ended
        expected_losses, expected_weights = alone[job]
        assert losses(trainers[job]) == expected_losses
        weights = models[job].state_dict()
        assert all(torch.equal(weights[k], v) for k, v in expected_weights.items())
