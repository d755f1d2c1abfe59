"""A journal of bounded size: a snapshot's write deletes the snapshots no longer
needed and the events that a snapshot has covered for longer than the retention;
nothing else is ever deleted. Every journal passes the same tests, on a clock of
the test's own (PostgreSQL when TIMESLICE_TEST_POSTGRES_URL is set)."""

from __future__ import annotations

import math
import os
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import closing
from pathlib import Path
from typing import ClassVar

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from timeslice.errors import InvalidArgumentError
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.journal import (
    DEFAULT_RETENTION,
    Journal,
    MemoryJournal,
    SqlJournal,
    compaction,
)
from timeslice.orchestrator.server import Orchestrator, OrchestratorConfig
from timeslice.replay import read_journal

POSTGRES_URL = os.environ.get("TIMESLICE_TEST_POSTGRES_URL")
pytestmark = pytest.mark.timeout(60)

EVENT = ev.Acquire(now=1.0, group="g", job="a", call_id="0.1")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- what a snapshot's write deletes ------------------------------------------------


def test_nothing_to_compact_without_snapshots() -> None:
    assert compaction([], 10.0, 0.0) == (0, [])


def test_retention_zero_keeps_the_newest_snapshot_and_the_events_after_it() -> None:
    assert compaction([(10, 1.0), (20, 2.0), (30, 3.0)], 3.0, 0.0) == (30, [10, 20])


def test_events_stay_until_a_snapshot_has_covered_them_for_the_retention() -> None:
    snapshots = [(10, 0.0), (20, 50.0), (30, 90.0)]
    # nothing is 100 s old yet: everything stays
    assert compaction(snapshots, 90.0, 100.0) == (0, [])
    # the snapshot of t=0 is: the events it covers go, it stays as the base
    assert compaction(snapshots, 100.0, 100.0) == (10, [])
    assert compaction([*snapshots, (40, 160.0)], 160.0, 100.0) == (20, [10])


def test_snapshots_between_the_base_and_the_newest_are_thinned() -> None:
    every_second = [(seq, float(seq)) for seq in range(1, 101)]
    upto, drop = compaction(every_second, 100.0, 80.0)
    kept = sorted({seq for seq, _ in every_second} - set(drop))
    assert upto == 20  # the newest 80 s old
    assert kept[0] == 20 and kept[-1] == 100
    # one per eighth of the retention: a handful, not eighty
    assert len(kept) <= 10
    assert all(b - a > 10 for a, b in zip(kept, kept[1:-1], strict=False))


# --- every journal --------------------------------------------------------------------

Factory = Callable[[float], Journal]


class RetentionContract:
    persistent: ClassVar[bool] = False

    @pytest.fixture
    def clock(self) -> Clock:
        return Clock()

    @pytest.fixture
    def make(self, clock: Clock) -> Factory:
        raise NotImplementedError

    @pytest.fixture
    async def open_journal(self, make: Factory) -> AsyncIterator[Callable[[float], Journal]]:
        opened: list[Journal] = []

        def opener(retention: float) -> Journal:
            journal = make(retention)
            opened.append(journal)
            return journal

        yield opener
        for journal in opened:
            await journal.close()

    async def test_retention_zero_deletes_what_a_snapshot_covers(
        self, open_journal: Callable[[float], Journal]
    ) -> None:
        journal = open_journal(0.0)
        await journal.open()
        await journal.append([EVENT] * 5)
        await journal.save_snapshot(3, {"at": 3})
        assert [seq for seq, _, _ in await journal.read()] == [4, 5]
        await journal.save_snapshot(5, {"at": 5})
        assert await journal.read() == []
        assert await journal.snapshot_before(4) is None  # the older snapshot is gone
        loaded = await journal.load()
        assert (loaded.snapshot, loaded.tail, loaded.last_seq) == ({"at": 5}, [], 5)
        # numbering goes on after the snapshot, though no event is left
        assert await journal.append([EVENT]) == 6

    async def test_events_stay_for_the_retention_then_go(
        self, open_journal: Callable[[float], Journal], clock: Clock
    ) -> None:
        journal = open_journal(100.0)
        await journal.open()
        await journal.append([EVENT] * 3)
        await journal.save_snapshot(3, {"at": 3})
        clock.now += 60
        await journal.append([EVENT] * 3)
        await journal.save_snapshot(6, {"at": 6})
        assert [seq for seq, _, _ in await journal.read()] == [1, 2, 3, 4, 5, 6]
        clock.now += 60  # the first snapshot is 120 s old, the second 60
        await journal.append([EVENT] * 3)
        await journal.save_snapshot(9, {"at": 9})
        assert [seq for seq, _, _ in await journal.read()] == [4, 5, 6, 7, 8, 9]
        # what is kept starts right after a snapshot that is kept
        assert await journal.snapshot_before(3) == (3, {"at": 3})
        assert (await journal.load()).snapshot == {"at": 9}

    async def test_the_default_keeps_a_day(self, open_journal: Callable[[float], Journal]) -> None:
        assert DEFAULT_RETENTION == 24 * 3600
        journal = open_journal(DEFAULT_RETENTION)
        await journal.open()
        await journal.append([EVENT] * 4)
        await journal.save_snapshot(2, {})
        await journal.save_snapshot(4, {})
        assert len(await journal.read()) == 4

    async def test_numbering_goes_on_after_a_reopen_of_a_compacted_journal(
        self, make: Factory
    ) -> None:
        if not self.persistent:
            pytest.skip("this journal keeps nothing once closed")
        first = make(0.0)
        await first.open()
        await first.append([EVENT] * 4)
        await first.save_snapshot(4, {"at": 4})
        await first.close()
        second = make(0.0)
        await second.open()
        try:
            assert await second.read() == []
            assert await second.append([EVENT]) == 5
            loaded = await second.load()
            assert (loaded.snapshot_seq, [seq for seq, _ in loaded.tail]) == (4, [5])
        finally:
            await second.close()


