"""One writer per journal: a second `SqlJournal` on a journal that is open is
refused with a message that names the first one's pid and host, and takes it once
the first has closed. On PostgreSQL (when TIMESLICE_TEST_POSTGRES_URL is set) the
claim is an advisory lock on a connection of its own: losing that connection is
reported, and the journal writes nothing more."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from timeslice.errors import JournalClaimLostError, JournalError, JournalInUseError
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.journal import SqlJournal, open_journal

POSTGRES_URL = os.environ.get("TIMESLICE_TEST_POSTGRES_URL")
pytestmark = pytest.mark.timeout(30)

EVENT = ev.Acquire(now=1.0, group="g", job="a", call_id="0.1")


async def test_a_second_writer_is_refused_with_the_holders_pid(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    first = SqlJournal(str(path))
    await first.open()
    try:
        second = SqlJournal(f"sqlite:///{path}")
        with pytest.raises(JournalInUseError) as refused:
            await second.open()
        message = str(refused.value)
        assert f"journal {path} is in use by pid {os.getpid()}" in message
        assert f"on host {socket.gethostname()} since " in message
        assert "\n" not in message
        # the refused one holds nothing, and the first goes on writing
        await second.close()
        assert await first.append([EVENT]) == 1
    finally:
        await first.close()
    third = SqlJournal(str(path))
    await third.open()
    try:
        assert [seq for seq, _, _ in await third.read()] == [1]
        assert await third.append([EVENT]) == 2
    finally:
        await third.close()


async def test_the_lock_file_names_the_holder_while_it_is_open(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    lock = tmp_path / "journal.db.lock"
    journal = SqlJournal(str(path))
    await journal.open()
    try:
        holder = json.loads(lock.read_text())
        assert (holder["pid"], holder["host"]) == (os.getpid(), socket.gethostname())
    finally:
        await journal.close()
    assert lock.read_text() == ""  # kept, but nobody holds it


async def test_a_refused_start_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    first = SqlJournal(str(path))
    await first.open()
    try:
        await first.append([EVENT])
        before = path.read_bytes()
        with pytest.raises(JournalInUseError):
            await SqlJournal(str(path)).open()
        assert path.read_bytes() == before
    finally:
        await first.close()


async def test_a_reader_needs_no_claim(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    writer = SqlJournal(str(path))
    await writer.open()
    try:
        await writer.append([EVENT])
        reader = SqlJournal(str(path), read_only=True)
        await reader.open()
        try:
            assert [e for _, _, e in await reader.read()] == [EVENT]
            with pytest.raises(RuntimeError, match="reading only"):
                await reader.append([EVENT])
        finally:
            await reader.close()
    finally:
        await writer.close()


async def test_a_reader_does_not_create_a_journal(tmp_path: Path) -> None:
    reader = SqlJournal(str(tmp_path / "none.db"), read_only=True)
    with pytest.raises(JournalError, match="no journal at"):
        await reader.open()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", ["memory", "sqlite://", "sqlite:///:memory:"])
async def test_journals_in_memory_claim_nothing(url: str, tmp_path: Path) -> None:
    journals = [open_journal(url), open_journal(url)]
    for journal in journals:
        await journal.open()
    for journal in journals:
        assert await journal.append([EVENT]) == 1
        await journal.close()


# --- PostgreSQL -----------------------------------------------------------------------

postgres = pytest.mark.skipif(POSTGRES_URL is None, reason="TIMESLICE_TEST_POSTGRES_URL is not set")


@pytest.fixture
async def clean_postgres() -> str:
    assert POSTGRES_URL is not None
    engine = create_async_engine(SqlJournal(POSTGRES_URL).url)
    try:
        async with engine.begin() as conn:
            for table in ("events", "snapshots", "journal_meta"):
                await conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
    finally:
        await engine.dispose()
    return POSTGRES_URL


@postgres
async def test_postgres_a_second_writer_is_refused_with_the_holders_pid(
    clean_postgres: str,
) -> None:
    first = SqlJournal(clean_postgres)
    await first.open()
    try:
        with pytest.raises(JournalInUseError) as refused:
            await SqlJournal(clean_postgres).open()
        message = str(refused.value)
        assert f"is in use by pid {os.getpid()} on host {socket.gethostname()} since" in message
        assert "\n" not in message
        assert await first.append([EVENT]) == 1
    finally:
        await first.close()
    again = SqlJournal(clean_postgres)
    await again.open()
    try:
        assert await again.append([EVENT]) == 2
    finally:
        await again.close()


async def _terminate_claim(url: str) -> int:
    """End the session that holds the writer's advisory lock, as a failover or a
    network partition would; the number of sessions ended."""
    engine = create_async_engine(SqlJournal(url).url)
    try:
        async with engine.connect() as conn:
            ended = await conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_locks"
                    " WHERE locktype = 'advisory' AND granted"
                )
            )
            return len(ended.all())
    finally:
        await engine.dispose()


@postgres
async def test_postgres_a_lost_claim_is_reported_and_nothing_more_is_written(
    clean_postgres: str,
) -> None:
    lost: asyncio.Queue[JournalClaimLostError] = asyncio.Queue()
    journal = SqlJournal(clean_postgres, on_claim_lost=lost.put_nowait, claim_check_every=0.2)
    await journal.open()
    try:
        assert await journal.append([EVENT]) == 1
        assert await _terminate_claim(clean_postgres) == 1
        error = await asyncio.wait_for(lost.get(), 10)
        assert "claim is lost" in str(error) and "\n" not in str(error)
        with pytest.raises(JournalClaimLostError):
            await journal.append([EVENT])
        with pytest.raises(JournalClaimLostError):
            await journal.save_snapshot(1, {})
        assert lost.empty()  # told once
        # another writer may take the journal now
        other = SqlJournal(clean_postgres)
        await other.open()
        await other.close()
    finally:
        await journal.close()


@postgres
async def test_postgres_a_closed_journal_reports_no_loss(clean_postgres: str) -> None:
    lost: list[JournalClaimLostError] = []
    journal = SqlJournal(clean_postgres, on_claim_lost=lost.append, claim_check_every=0.05)
    await journal.open()
    await asyncio.sleep(0.2)
    await journal.close()
    await asyncio.sleep(0.2)
    assert lost == []
