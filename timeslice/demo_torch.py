"""`timeslice demo --workload torch`: real PyTorch training jobs sharing one accelerator.

Each job trains an MLP policy with REINFORCE on a contextual bandit of its own
(`timeslice.demo_torch_job`), on the CPU, which stands for the accelerator: a rollout
and a reward service off the accelerator, then training inside `client.acquire()`.
Its model and optimizer are registered with the agent as a `TorchWorkload`, so every
switch between jobs really moves the yielding job's parameters, gradients and Adam
state out and the next job's back.

The rounds are the hostmem demo's (`timeslice.demo.play_round`): the same jobs, built
afresh from the same seeds, first back to back (each job alone on the accelerator),
then all at once, taking turns, each round on a fresh orchestrator and agent. Training
is deterministic, so each job must end the time-sliced round with the very bits it
ended with alone: its final parameters (a digest) and every loss of its curve. The
table says whether they are, beside the measured speedup.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from timeslice.backends import OFFLOAD
from timeslice.client import AsyncTimeSliceOrchestratorClient
from timeslice.demo import (
    MiB,
    RoundResult,
    play_round,
    print_rounds,
    round_rows,
    write_replay,
)
from timeslice.demo_torch_job import (
    BanditJob,
    Comparison,
    JobOutcome,
    JobSettings,
    compare,
    deterministic_torch,
)
from timeslice.errors import InvalidArgumentError
from timeslice.workloads.torch import TorchWorkload

MAX_STEPS = 10_000
MAX_REWARD_S = 600.0


@dataclass(frozen=True, kw_only=True)
class TorchDemoConfig:
    """What the torch demo runs. Validated on construction.

    Job `i` (from 0) trains from seed `seed + i`, so the jobs differ from each other but
    each is the same in both rounds."""

    jobs: int = 2
    steps: int = 8
    reward_s: float = 0.8  # the reward service's latency, per step
    seed: int = 0
    hidden: int = 1024
    batch: int = 512
    epochs: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.jobs <= 16:
            raise InvalidArgumentError("jobs must be between 1 and 16")
        if not 1 <= self.steps <= MAX_STEPS:
            raise InvalidArgumentError(f"steps must be between 1 and {MAX_STEPS}")
        if not 0 <= self.reward_s <= MAX_REWARD_S:
            raise InvalidArgumentError(f"reward_s must be between 0 and {MAX_REWARD_S:g} s")
        self.job_settings(self.jobs - 1)  # the job settings' own checks, now

    def job_settings(self, index: int) -> JobSettings:
        """The settings of job `index` (from 0)."""
        return JobSettings(
            seed=self.seed + index,
            hidden=self.hidden,
            batch=self.batch,
            minibatch=min(128, self.batch),
            epochs=self.epochs,
        )


@dataclass
class TorchDemoResult:
    """Both rounds side by side, and each job's outcome in both."""

    config: TorchDemoConfig
    back_to_back: RoundResult
    time_sliced: RoundResult
    replay: Path
    solo: list[JobOutcome] = field(default_factory=list)
    shared: list[JobOutcome] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        return self.back_to_back.wall_s / self.time_sliced.wall_s

    @property
    def comparisons(self) -> list[Comparison]:
        return [compare(a, b) for a, b in zip(self.solo, self.shared, strict=True)]

    @property
    def identical(self) -> bool:
        """Whether every job ended time-sliced with the bits it ended with alone."""
        return all(c.identical for c in self.comparisons)


class TorchDemoJob:
    """One job of a round: its trainer, its model and optimizer as a `TorchWorkload`
    (parked in host memory until its first turn), and its loop of steps."""

    def __init__(
        self,
        name: str,
        settings: JobSettings,
        reward_s: float,
        make_workload: Callable[[], TorchWorkload] = TorchWorkload,
    ) -> None:
        self.name = name
        self.trainer = BanditJob(name, settings)
        self.reward_s = reward_s
        self.context = make_workload()
        self.context.add_module(self.trainer.policy, name="policy")
        self.context.add_optimizer(self.trainer.optimizer, name="adam")
        self.context.snapshot(OFFLOAD, [])
        self.step = 0
        self.phase = "waiting"
        self.held_s = 0.0
        self.outcome: JobOutcome | None = None

    async def run(self, client: AsyncTimeSliceOrchestratorClient, steps: int) -> None:
        """`steps` steps: rollout and reward off the accelerator, training on it. The
        torch work runs on worker threads, so that the event loop stays responsive."""
        for self.step in range(1, steps + 1):
            self.phase = "rollout"
            rollout = await asyncio.to_thread(self.trainer.rollout)
            self.phase = "reward"
            rewards = await asyncio.to_thread(self.trainer.score, rollout)
            await asyncio.sleep(self.reward_s)  # the reward model's latency
            self.phase = "waiting"
            async with client.acquire():
                self.phase = "training"
                began = time.monotonic()
                await asyncio.to_thread(self.trainer.train, rollout, rewards)
                self.held_s += time.monotonic() - began
                if self.step == steps:
                    # While its parameters are surely in place: the next holder's
                    # switch would move them out.
                    self.outcome = await asyncio.to_thread(self.trainer.outcome)
        self.phase = "done"