class TestMemoryJournal(RetentionContract):
    @pytest.fixture
    def make(self, clock: Clock) -> Factory:
        return lambda retention: MemoryJournal(retention=retention, clock=clock)


class TestSqliteFileJournal(RetentionContract):
    persistent = True

    @pytest.fixture
    def make(self, clock: Clock, tmp_path: Path) -> Factory:
        path = str(tmp_path / "journal.db")
        return lambda retention: SqlJournal(path, retention=retention, clock=clock)


class TestSqliteMemoryJournal(RetentionContract):
    @pytest.fixture
    def make(self, clock: Clock) -> Factory:
        return lambda retention: SqlJournal("sqlite://", retention=retention, clock=clock)


@pytest.mark.skipif(POSTGRES_URL is None, reason="TIMESLICE_TEST_POSTGRES_URL is not set")
class TestPostgresJournal(RetentionContract):
    persistent = True

    @pytest.fixture
    async def make(self, clock: Clock) -> Factory:
        assert POSTGRES_URL is not None
        url = POSTGRES_URL
        engine = create_async_engine(SqlJournal(url).url)
        try:
            async with engine.begin() as conn:
                for table in ("events", "snapshots", "journal_meta"):
                    await conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
        finally:
            await engine.dispose()
        return lambda retention: SqlJournal(url, retention=retention, clock=clock)


# --- the orchestrator -----------------------------------------------------------------


@pytest.mark.parametrize("retention", [-1.0, math.inf, math.nan])
def test_a_retention_must_be_a_number_of_seconds(retention: float) -> None:
    with pytest.raises(InvalidArgumentError, match="journal_retention"):
        OrchestratorConfig(journal_retention=retention)


def counts(path: Path) -> tuple[int, int]:
    with closing(sqlite3.connect(path)) as conn:
        events = conn.execute("SELECT count(*) FROM events").fetchone()[0]
        snapshots = conn.execute("SELECT count(*) FROM snapshots").fetchone()[0]
    return events, snapshots


async def test_an_orchestrators_journal_stays_small_and_restarts_and_replays(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.db"
    options = {"db": str(path), "journal_retention": 0.0, "snapshot_every": 10}
    async with Orchestrator(**options) as orch:  # type: ignore[arg-type]
        for _ in range(60):
            await orch.acquire("g", "a")
            await orch.yield_("g", "a")
        await orch.acquire("g", "b")
        token = orch.table.groups["g"].holder.token  # type: ignore[union-attr]
    events, snapshots = counts(path)
    assert snapshots == 1 and events < 20  # of some 120 journaled
    async with Orchestrator(**options) as again:  # type: ignore[arg-type]
        holder = again.table.groups["g"].holder
        assert holder is not None and (holder.job, holder.token) == ("b", token)
    record = await read_journal(str(path))
    assert record.rows[0][0] > 1 and record.snapshot is not None
    timeline = record.timeline()
    assert any("compacted" in note for note in timeline.notes)
    assert "b" in timeline.jobs
