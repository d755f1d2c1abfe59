"""Active and standby writers of one PostgreSQL journal (TIMESLICE_TEST_POSTGRES_URL):
a second writer with a leader lease waits as a standby, takes over when the
active's lease expires (a higher epoch), and from then on the deposed writer
commits nothing: its append fails and it steps down."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa

from tests.faults.proxy import Proxy
from timeslice.errors import JournalClaimLostError
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.journal import SqlJournal

POSTGRES_URL = os.environ.get("TIMESLICE_TEST_POSTGRES_URL")
pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.skipif(POSTGRES_URL is None, reason="TIMESLICE_TEST_POSTGRES_URL is not set"),
]
LEASE = 0.6
EVENT = ev.Acquire(now=1.0, group="g", job="a", call_id="0.1")


@contextlib.asynccontextmanager
async def through_a_proxy(
    database: str, lease: float
) -> AsyncIterator[tuple[Proxy, SqlJournal, list[JournalClaimLostError]]]:
    """A journal with `lease` whose database is reached through a proxy the test can
    cut; the claims it lost."""
    url = sa.engine.make_url(database)
    proxy = Proxy(url.host or "127.0.0.1", url.port or 5432)
    await proxy.start()
    through = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    lost: list[JournalClaimLostError] = []
    journal = SqlJournal(through, leader_lease=lease, on_claim_lost=lost.append)
    try:
        yield proxy, journal, lost
    finally:
        await journal.close()
        await proxy.close()


async def test_a_standby_takes_over_an_expired_lease_and_fences_the_deposed_writer(
    database: str,
) -> None:
    lost: list[JournalClaimLostError] = []
    waiting: list[object] = []
    first = SqlJournal(database, leader_lease=LEASE, on_claim_lost=lost.append)
    second = SqlJournal(database, leader_lease=LEASE, on_standby=waiting.append)
    await first.open()
    try:
        assert first.epoch == 1
        assert await first.append([EVENT]) == 1
        standby = asyncio.ensure_future(second.open())
        await asyncio.sleep(LEASE * 1.5)  # renewed meanwhile: the standby still waits
        assert not standby.done() and len(waiting) == 1
        assert await first.append([EVENT]) == 2
        # freeze the active's renewals: the lease runs out, the standby takes over
        assert first._lease is not None and first._lease._task is not None
        first._lease._task.cancel()
        frozen = time.monotonic()
        await asyncio.wait_for(standby, LEASE + 2)
        assert time.monotonic() - frozen < LEASE + 2
        assert second.epoch == 2
        # taking the advisory lock ended the deposed one's session: it was told
        await asyncio.sleep(0.1)
        assert lost and "claim is lost" in str(lost[0])
        # a writer frozen before it could notice: its append reaches the database,
        # commits nothing, and it steps down
        first._lost = None
        with pytest.raises(JournalClaimLostError, match="took the leader lease over"):
            await first.append([EVENT])
        assert first._lease.standing.role.value == "stepped_down"
        assert [seq for seq, _, _ in await second.read()] == [1, 2]
        assert await second.append([EVENT]) == 3
    finally:
        await first.close()
        await second.close()


async def test_a_closed_active_lets_a_standby_take_over_at_once(database: str) -> None:
    first = SqlJournal(database, leader_lease=5.0)
    second = SqlJournal(database, leader_lease=5.0)
    await first.open()
    try:
        standby = asyncio.ensure_future(second.open())
        await asyncio.sleep(0.2)
        assert not standby.done()
        closed = time.monotonic()
        await first.close()
        await asyncio.wait_for(standby, 5.0)
        assert time.monotonic() - closed < 2.5  # not the whole lease
        assert second.epoch == 2
    finally:
        await first.close()
        await second.close()


async def test_candidates_started_together_on_an_database_elect_one(
    database: str,
) -> None:
    """Three candidates create the lease table at once: one of them becomes active,
    none fails (PostgreSQL's CREATE TABLE IF NOT EXISTS races with itself)."""
    journals = [SqlJournal(database, leader_lease=LEASE) for _ in range(3)]
    opening = [asyncio.ensure_future(j.open()) for j in journals]
    try:
        done, _ = await asyncio.wait(opening, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        [first] = done
        first.result()
        await asyncio.sleep(LEASE)
        assert sum(o.done() for o in opening) == 1  # the others wait as standbys
        assert [j.epoch for j in journals if j.epoch] == [1]
    finally:
        for o in opening:
            o.cancel()
        await asyncio.gather(*opening, return_exceptions=True)
        for j in journals:
            await j.close()


async def test_an_active_cut_off_from_the_database_steps_down_within_its_lease(
    database: str,
) -> None:
    """A partition (a proxy that stops passing bytes, its connections left open):
    the active's renewal gets no answer, it steps down, and its close does not hang
    on the database it cannot reach."""
    async with through_a_proxy(database, LEASE) as (proxy, journal, lost):
        await journal.open()
        await journal.append([EVENT])
        proxy.cut()
        cut = time.monotonic()
        while not lost:
            assert time.monotonic() - cut < LEASE + 1, "it did not step down"
            await asyncio.sleep(0.02)
        assert "leader lease" in lost[0].message
        closing = time.monotonic()
        await journal.close()
        assert time.monotonic() - closing < 4  # each wait on the database is bounded


async def test_an_active_whose_database_stalls_for_less_than_its_lease_stays_active(
    database: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A database that answers nothing for a while (a busy host, its connections
    kept): a renewal gets no answer in time, the active tries again while its lease
    holds, and once the database answers it is still the active, same epoch."""
    lease = 3.0  # renewed every 1 s, each renewal waits 1 s at most; held 2.7 s
    async with through_a_proxy(database, lease) as (proxy, journal, lost):
        await journal.open()
        await journal.append([EVENT])
        assert journal._lease is not None
        held = journal._lease._held_until
        while journal._lease._held_until == held:  # just after a renewal
            await asyncio.sleep(0.005)
        # The next renewal goes out about 1 s later and gets no answer for 1 s;
        # the try after it comes back late, within the 2.7 s the lease holds.
        with caplog.at_level("WARNING", logger="timeslice.orchestrator.journal_lease"):
            proxy.cut()
            await asyncio.sleep(2.3)
            proxy.resume()  # what was held back passes, late
            await asyncio.sleep(lease)  # renewed again since, more than once
        assert lost == []
        assert "renewing the leader lease failed" in caplog.text  # it did stall
        assert journal.epoch == 1 and await journal.append([EVENT]) == 2