async def run_round(
    config: TorchDemoConfig,
    shared: bool,
    directory: Path,
    out: TextIO,
    make_workload: Callable[[], TorchWorkload] = TorchWorkload,
) -> tuple[RoundResult, list[JobOutcome]]:
    """One round on a fresh orchestrator and agent, the jobs built afresh from their
    seeds: what it measured and what each job ended with."""
    jobs = [
        TorchDemoJob(f"job-{i + 1}", config.job_settings(i), config.reward_s, make_workload)
        for i in range(config.jobs)
    ]
    played = await play_round(
        jobs,
        lambda job, client: job.run(client, config.steps),
        shared=shared,
        directory=directory,
        steps=config.steps,
        out=out,
    )
    outcomes = [job.outcome for job in jobs]
    if any(o is None for o in outcomes):
        raise RuntimeError("a job ended its round without an outcome")
    return played, [o for o in outcomes if o is not None]


async def run_demo(
    config: TorchDemoConfig,
    directory: Path | None = None,
    out: TextIO | None = None,
    make_workload: Callable[[], TorchWorkload] | None = None,
) -> TorchDemoResult:
    """Run both rounds (journals under `directory`, a new temporary one by default);
    print the live view and the tables to `out` (standard output). torch is set to be
    deterministic for the run (one intra-op thread), and set back after it.
    `make_workload` builds each job's workload (`TorchWorkload()` by default)."""
    out = out or sys.stdout
    make_workload = make_workload or TorchWorkload
    directory = directory or Path(tempfile.mkdtemp(prefix="timeslice-demo-torch-"))
    with deterministic_torch():
        print_header(config, out)
        alone, solo = await run_round(config, False, directory, out, make_workload)
        together, shared = await run_round(config, True, directory, out, make_workload)
    replay = await write_replay(directory, alone, together)
    result = TorchDemoResult(config, alone, together, replay, solo, shared)
    print_tables(result, out)
    return result


def print_header(config: TorchDemoConfig, out: TextIO) -> None:
    """What the jobs are."""
    settings = config.job_settings(0)
    count = settings.parameter_count
    print(
        f"{config.jobs} PyTorch RL jobs x {config.steps} steps: REINFORCE on a contextual "
        f"bandit ({settings.actions} arms), an MLP policy of {count / 1e6:.2f} M parameters, "
        f"Adam, on the CPU;\neach step: a rollout and a reward service "
        f"({config.reward_s:g} s) off the accelerator, {settings.updates_per_step} updates on "
        f"it;\neach job's model and optimizer (TorchWorkload) really moved out and back at "
        f"every switch\n",
        file=out,
    )


def print_tables(result: TorchDemoResult, out: TextIO) -> None:
    """Where the replay is, each job against its solo run, then the two rounds; a loud
    line when a job's bits differ."""
    a, b = result.back_to_back, result.time_sliced
    print(f"\nreplay, switch by switch (open in a browser): {result.replay}", file=out)
    print(f"journals: {a.journal} and {b.journal}", file=out)
    print_jobs(result.shared, result.comparisons, out)
    rows = round_rows(a, b)
    rows.append(("bytes per switch (out + in)", per_switch(a), per_switch(b)))
    print_rounds(rows, out)
    differ = [c.name for c in result.comparisons if not c.identical]
    if differ:
        print(
            f"\nRESULTS DIFFER: {', '.join(differ)} did not end time-sliced with the bits"
            " it ended with alone",
            file=out,
        )


def print_jobs(
    outcomes: Sequence[JobOutcome], comparisons: Sequence[Comparison], out: TextIO
) -> None:
    """Per job, time-sliced: steps, final loss, rewards, and whether its bits are its
    solo run's."""
    header = (
        "job",
        "steps",
        "final loss",
        "reward first -> last",
        "parameters bit-identical to solo run",
        "loss curve bit-identical",
    )
    rows = [
        (
            o.name,
            str(o.steps),
            f"{o.losses[-1]:.6f}" if o.losses else "-",
            f"{o.rewards[0]:.3f} -> {o.rewards[-1]:.3f}" if o.rewards else "-",
            _yes(c.params_identical),
            _yes(c.losses_identical),
        )
        for o, c in zip(outcomes, comparisons, strict=True)
    ]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    print("", file=out)
    for row in (header, *rows):
        cells = [f"{row[0]:<{widths[0]}}", *(f"{c:>{w}}" for c, w in zip(row[1:], widths[1:]))]
        print("  ".join(cells), file=out)


def per_switch(r: RoundResult) -> str:
    """The mean bytes one switch moved (the yielding job's out, the next one's in)."""
    return f"{r.bytes_moved / len(r.switch_s) / MiB:.1f} MiB" if r.switch_s else "-"


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"
