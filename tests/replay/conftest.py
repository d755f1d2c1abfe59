"""A journal recorded by the real system (an Orchestrator whose group spans one
Agent, two jobs with host-memory workloads taking turns), and the recorded veRL
runs, for the replay tests."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from timeslice import Agent, AsyncTimeSliceOrchestratorClient, Orchestrator
from timeslice.client.workload import register_workload
from timeslice.replay import Timeline, read_journal
from timeslice.workloads import HostMemoryWorkload

TURNS = 3  # grants per job
ARRAY_BYTES = 1 << 16  # each job's "accelerator memory"
VERL_RUNS = Path(__file__).resolve().parents[1] / "data" / "verl-replay-runs.json"


async def record(db: Path, memory: Path) -> None:
    """Jobs A and B share group g (node n1) for TURNS turns each."""
    async with Orchestrator(db=f"sqlite:///{db}", group_nodes={"g": ("n1",)}) as orch:
        async with Agent(
            node_name="n1", backends=("app_channel",), orchestrator=orch.address
        ) as agent:
            registrations = []
            for job in ("A", "B"):
                workload = HostMemoryWorkload(memory / job)
                workload.allocate("weights", ARRAY_BYTES // 8, np.float64)[:] = 1.0
                registrations.append(await register_workload(agent.address, job, "g", workload))

            left = {"A": TURNS, "B": TURNS}

            async def take_turns(job: str, other: str) -> None:
                async with AsyncTimeSliceOrchestratorClient(
                    orch.address, job_id=job, group_id="g"
                ) as client:
                    for _ in range(TURNS):
                        async with client.acquire():
                            left[job] -= 1
                            await asyncio.sleep(0.02)  # the phase on the accelerators
                            # Hand over only to a job that waits: every grant switches.
                            while left[other] and other not in orch.table.groups["g"].queue:
                                await asyncio.sleep(0.002)
                        await asyncio.sleep(0.002)

            try:
                turns = asyncio.gather(take_turns("A", "B"), take_turns("B", "A"))
                await asyncio.wait_for(turns, 60)
            finally:
                for registration in registrations:
                    await registration.close()


@pytest.fixture(scope="session")
def recorded_journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SQLite file of a journal the real system wrote."""
    root = tmp_path_factory.mktemp("recorded")
    db = root / "journal.db"
    asyncio.run(record(db, root / "memory"))
    return db


@contextmanager
def connect(db: Path) -> Iterator[sqlite3.Connection]:
    """A connection to `db` that commits and closes at the end of the block."""
    conn = sqlite3.connect(db)
    try:
        with conn:
            yield conn
    finally:
        conn.close()


@pytest.fixture(scope="session")
def journal_timeline(recorded_journal: Path) -> Timeline:
    """The recorded journal's timeline (read before any test starts a browser, whose
    driver runs an event loop of its own)."""
    return asyncio.run(read_journal(str(recorded_journal))).timeline()


def journal_rows(db: Path, kind: str) -> list[tuple[int, float, str]]:
    """The journal's rows of one event kind, read with nothing of the package."""
    with connect(db) as conn:
        return list(
            conn.execute("SELECT seq, ts, payload FROM events WHERE kind = ? ORDER BY seq", (kind,))
        )


@pytest.fixture(scope="session")
def verl_runs_path() -> Path:
    """The recorded veRL runs (the copy under tests/data)."""
    return VERL_RUNS
