"""`timeslice demo`: simulated RL jobs sharing one accelerator, for real.

An Orchestrator and an Agent run in this process (SQLite journal in a temporary
directory). Each job is a loop of steps whose phases follow a recorded RL run
(`timeslice.demo_profiles`), scaled down in time; its accelerator context is a
real host-memory workload (`HostMemoryWorkload`, registered with the agent), so
every switch between jobs really moves its bytes out and the next job's back,
and each job checks at every turn that its bytes came back as it left them.

The same jobs run twice, through the same code, each time on a fresh
orchestrator and agent: first back to back (one job after the other, nobody to
share with), then all at once, taking turns. The speedup is the ratio of the two
measured wall times; the accelerator's busy share is the time jobs held it over
the wall time. `play_round` and the tables serve the torch demo
(`timeslice.demo_torch`, real PyTorch jobs) as well.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol, TextIO, TypeVar

import numpy as np

from timeslice.agent.server import Agent
from timeslice.client import AsyncTimeSliceOrchestratorClient
from timeslice.client.workload import register_workload
from timeslice.demo_profiles import PROFILES, Profile
from timeslice.errors import InvalidArgumentError
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.server import Orchestrator
from timeslice.orchestrator.watches import Notice, Watch
from timeslice.replay import read_journal, render_page
from timeslice.workloads import HostMemoryWorkload

GROUP = "accelerator"
NODE = "demo-node"
MiB = 1024 * 1024
# The arrays of a job's context: name and share of its bytes.
LAYOUT = (("weights", 0.5), ("optimizer", 0.25), ("kv_cache", 0.25))


@dataclass(frozen=True)
class DemoConfig:
    """What the demo runs. Validated on construction."""

    jobs: int = 2
    steps: int = 8
    step_s: float = 1.5  # one step of a job, all its phases together
    mib: int = 16  # each job's context
    profile: str = "verl-async"

    def __post_init__(self) -> None:
        if not 1 <= self.jobs <= 16:
            raise InvalidArgumentError("jobs must be between 1 and 16")
        if self.steps < 1 or not self.step_s > 0 or self.mib < 1:
            raise InvalidArgumentError("steps, step_s and mib must be positive")
        if self.profile not in PROFILES:
            raise InvalidArgumentError(
                f"unknown profile {self.profile!r}; known: {', '.join(sorted(PROFILES))}"
            )


class RoundJob(Protocol):
    """What a round runs and shows of a job: its name, its progress for the live view,
    the time it held the accelerator doing its work, and its context (the workload
    registered with the agent)."""

    @property
    def name(self) -> str: ...
    @property
    def step(self) -> int: ...
    @property
    def phase(self) -> str: ...
    @property
    def held_s(self) -> float: ...
    @property
    def context(self) -> object: ...


J = TypeVar("J", bound=RoundJob)


@dataclass
class RoundResult:
    """What one round measured."""

    label: str
    wall_s: float
    busy_s: float  # time the accelerator was held by a job doing its work
    switch_s: list[float]  # each switch: grant decided -> contexts moved
    bytes_moved: int
    journal: Path

    @property
    def busy_share(self) -> float:
        return self.busy_s / self.wall_s


@dataclass
class DemoResult:
    """Both rounds, side by side."""

    config: DemoConfig
    back_to_back: RoundResult
    time_sliced: RoundResult
    replay: Path  # the replay page of both rounds

    @property
    def speedup(self) -> float:
        return self.back_to_back.wall_s / self.time_sliced.wall_s


class DemoJob:
    """One simulated RL job: its context in host memory, and its loop of steps."""

    def __init__(self, name: str, mib: int, store: Path) -> None:
        self.name = name
        self.context = HostMemoryWorkload(store)
        for array, share in LAYOUT:
            elements = int(mib * MiB * share) // 4
            self.context.allocate(array, elements, np.float32, tags=[array])[:] = 0.0
        self.value = 0.0
        self.context.snapshot()  # parked in host memory until its first turn
        self.step = 0
        self.phase = "waiting"
        self.held_s = 0.0

    async def run(
        self, client: AsyncTimeSliceOrchestratorClient, profile: Profile, steps: int, step_s: float
    ) -> None:
        for self.step in range(1, steps + 1):
            for phase in profile.phases:
                self.phase = phase.name
                length = phase.share * step_s
                if not phase.on_accelerator:
                    await asyncio.sleep(length)
                    continue
                async with client.acquire():
                    began = time.monotonic()
                    await asyncio.to_thread(self._work)  # the event loop stays responsive
                    await asyncio.sleep(max(0.0, length - (time.monotonic() - began)))
                    self.held_s += time.monotonic() - began
        self.phase = "done"

    def _work(self) -> None:
        """What the job does on the accelerator: read back what it wrote last time
        (the restore must have brought it back), write the next values."""
        for array, _ in LAYOUT:
            data = self.context[array]
            if not np.all(data == self.value):
                raise RuntimeError(f"{self.name}: {array} did not come back as it was left")
            data[:] = self.value + 1
            del data
        self.value += 1

    def close(self) -> None:
        self.context.close()


class Switches:
    """The switches of a round, as the orchestrator's Watch tells them."""

    def __init__(self) -> None:
        self.started: dict[int, float] = {}
        self.seconds: list[float] = []
        self.bytes = 0
        self.holder = ""

    async def follow(self, watch: Watch[Notice]) -> None:
        async for notice in watch:
            match notice.effect:
                case ev.SwitchStarted(token=token):
                    self.started[token] = notice.time
                case ev.Granted(job=job, token=token, switch_bytes=moved):
                    self.holder = job
                    if (began := self.started.pop(token, None)) is not None:
                        self.seconds.append(notice.time - began)
                        self.bytes += moved
                case ev.Yielded(again=False) | ev.Revoked():
                    self.holder = ""


