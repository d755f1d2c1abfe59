"""A `transformers.TrainerCallback` that gives a `Trainer` (and so TRL's trainers,
which subclass it) the accelerators only for its steps.

    callback = TimeSliceCallback("trainer-1", "gpus", orchestrator=ORCH, agent=AGENT)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train()
    callback.close()

What the callback does at each of the Trainer's hooks (transformers 5.x order):

- ``on_train_begin`` (after the optimizer is created and the model placed):
  registers a `TorchWorkload` of the model (parameters, buffers, gradients)
  and of the optimizer's state with the node's agent, in the group, so that
  both move to host memory while another job holds the group. The
  optimizer's state appears at its first step; the workload finds it then.
- ``on_step_begin``: acquires the group, before the step's forward. The
  Trainer calls it once per optimizer step, at the first micro-batch of a
  gradient-accumulation cycle, so a cycle is one turn.
- ``on_step_end`` (after the optimizer step and ``zero_grad``): yields the
  group, unless the Trainer will evaluate or save right after (the
  ``should_evaluate`` / ``should_save`` flags set by the callbacks before this
  one) or training ends: then the group is held until ``on_evaluate`` /
  ``on_save`` / ``on_train_end``, so that no evaluation or checkpoint reads a
  model that is out. Add this callback after the ones that set those flags.
- ``on_epoch_end``: acquires again when an evaluation or a save per epoch follows.
- ``on_train_end``: yields.

Logging between steps reads only the Trainer's own loss tensor, which is not
moved. Outside `Trainer.train()`, hold the group around anything that uses
the model (``with callback.on_accelerators(): trainer.evaluate()``), or call
`close()` first: it ends the registration and brings the model back.
A step that ran after its lease was lost raises `LeaseLostError` at its end.
One process per job: each process of a distributed run is a job of its own.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from timeslice.client.orchestrator import DEFAULT_TARGET
from timeslice.client.types import AcquireResult
from timeslice.errors import InvalidArgumentError
from timeslice.ids import check_id
from timeslice.integrations._locks import LockClient, connect
from timeslice.integrations._registrations import Registrations
from timeslice.workloads.torch import DEFAULT_CHUNK_BYTES, TorchWorkload, check_chunk_bytes

log = logging.getLogger("timeslice.integrations")

# What the callback waits for before it yields after a step.
_EVALUATE, _SAVE, _TRAIN_END = "evaluate", "save", "train_end"


class TimeSliceCallback(TrainerCallback):
    """Acquires ``group_id`` for each optimizer step of a `Trainer` and yields it
    after; with ``agent``, registers the model and optimizer as a `TorchWorkload`.

    ``orchestrator``: the orchestrator's address (or ``client``, any
    `LockClient`, which the callback then does not close). ``agent``: the
    node agent's address; None registers nothing (the job is switched by
    another backend, or not at all). ``workload``: an object to register in
    place of the `TorchWorkload` the callback would build (its
    ``chunk_bytes``). ``lease_ttl_sec``: the lease of each grant, renewed in
    the background. ``acquire_timeout_sec``: the longest wait for a turn.
    """

    def __init__(
        self,
        job_id: str,
        group_id: str,
        *,
        orchestrator: str = DEFAULT_TARGET,
        agent: str | None = None,
        client: LockClient | None = None,
        workload: object | None = None,
        lease_ttl_sec: float | None = 10.0,
        acquire_timeout_sec: float | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        connect_timeout_sec: float = 30.0,
    ) -> None:
        check_id("job_id", job_id)
        check_id("group_id", group_id)
        check_chunk_bytes(chunk_bytes)  # here, not only when the workload is made
        self.job_id = job_id
        self.group_id = group_id
        self.registrations = (
            Registrations(agent, job_id, connect_timeout_sec=connect_timeout_sec)
            if agent is not None
            else None
        )
        self.locks, self._owns_client = connect(
            job_id=job_id,
            client=client,
            orchestrator=orchestrator,
            group_id=group_id,
            lease_ttl_sec=lease_ttl_sec,
            acquire_timeout_sec=acquire_timeout_sec,
        )
        self._given_workload = workload
        self._chunk_bytes = chunk_bytes
        self._registered_for: tuple[object, object] | None = None  # (model, optimizer)
        self._due: set[str] = set()
        self._pinned = 0  # on_accelerators() blocks open: the hooks inside do not yield
        self.steps = 0  # optimizer steps begun under the callback

    @property
    def workload(self) -> object | None:
        """The workload registered with the agent, once training has begun."""
        if self.registrations is None:
            return None
        return self.registrations.workload(self.group_id)

    @property
    def holding(self) -> bool:
        """Whether the job holds the group now."""
        return self.group_id in self.locks.held

    # --- the Trainer's hooks --------------------------------------------------------------

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        self._register(kwargs.get("model"), kwargs.get("optimizer"))
        self._due.clear()
        if args.eval_on_start:  # an evaluation runs before the first step
            self._acquire()
            self._due.add(_EVALUATE)

    def on_step_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        self._due.clear()
        self._acquire()
        self.steps += 1

    def on_step_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        self._due = _due_after(args, state, control)
        self._settle()

    def on_epoch_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        due = _due_after(args, state, control)
        if _TRAIN_END in due and not self.holding and not args.load_best_model_at_end:
            due.discard(_TRAIN_END)  # nothing but logging runs before the end
        if due:
            self._acquire()
            self._due |= due

    def on_evaluate(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        self._due.discard(_EVALUATE)
        self._settle()

    def on_save(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        self._due.discard(_SAVE)
        self._settle()

    def on_train_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        self._due.clear()
        if not self._pinned:
            self.locks.release_all()

    # --- outside the Trainer's loop ---------------------------------------------------------

    @contextlib.contextmanager
    def on_accelerators(self) -> Iterator[AcquireResult | None]:
        """Holds the group for a block (the model and optimizer are back in it),
        e.g. around `Trainer.evaluate()` or `save_model()` after training; the
        Trainer's hooks inside the block do not yield it."""
        with self.locks.holding([self.group_id]) as result:
            self._pinned += 1
            try:
                yield result
            finally:
                self._pinned -= 1

    def close(self, *, restore: bool = True) -> None:
        """Yields the group, ends the workload's registration (bringing the model
        and optimizer back unless ``restore`` is false) and closes the client.
        Idempotent."""
        try:
            self.locks.close(close_client=self._owns_client)
        finally:
            if self.registrations is not None:
                self.registrations.close(restore=restore)
            self._registered_for = None

    # --- internals --------------------------------------------------------------------------

    def _acquire(self) -> None:
        self.locks.acquire([self.group_id])

    def _settle(self) -> None:
        if not self._due and not self._pinned:
            self.locks.release_all()

    def _register(self, model: object, optimizer: object) -> None:
        registrations = self.registrations
        if registrations is None:
            return
        if self._given_workload is not None:
            if self.group_id not in registrations:
                registrations.add(self.group_id, self._given_workload)
            return
        if model is None:
            raise InvalidArgumentError("the Trainer passed no model to on_train_begin")
        optimizer = _unwrapped_optimizer(optimizer)
        if self._registered_for is not None:
            known_model, known_optimizer = self._registered_for
            if known_model is model and known_optimizer is optimizer:
                return  # train() again with the same state: the registration stands
            registrations.remove(self.group_id)
        workload = torch_workload(model, optimizer, chunk_bytes=self._chunk_bytes)
        try:
            registrations.add(self.group_id, workload, owned=True)
        except BaseException:
            workload.close()
            raise
        self._registered_for = (model, optimizer)


