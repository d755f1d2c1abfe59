"""One contract, passed by every journal: in memory, SQLite on a file, SQLite in
memory, and PostgreSQL when TIMESLICE_TEST_POSTGRES_URL names a database whose
`events` and `snapshots` tables these tests may drop."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import ClassVar

import pytest

from timeslice.errors import InvalidArgumentError
from timeslice.kinds import Liveness
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.journal import (
    Journal,
    MemoryJournal,
    SqlJournal,
    events_table,
    open_journal,
    snapshots_table,
)
from timeslice.orchestrator.state import LockTable

POSTGRES_URL = os.environ.get("TIMESLICE_TEST_POSTGRES_URL")

EVENTS: list[ev.Event] = [
    ev.SetHoldLimit(now=0.5, group="", max_hold=60.0),
    ev.SetPolicy(now=0.5, group="g", policy=ev.Policy.PRIORITY, aging=2.0),
    ev.RequestYield(now=0.5, group="g", token=1),
    ev.Acquire(
        now=1.0,
        group="g",
        job="a",
        call_id="0.1",
        request_id="ra",
        lease_ttl=30.0,
        wait_deadline=None,
    ),
    ev.Acquire(
        now=1.25,
        group="g",
        job="b",
        call_id="0.2",
        request_id="",
        lease_ttl=None,
        wait_deadline=99.125,
    ),
    ev.KeepAlive(now=2.0, group="g", job="a", lease_id="lease-1"),
    ev.DropWaiter(now=3.0, group="g", job="b", call_id="0.2", reason=ev.Reason.CANCELLED),
    ev.Yield(now=4.0, group="g", job="a", request_id="ya", token=1),
    ev.Revoke(now=5.0, group="g", token=1, reason=ev.Reason.NOT_DELIVERED, call_id="0.1"),
    ev.ForceRelease(now=6.0, group="g", job="a", reason='ends with a quote " and a newline\n'),
    ev.Recover(now=7.0, grace=15.0),
    ev.Acquire(now=8.0, group="gröup ✓", job="jöb 🚀", call_id="1.1"),
    ev.SetGroupNodes(now=8.5, group="g", nodes=("n1", "n2")),
    ev.RegisterAgent(now=8.6, node="n1", address="127.0.0.1:9001"),
    ev.WorkloadSeen(now=8.65, group="g", job="a", seen=(Liveness.GONE, Liveness.UNKNOWN)),
    ev.SetJobBackend(now=8.7, group="g", job="a", node="", backend={"named": {"name": "noop"}}),
    ev.SwitchDone(
        now=8.8,
        group="g",
        token=2,
        restored=True,
        faults=(("b", "snapshot op-3 failed: boom"),),
        error="",
        moved_bytes=4096,
    ),
    ev.ResetJob(now=8.9, group="g", job="b"),
]

Factory = Callable[[], Journal]


class JournalContract:
    """What every journal must do. A subclass provides `make`: a fresh, unopened
    journal; for a persistent one, each call opens the same storage."""

    persistent: ClassVar[bool] = False

    @pytest.fixture
    def make(self) -> Factory:
        raise NotImplementedError

    @pytest.fixture
    async def journal(self, make: Factory) -> AsyncIterator[Journal]:
        journal = make()
        await journal.open()
        yield journal
        await journal.close()

    async def test_a_new_journal_is_empty(self, journal: Journal) -> None:
        loaded = await journal.load()
        assert (loaded.snapshot_seq, loaded.snapshot, loaded.tail) == (0, None, [])
        assert loaded.last_seq == 0
        assert await journal.read() == []

    async def test_append_returns_increasing_sequence_numbers(self, journal: Journal) -> None:
        assert await journal.append(EVENTS[:1]) == 1
        assert await journal.append(EVENTS[1:4]) == 4
        assert await journal.append([]) == 4
        assert await journal.append(EVENTS[4:5]) == 5
        assert [seq for seq, _, _ in await journal.read()] == [1, 2, 3, 4, 5]

    async def test_concurrent_appends_get_distinct_sequence_numbers(self, journal: Journal) -> None:
        seqs = await asyncio.gather(*(journal.append([e]) for e in EVENTS))
        assert sorted(seqs) == list(range(1, len(EVENTS) + 1))
        rows = await journal.read()
        assert sorted(map(repr, (e for _, _, e in rows))) == sorted(map(repr, EVENTS))

    async def test_a_failed_append_writes_nothing(self, journal: Journal) -> None:
        await journal.append(EVENTS[:2])
        unwritable = ev.Recover(now=9.0, grace=object())  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await journal.append([EVENTS[2], unwritable])
        assert [e for _, _, e in await journal.read()] == EVENTS[:2]
        assert await journal.append(EVENTS[2:3]) == 3

    async def test_every_event_type_round_trips_exactly(self, journal: Journal) -> None:
        assert {type(e).__name__ for e in EVENTS} == set(ev.EVENT_TYPES)
        await journal.append(EVENTS)
        assert [e for _, _, e in await journal.read()] == EVENTS
        assert [e for _, e in (await journal.load()).tail] == EVENTS

    async def test_load_without_a_snapshot_returns_every_event(self, journal: Journal) -> None:
        await journal.append(EVENTS[:3])
        loaded = await journal.load()
        assert loaded.snapshot is None and loaded.snapshot_seq == 0
        assert loaded.tail == list(zip([1, 2, 3], EVENTS[:3], strict=True))
        assert loaded.last_seq == 3

    async def test_load_returns_the_newest_snapshot_and_only_later_events(
        self, journal: Journal
    ) -> None:
        await journal.append(EVENTS[:5])
        await journal.save_snapshot(2, {"which": "older"})
        await journal.save_snapshot(4, {"which": "newer", "nested": [1, 2.5, None]})
        loaded = await journal.load()
        assert loaded.snapshot_seq == 4
        assert loaded.snapshot == {"which": "newer", "nested": [1, 2.5, None]}
        assert loaded.tail == [(5, EVENTS[4])]
        assert loaded.last_seq == 5

    async def test_a_snapshot_of_the_last_event_leaves_no_tail(self, journal: Journal) -> None:
        seq = await journal.append(EVENTS[:3])
        await journal.save_snapshot(seq, {"n": 3})
        loaded = await journal.load()
        assert (loaded.snapshot_seq, loaded.tail, loaded.last_seq) == (3, [], 3)
        assert await journal.append(EVENTS[3:4]) == 4
        assert (await journal.load()).tail == [(4, EVENTS[3])]

    async def test_a_lock_table_survives_a_snapshot(self, journal: Journal) -> None:
        table = LockTable()
        for event in EVENTS[:3]:
            table.handle(event)
        seq = await journal.append(EVENTS[:3])
        await journal.save_snapshot(seq, table.to_dict())
        loaded = await journal.load()
        assert loaded.snapshot is not None
        restored = LockTable.from_dict(loaded.snapshot)
        restored.validate()
        assert restored.to_dict() == table.to_dict()

    async def test_read_after_and_limit(self, journal: Journal) -> None:
        started = time.time()
        await journal.append(EVENTS[:3])
        await journal.append(EVENTS[3:6])
        await journal.save_snapshot(4, {})  # read sees the whole log regardless
        rows = await journal.read()
        assert [(seq, e) for seq, _, e in rows] == list(enumerate(EVENTS[:6], start=1))
        times = [ts for _, ts, _ in rows]
        assert times == sorted(times)
        assert started - 1 <= times[0] and times[-1] <= time.time() + 1
        assert [s for s, _, _ in await journal.read(after=4)] == [5, 6]
        assert [s for s, _, _ in await journal.read(limit=2)] == [1, 2]
        assert [s for s, _, _ in await journal.read(after=2, limit=2)] == [3, 4]
        assert [s for s, _, _ in await journal.read(after=5, limit=10)] == [6]
        assert await journal.read(after=6) == []
        assert await journal.read(limit=0) == []

    async def test_open_and_close_are_idempotent(self, make: Factory) -> None:
        journal = make()
        await journal.open()
        await journal.open()
        assert await journal.append(EVENTS[:2]) == 2
        assert [e for _, _, e in await journal.read()] == EVENTS[:2]
        await journal.close()
        await journal.close()

    async def test_events_and_snapshots_survive_close_and_reopen(self, make: Factory) -> None:
        if not self.persistent:
            pytest.skip("this journal keeps nothing once closed")
        first = make()
        await first.open()
        await first.append(EVENTS[:4])
        await first.save_snapshot(2, {"at": 2})
        await first.close()

        second = make()
        await second.open()
        try:
            loaded = await second.load()
            assert loaded.snapshot == {"at": 2}
            assert loaded.tail == [(3, EVENTS[2]), (4, EVENTS[3])]
            # numbering carries on where the log stopped
            assert await second.append(EVENTS[4:5]) == 5
            assert [e for _, _, e in await second.read()] == EVENTS[:5]
        finally:
            await second.close()


class TestMemoryJournal(JournalContract):
    @pytest.fixture
    def make(self) -> Factory:
        return MemoryJournal


class TestSqliteFileJournal(JournalContract):
    persistent = True

    @pytest.fixture
    def make(self, tmp_path: Path) -> Factory:
        url = f"sqlite:///{tmp_path / 'journal.db'}"
        return lambda: SqlJournal(url)

    async def test_a_bare_path_is_a_sqlite_file(self, tmp_path: Path) -> None:
        path = tmp_path / "bare.db"
        journal = open_journal(str(path))
        assert isinstance(journal, SqlJournal)
        await journal.open()
        try:
            await journal.append(EVENTS[:1])
        finally:
            await journal.close()
        assert path.exists()


class TestSqliteMemoryJournal(JournalContract):
    @pytest.fixture
    def make(self) -> Factory:
        return lambda: SqlJournal("sqlite://")


@pytest.mark.skipif(POSTGRES_URL is None, reason="TIMESLICE_TEST_POSTGRES_URL is not set")
class TestPostgresJournal(JournalContract):
    persistent = True

    @pytest.fixture
    async def make(self) -> AsyncIterator[Factory]:
        from sqlalchemy.ext.asyncio import create_async_engine

        assert POSTGRES_URL is not None
        url = SqlJournal(POSTGRES_URL).url
        engine = create_async_engine(url)
        try:
            async with engine.begin() as conn:
                for table in (events_table, snapshots_table):
                    await conn.run_sync(table.drop, checkfirst=True)
        finally:
            await engine.dispose()
        yield lambda: SqlJournal(POSTGRES_URL)


# --- choosing a journal --------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "mysql://user@host/db",
        "sqlite+aiosqlite:///x.db",
        "http://example.com/journal",
        "://nothing",
    ],
)
def test_a_bad_url_is_refused(url: str) -> None:
    with pytest.raises(InvalidArgumentError, match="unsupported journal URL"):
        SqlJournal(url)
    with pytest.raises(InvalidArgumentError):
        open_journal(url)


@pytest.mark.parametrize("url", [None, "memory"])
def test_memory_urls_keep_the_journal_in_the_process(url: str | None) -> None:
    assert isinstance(open_journal(url), MemoryJournal)


@pytest.mark.parametrize(
    ("url", "driver"),
    [
        ("sqlite:///tmp/j.db", "sqlite"),
        ("sqlite://", "sqlite"),
        ("/var/lib/timeslice/journal.db", "sqlite"),
        ("postgresql://u@h/db", "postgresql+asyncpg"),
        ("postgres://u@h/db", "postgresql+asyncpg"),
        ("postgresql+asyncpg://u@h/db", "postgresql+asyncpg"),
    ],
)
def test_urls_choose_the_driver(url: str, driver: str) -> None:
    journal = open_journal(url)
    assert isinstance(journal, SqlJournal)
    assert journal.url.drivername == driver


async def test_a_closed_sql_journal_refuses_work() -> None:
    journal = SqlJournal("sqlite://")
    with pytest.raises(RuntimeError, match="not open"):
        await journal.load()