class LiveView:
    """A line of progress: each job's step and phase, and who holds the accelerator."""

    def __init__(self, out: TextIO, label: str, jobs: Sequence[RoundJob], steps: int) -> None:
        self.out, self.label, self.jobs, self.steps = out, label, jobs, steps
        self.tty = out.isatty()

    async def show(self, switches: Switches, began: float) -> None:
        every = 0.2 if self.tty else 2.0
        while True:
            await asyncio.sleep(every)
            self.print(switches, began, final=False)

    def print(self, switches: Switches, began: float, final: bool) -> None:
        jobs = "  ".join(
            f"{j.name} {'#' * j.step}{'.' * (self.steps - j.step)} {j.phase:<12.12}"
            for j in self.jobs
        )
        line = (
            f"  {self.label:<12} {time.monotonic() - began:5.1f} s  {jobs}"
            f" holder: {switches.holder or '-':<6} switches: {len(switches.seconds)}"
        )
        if self.tty and not final:
            print(f"\r{line}", end="", file=self.out, flush=True)
        else:
            print(f"\r{line}" if self.tty else line, file=self.out, flush=True)


async def run_round(config: DemoConfig, shared: bool, directory: Path, out: TextIO) -> RoundResult:
    """Run the jobs on a fresh orchestrator and agent: together (`shared`) or one after
    the other."""
    profile = PROFILES[config.profile]
    slug = round_label(shared).replace(" ", "-")
    jobs = [
        DemoJob(f"job-{i + 1}", config.mib, directory / f"store-{slug}-{i + 1}")
        for i in range(config.jobs)
    ]
    try:
        return await play_round(
            jobs,
            lambda job, client: job.run(client, profile, config.steps, config.step_s),
            shared=shared,
            directory=directory,
            steps=config.steps,
            out=out,
        )
    finally:
        for job in jobs:
            job.close()


def round_label(shared: bool) -> str:
    """What a round is called in the live view, the table and its files' names."""
    return "time-sliced" if shared else "back to back"


