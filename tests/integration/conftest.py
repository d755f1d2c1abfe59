"""Fixtures of the integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from tests.optional import need_postgres
from timeslice import Agent
from timeslice.orchestrator.journal import SqlJournal

#: The tables of a PostgreSQL journal, its leader lease's included.
JOURNAL_TABLES = ("events", "snapshots", "journal_meta", "leader_lease")


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[Agent]:
    async with Agent(node_name="n1", db=f"sqlite:///{tmp_path / 'agent.db'}",
                     backends=("noop", "app_channel")) as running:  # fmt: skip
        yield running
        running.table.validate()


@pytest.fixture
async def database() -> AsyncIterator[str]:
    """The test PostgreSQL server's URL (TIMESLICE_TEST_POSTGRES_URL, see
    `need_postgres`), its journal's tables dropped: the test starts on an empty
    journal and no leader lease."""
    url = need_postgres()
    engine = create_async_engine(SqlJournal(url).url)
    try:
        async with engine.begin() as conn:
            for table in JOURNAL_TABLES:
                await conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
    finally:
        await engine.dispose()
    yield url
