"""The torch demo's RL job, in plain PyTorch: no orchestrator, agent or event loop here.

Each job trains a small MLP policy with REINFORCE on a contextual bandit of its own:
a context is a vector of `features` numbers, the policy picks one of `actions` arms, and
the reward of an arm is linear in the context (a hidden matrix that the job draws from its
seed) plus noise. A step has the phases of an asynchronous RL trainer:

- rollout, off the accelerator: the rollout worker's copy of the policy samples actions
  for a batch of contexts (as generation on rollout accelerators of its own would);
- reward, off the accelerator: a reward service scores them (the demo's shell adds its
  latency);
- training, on the accelerator: a few epochs of minibatch policy-gradient updates with
  Adam, then the new weights are copied to the rollout worker (the weight sync).

Everything is deterministic: every random draw comes from the job's own
`torch.Generator`, and `deterministic_torch()` makes torch compute the same bits each
time (one intra-op thread, deterministic algorithms). A job run alone and the same job
run while it shares the accelerator must therefore end with the same bits, unless
something between its turns changed its model or optimizer: that is what the demo
checks.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from timeslice.errors import InvalidArgumentError

# Bounds of a job's settings: enough for a demo, small enough for a laptop's CPU.
MAX_FEATURES = 1024
MAX_ACTIONS = 1024
MAX_HIDDEN = 8192
MAX_BATCH = 65536
MAX_EPOCHS = 64


@dataclass(frozen=True, kw_only=True)
class JobSettings:
    """The task and the trainer of one job. Validated on construction."""

    seed: int
    features: int = 32
    actions: int = 16
    hidden: int = 1024  # width of the policy's two hidden layers
    batch: int = 512  # contexts per rollout
    minibatch: int = 128
    epochs: int = 2  # passes over a batch per training phase
    lr: float = 3e-4

    def __post_init__(self) -> None:
        if not 0 <= self.seed < 2**63:
            raise InvalidArgumentError("seed must be between 0 and 2**63 - 1")
        for name, value, most in (
            ("features", self.features, MAX_FEATURES),
            ("actions", self.actions, MAX_ACTIONS),
            ("hidden", self.hidden, MAX_HIDDEN),
            ("batch", self.batch, MAX_BATCH),
            ("epochs", self.epochs, MAX_EPOCHS),
        ):
            if not 1 <= value <= most:
                raise InvalidArgumentError(f"{name} must be between 1 and {most}: {value}")
        if self.actions < 2:
            raise InvalidArgumentError("a bandit needs at least 2 actions")
        if not 1 <= self.minibatch <= self.batch:
            raise InvalidArgumentError("minibatch must be between 1 and batch")
        if not 0 < self.lr < 1:
            raise InvalidArgumentError(f"lr must be between 0 and 1: {self.lr}")

    @property
    def parameter_count(self) -> int:
        """The policy's parameters: three linear layers, weights and biases."""
        f, h, a = self.features, self.hidden, self.actions
        return (f + 1) * h + (h + 1) * h + (h + 1) * a

    @property
    def updates_per_step(self) -> int:
        """Optimizer steps in one training phase."""
        return self.epochs * math.ceil(self.batch / self.minibatch)


@dataclass(frozen=True, kw_only=True)
class Rollout:
    """One batch of contexts and the actions the rollout policy chose for them."""

    contexts: torch.Tensor  # (batch, features)
    actions: torch.Tensor  # (batch,), int64


@dataclass(frozen=True, kw_only=True)
class JobOutcome:
    """What a job ended with: its loss curve (one loss per optimizer step), its mean
    reward per step, and a digest of its final parameters and buffers."""

    name: str
    losses: tuple[float, ...]
    rewards: tuple[float, ...]
    params_sha256: str

    @property
    def steps(self) -> int:
        return len(self.rewards)


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """One job's outcome time-sliced against the same job alone, bit for bit."""

    name: str
    params_identical: bool
    losses_identical: bool

    @property
    def identical(self) -> bool:
        return self.params_identical and self.losses_identical


def compare(solo: JobOutcome, shared: JobOutcome) -> Comparison:
    """Whether two runs of a job ended with the same bits: parameters by digest, loss
    curves float by float (as IEEE-754 bytes, so that -0.0 and NaN compare as bits)."""
    return Comparison(
        name=shared.name,
        params_identical=solo.params_sha256 == shared.params_sha256,
        losses_identical=_float_bytes(solo.losses) == _float_bytes(shared.losses),
    )


