"""Scratch databases on the test PostgreSQL server, for what needs a journal of its
own (a fault campaign's run, a failover test, a benchmark's side): made fresh,
dropped afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import sqlalchemy as sa


def database_url(url: str, database: str, *, port: int | None = None) -> str:
    """`url` naming `database` (and reached on 127.0.0.1:`port`, through a proxy)."""
    parsed = sa.engine.make_url(url).set(database=database)
    if port is not None:
        parsed = parsed.set(host="127.0.0.1", port=port)
    return parsed.render_as_string(hide_password=False)


async def _admin(url: str, statement: str) -> None:
    """Run `statement` outside a transaction (CREATE and DROP DATABASE need that)."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from timeslice.orchestrator.journal import SqlJournal

    engine = create_async_engine(SqlJournal(url).url, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.execute(sa.text(statement))
    finally:
        await engine.dispose()


async def create_database(url: str, name: str) -> None:
    """A fresh database `name` on `url`'s server (one left by an earlier run goes)."""
    await _admin(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await _admin(url, f'CREATE DATABASE "{name}"')


async def drop_database(url: str, name: str) -> None:
    """Drop database `name` on `url`'s server, if it is there; never raises."""
    with contextlib.suppress(Exception):
        await _admin(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.asynccontextmanager
async def scratch_database(url: str, name: str) -> AsyncIterator[str]:
    """A fresh database `name` on `url`'s server for the block, dropped after: its URL."""
    await create_database(url, name)
    try:
        yield database_url(url, name)
    finally:
        await drop_database(url, name)
