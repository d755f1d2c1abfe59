"""One orchestrator writes a journal: a second one on the same journal refuses to
start and names the first; on PostgreSQL (TIMESLICE_TEST_POSTGRES_URL), one whose
claim goes with its connection stops granting at once."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from timeslice.errors import JournalClaimLostError, JournalInUseError, UnavailableError
from timeslice.orchestrator.journal import SqlJournal
from timeslice.orchestrator.server import Orchestrator

POSTGRES_URL = os.environ.get("TIMESLICE_TEST_POSTGRES_URL")
pytestmark = pytest.mark.timeout(60)


async def test_a_second_orchestrator_on_a_journal_in_use_refuses_to_start(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'journal.db'}"
    async with Orchestrator(db=db) as first:
        await first.acquire("g", "a")
        second = Orchestrator(db=db)
        with pytest.raises(JournalInUseError, match=f"is in use by pid {os.getpid()} on host"):
            await second.start()
        await second.close()
        # the first goes on serving
        await first.yield_("g", "a")
        await first.acquire("g", "b")
    async with Orchestrator(db=db) as third:
        holder = third.table.groups["g"].holder
        assert holder is not None and holder.job == "b"


def serve(db: Path, stderr: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "timeslice", "serve", "orchestrator", "--port", "0"]
    with stderr.open("wb") as out:
        return subprocess.Popen([*command, "--db", str(db)], stderr=out, cwd=db.parent)


@pytest.mark.slow
def test_a_second_serve_orchestrator_process_exits_saying_the_journal_is_in_use(
    tmp_path: Path,
) -> None:
    db = tmp_path / "journal.db"
    first_log = tmp_path / "first.log"
    first = serve(db, first_log)
    try:
        deadline = time.monotonic() + 30
        while "serving on" not in first_log.read_text():
            assert first.poll() is None, first_log.read_text()
            assert time.monotonic() < deadline, first_log.read_text()
            time.sleep(0.05)
        second_log = tmp_path / "second.log"
        started = time.monotonic()
        second = serve(db, second_log)
        assert second.wait(30) != 0
        assert time.monotonic() - started < 30
        printed = second_log.read_text()
        assert f"in use by pid {first.pid} on host" in " ".join(printed.split()), printed
        assert first.poll() is None  # the first is untouched
    finally:
        first.terminate()
        first.wait(10)


@pytest.mark.skipif(POSTGRES_URL is None, reason="TIMESLICE_TEST_POSTGRES_URL is not set")
async def test_an_orchestrator_that_loses_its_claim_stops_granting() -> None:
    assert POSTGRES_URL is not None
    engine = create_async_engine(SqlJournal(POSTGRES_URL).url)
    try:
        async with engine.begin() as conn:
            for table in ("events", "snapshots", "journal_meta"):
                await conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
        async with Orchestrator(db=POSTGRES_URL) as orch:
            await orch.acquire("g", "a")
            waiter = asyncio.ensure_future(orch.acquire("g", "b"))
            while not orch.table.groups["g"].queue:
                await asyncio.sleep(0.01)
            async with engine.connect() as conn:
                await conn.execute(
                    sa.text(
                        "SELECT pg_terminate_backend(pid) FROM pg_locks"
                        " WHERE locktype = 'advisory' AND granted"
                    )
                )
            await asyncio.wait_for(orch.wait_stopped(), 15)
            assert isinstance(orch.failure, JournalClaimLostError)
            with pytest.raises(UnavailableError, match="claim"):
                await waiter
            with pytest.raises(UnavailableError, match="stopped"):
                await orch.yield_("g", "a")
    finally:
        await engine.dispose()
