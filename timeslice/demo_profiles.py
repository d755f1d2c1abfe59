"""What the demo's simulated RL jobs do in one step, taken from recorded runs.

The recorded runs (veRL on H100s, `tests/data/verl-replay-runs.json` in the
source tree) give each job's accelerator duty cycle when it runs alone
and how its accelerator time divides between its pools. A profile keeps those
shares and scales time down (a step of the recorded runs lasts many minutes; a
demo step lasts about a second): the phases on the accelerator are what the job
does inside `acquire()`; the others (reward scoring, weight sync over the
network, generation on other GPUs) leave the accelerator free for another job.

`tests/unit/test_demo_profiles.py` recomputes the shares from the recorded data
when it is there, so that these numbers cannot drift from it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Phase:
    """One part of a step: its name, whether it needs the accelerator, and its share
    of the step's time."""

    name: str
    on_accelerator: bool
    share: float


@dataclass(frozen=True)
class Profile:
    """The phases of one step of a simulated RL job, and where they come from."""

    name: str
    description: str
    phases: tuple[Phase, ...]

    @property
    def accelerator_share(self) -> float:
        return sum(p.share for p in self.phases if p.on_accelerator)

    def __post_init__(self) -> None:
        if abs(sum(p.share for p in self.phases) - 1.0) > 1e-6:
            raise ValueError(f"the phases of profile {self.name} do not add up to one step")


# veRL, sync disaggregated GRPO (2 x H100): alone, the job keeps its GPUs busy 55.5% of the
# time; its sampler and trainer pools hold the GPUs for medians of 456 s and 468 s a turn.
# The rest of a step (reward scoring, weight sync) is split evenly between those two.
_SYNC_BUSY = 0.555
_SYNC_SAMPLER, _SYNC_TRAINER = 456.0, 468.0
VERL_SYNC = Profile(
    "verl-sync",
    "veRL sync GRPO: generation and training on the accelerator (55.5% of a step, as "
    "recorded), reward scoring and weight sync off it",
    (
        Phase("generation", True, _SYNC_BUSY * _SYNC_SAMPLER / (_SYNC_SAMPLER + _SYNC_TRAINER)),
        Phase("reward", False, (1 - _SYNC_BUSY) / 2),
        Phase("training", True, _SYNC_BUSY * _SYNC_TRAINER / (_SYNC_SAMPLER + _SYNC_TRAINER)),
        Phase("weight sync", False, (1 - _SYNC_BUSY) / 2),
    ),
)

# veRL, fully-async disaggregated (3 x H100): generation runs on rollout GPUs of its own; the
# trainer GPU, the one that is shared, is busy 42% of the time for a job alone.
_ASYNC_BUSY = 0.42
VERL_ASYNC = Profile(
    "verl-async",
    "veRL fully-async: training on the shared trainer accelerator (42% of a step, as "
    "recorded), generation on rollout accelerators of its own",
    (
        Phase("generation (rollout GPUs)", False, 1 - _ASYNC_BUSY),
        Phase("training", True, _ASYNC_BUSY),
    ),
)

PROFILES: dict[str, Profile] = {p.name: p for p in (VERL_SYNC, VERL_ASYNC)}