async def play_round(
    jobs: Sequence[J],
    run: Callable[[J, AsyncTimeSliceOrchestratorClient], Awaitable[None]],
    *,
    shared: bool,
    directory: Path,
    steps: int,
    out: TextIO,
) -> RoundResult:
    """Register the jobs' contexts with a fresh orchestrator and agent (journal under
    `directory`) and `run` each job with a client of its own: all at once (`shared`)
    or one after the other; measure the round. The jobs stay the caller's to close."""
    label = round_label(shared)
    journal = directory / f"journal-{label.replace(' ', '-')}.db"
    async with Orchestrator(db=f"sqlite:///{journal}", group_nodes={GROUP: (NODE,)}) as orch:
        agent = Agent(node_name=NODE, backends=("app_channel",), orchestrator=orch.address)
        async with agent:
            # The demo's own servers are plain and local: credentials a shell may hold
            # for another orchestrator (TIMESLICE_TLS_CA, TIMESLICE_TOKEN) are not theirs.
            registrations = [
                await register_workload(
                    agent.address, job.name, GROUP, job.context, credentials_from_env=False
                )
                for job in jobs
            ]
            clients = [
                AsyncTimeSliceOrchestratorClient(
                    orch.address, job_id=job.name, group_id=GROUP, credentials_from_env=False
                )
                for job in jobs
            ]
            switches = Switches()
            watch = orch.watch(GROUP)
            following = asyncio.create_task(switches.follow(watch))
            view = LiveView(out, label, jobs, steps)
            began = time.monotonic()
            showing = asyncio.create_task(view.show(switches, began))
            try:
                runs = [run(job, c) for job, c in zip(jobs, clients, strict=True)]
                if shared:
                    await asyncio.gather(*runs)
                else:
                    for one in runs:
                        await one
                wall = time.monotonic() - began
            finally:
                showing.cancel()
                view.print(switches, began, final=True)
                watch.close()
                following.cancel()
                await asyncio.gather(showing, following, return_exceptions=True)
                for client in clients:
                    await client.close()
                for registration in registrations:
                    await registration.close()
    busy = sum(job.held_s for job in jobs)
    return RoundResult(label, wall, busy, switches.seconds, switches.bytes, journal)


async def run_demo(
    config: DemoConfig, directory: Path | None = None, out: TextIO | None = None
) -> DemoResult:
    """Run both rounds (journals under `directory`, a new temporary one by default);
    print the live view and the table of results to `out` (standard output)."""
    out = out or sys.stdout
    directory = directory or Path(tempfile.mkdtemp(prefix="timeslice-demo-"))
    profile = PROFILES[config.profile]
    print(
        f"{config.jobs} simulated RL jobs x {config.steps} steps of {config.step_s:g} s "
        f"({profile.description});\neach job's context: {config.mib} MiB of host memory, "
        f"really moved out and back at every switch\n",
        file=out,
    )
    alone = await run_round(config, False, directory, out)
    together = await run_round(config, True, directory, out)
    result = DemoResult(config, alone, together, await write_replay(directory, alone, together))
    print_table(result, out)
    return result


async def write_replay(directory: Path, *rounds: RoundResult) -> Path:
    """The replay page of the rounds' journals, one run each."""
    timelines = []
    for played in rounds:
        record = await read_journal(f"sqlite:///{played.journal}")
        timelines.append(replace(record, label=f"demo, {played.label}").timeline())
    page = directory / "replay.html"
    page.write_text(render_page(timelines, "timeslice demo"), encoding="utf-8")
    return page


def print_table(result: DemoResult, out: TextIO) -> None:
    """The two rounds side by side."""
    a, b = result.back_to_back, result.time_sliced
    print_rounds(round_rows(a, b), out)
    print(f"\nreplay, switch by switch (open in a browser): {result.replay}", file=out)
    print(f"journals: {a.journal} and {b.journal}", file=out)


def round_rows(a: RoundResult, b: RoundResult) -> list[tuple[str, str, str]]:
    """What the table shows of a round back to back (`a`) and one time-sliced (`b`)."""

    def switch_cost(r: RoundResult) -> str:
        return f"{statistics.median(r.switch_s) * 1000:.1f} ms" if r.switch_s else "-"

    return [
        ("wall time", f"{a.wall_s:.2f} s", f"{b.wall_s:.2f} s"),
        ("speedup", "1.00x", f"{a.wall_s / b.wall_s:.2f}x"),
        ("accelerator busy", f"{a.busy_share:.0%}", f"{b.busy_share:.0%}"),
        ("switches", str(len(a.switch_s)), str(len(b.switch_s))),
        ("median switch (contexts moved)", switch_cost(a), switch_cost(b)),
        ("bytes moved", f"{a.bytes_moved / MiB:.0f} MiB", f"{b.bytes_moved / MiB:.0f} MiB"),
    ]


def print_rounds(rows: Sequence[tuple[str, str, str]], out: TextIO) -> None:
    """Rows of (what, back to back, time-sliced), aligned under a header."""
    width = max(len(r[0]) for r in rows)
    print(f"\n{'':{width}}  {'back to back':>14}  {'time-sliced':>14}", file=out)
    for name, x, y in rows:
        print(f"{name:{width}}  {x:>14}  {y:>14}", file=out)