def _float_bytes(values: tuple[float, ...]) -> bytes:
    return struct.pack(f"<{len(values)}d", *values)


@contextlib.contextmanager
def deterministic_torch() -> Iterator[None]:
    """Within: one intra-op thread and deterministic algorithms, process-wide (torch's
    settings are global); the previous settings come back on exit."""
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.set_num_threads(threads)


class BanditJob:
    """One job's task, policy, optimizer and rollout worker, and its three phases.

    `policy` and `optimizer` are what lives on the accelerator (what a workload
    registers); `rollout_policy` is the rollout worker's copy, which the training phase
    refreshes and nothing else touches.
    """

    def __init__(self, name: str, settings: JobSettings) -> None:
        self.name = name
        self.settings = settings
        self.generator = torch.Generator().manual_seed(settings.seed)
        s = settings
        # The task: how good each arm is in each context, hidden from the policy.
        self.arm_weights = torch.randn(s.features, s.actions, generator=self.generator)
        self.policy = torch.nn.Sequential(
            _linear(s.features, s.hidden, self.generator),
            torch.nn.Tanh(),
            _linear(s.hidden, s.hidden, self.generator),
            torch.nn.Tanh(),
            _linear(s.hidden, s.actions, self.generator),
        )
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=s.lr)
        self.rollout_policy = copy.deepcopy(self.policy).requires_grad_(False)
        self.losses: list[float] = []
        self.rewards: list[float] = []

    def rollout(self) -> Rollout:
        """Sample a batch of contexts and the rollout policy's actions for them."""
        contexts = torch.randn(
            self.settings.batch, self.settings.features, generator=self.generator
        )
        with torch.no_grad():
            probabilities = torch.softmax(self.rollout_policy(contexts), dim=-1)
        actions = torch.multinomial(probabilities, 1, generator=self.generator).squeeze(1)
        return Rollout(contexts=contexts, actions=actions)

    def score(self, rollout: Rollout) -> torch.Tensor:
        """The reward service: each chosen arm's value in its context, plus noise."""
        values = rollout.contexts @ self.arm_weights / math.sqrt(self.settings.features)
        chosen = values.gather(1, rollout.actions.unsqueeze(1)).squeeze(1)
        noise = torch.randn(chosen.shape, generator=self.generator)
        rewards = chosen + 0.1 * noise
        self.rewards.append(float(rewards.mean()))
        return rewards

    def train(self, rollout: Rollout, rewards: torch.Tensor) -> None:
        """The accelerator phase: REINFORCE with the batch's mean reward as baseline,
        `epochs` passes of shuffled minibatches, then the weight sync to the rollout
        worker."""
        s = self.settings
        advantages = rewards - rewards.mean()
        for _ in range(s.epochs):
            order = torch.randperm(s.batch, generator=self.generator)
            for first in range(0, s.batch, s.minibatch):
                rows = order[first : first + s.minibatch]
                logits = self.policy(rollout.contexts[rows])
                chosen = rollout.actions[rows].unsqueeze(1)
                log_probs = torch.log_softmax(logits, dim=-1).gather(1, chosen).squeeze(1)
                loss = -(log_probs * advantages[rows]).mean()
                self.optimizer.zero_grad()
                torch.autograd.backward(loss)
                self.optimizer.step()
                self.losses.append(float(loss.detach()))
        with torch.no_grad():
            for mine, theirs in zip(
                self.rollout_policy.parameters(), self.policy.parameters(), strict=True
            ):
                mine.copy_(theirs)

    def outcome(self) -> JobOutcome:
        """The job's loss curve, rewards and a digest of its parameters, now."""
        return JobOutcome(
            name=self.name,
            losses=tuple(self.losses),
            rewards=tuple(self.rewards),
            params_sha256=state_digest(self.policy),
        )


def state_digest(module: torch.nn.Module) -> str:
    """SHA-256 of a module's parameters and buffers: names, dtypes, shapes and bytes."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        data = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{data.dtype}:{tuple(data.shape)};".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _linear(inputs: int, outputs: int, generator: torch.Generator) -> torch.nn.Linear:
    """A linear layer initialised from `generator` (torch's default draws from the
    global generator, which other code in the process may also draw from)."""
    layer = torch.nn.Linear(inputs, outputs, device="meta").to_empty(device="cpu")
    bound = 1 / math.sqrt(inputs)
    with torch.no_grad():
        torch.nn.init.uniform_(layer.weight, -bound, bound, generator=generator)
        torch.nn.init.uniform_(layer.bias, -bound, bound, generator=generator)
    return layer
