"""A tiny, real RL training loop in torch for the plugin tests: a policy over three
actions samples them for random prompts, a reward function on the CPU scores them,
and REINFORCE with Adam updates the policy. Seeded per job (its own generators, no
global RNG), so a job's results do not depend on what runs beside it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

PROMPT_DIM = 4
ACTIONS = 3
BATCH = 8


@dataclass(kw_only=True)
class Policy:
    """A policy network and its optimizer; ``forwards`` lists, for each forward,
    what ``watch()`` returned at its start (whether the job held its group)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    forwards: list[bool] = field(default_factory=list)


def policy(seed: int) -> Policy:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(PROMPT_DIM, 16), torch.nn.Tanh(), torch.nn.Linear(16, ACTIONS)
    )
    return Policy(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.05))


def rollout_copy(source: torch.nn.Module) -> torch.nn.Module:
    """A second copy of the policy, for a sampler that holds its own weights."""
    torch.manual_seed(0)
    copy = torch.nn.Sequential(
        torch.nn.Linear(PROMPT_DIM, 16), torch.nn.Tanh(), torch.nn.Linear(16, ACTIONS)
    )
    sync_weights(copy, source)
    for parameter in copy.parameters():
        parameter.requires_grad_(False)
    return copy


def watch(model: torch.nn.Module, held: Callable[[], bool]) -> list[bool]:
    """Records ``held()`` at the start of every forward of ``model``."""
    seen: list[bool] = []
    model.register_forward_pre_hook(lambda module, args: seen.append(held()))
    return seen


def prompts(generator: torch.Generator) -> torch.Tensor:
    return torch.randn(BATCH, PROMPT_DIM, generator=generator)


def generate(model: torch.nn.Module, batch: torch.Tensor, generator: torch.Generator) -> Any:
    """Samples one action per prompt from the policy."""
    with torch.no_grad():
        probabilities = torch.softmax(model(batch), dim=-1)
    return torch.multinomial(probabilities, 1, generator=generator).squeeze(1)


def rewards(batch: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """1 for the action the prompt's sign pattern asks for, else 0 (CPU work)."""
    wanted = (batch[:, 0] > 0).long() + (batch[:, 1] > 0).long()
    return (actions == wanted).float()


def update(job: Policy, batch: torch.Tensor, actions: torch.Tensor, score: torch.Tensor) -> float:
    """One REINFORCE step; returns the loss."""
    log_probs = torch.log_softmax(job.model(batch), dim=-1)
    chosen = log_probs.gather(1, actions.unsqueeze(1)).squeeze(1)
    loss = -((score - score.mean()) * chosen).mean()
    loss.backward()
    job.optimizer.step()
    job.optimizer.zero_grad()
    return float(loss.detach())


def sync_weights(target: torch.nn.Module, source: torch.nn.Module) -> None:
    with torch.no_grad():
        for to, frm in zip(target.parameters(), source.parameters(), strict=True):
            to.copy_(frm)


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def numel(model: torch.nn.Module) -> int:
    """The elements the model's parameters hold now (0 while a snapshot has them)."""
    return sum(parameter.data.numel() for parameter in model.parameters())