def torch_workload(
    model: object, optimizer: object | None, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> TorchWorkload:
    """A `TorchWorkload` of a model (weights and gradients) and its optimizer's state.
    `InvalidArgumentError` for a model that is not a torch module, or an optimizer
    that is not a torch optimizer."""
    if not isinstance(model, torch.nn.Module):
        raise InvalidArgumentError(f"the model is not a torch.nn.Module: {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise InvalidArgumentError(
            f"the optimizer is not a torch.optim.Optimizer: {type(optimizer).__name__}"
        )
    workload = TorchWorkload(chunk_bytes=chunk_bytes)
    workload.add_module(model, name="model")
    if optimizer is not None:
        workload.add_optimizer(optimizer, name="optimizer")
    return workload


def _unwrapped_optimizer(optimizer: object) -> object:
    """The torch optimizer inside accelerate's `AcceleratedOptimizer` (the Trainer's)."""
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(inner, torch.optim.Optimizer):
        return inner
    return optimizer


def _due_after(args: TrainingArguments, state: TrainerState, control: TrainerControl) -> set[str]:
    """What the Trainer does with the model after this hook, before the next step."""
    due: set[str] = set()
    if control.should_evaluate:
        due.add(_EVALUATE)
        if str(getattr(args.save_strategy, "value", args.save_strategy)) == "best":
            due.add(_SAVE)  # decided by the evaluation; held to the next step if not saved
    if control.should_save:
        due.add(_SAVE)
    if control.should_training_stop or (
        state.max_steps > 0 and state.global_step >= state.max_steps
    ):
        due.add(_TRAIN_END)
    return due
