"""The orchestrator's journal: an append-only log of lock-table events.

Two implementations behind one interface: `MemoryJournal` (tests, nothing
persists) and `SqlJournal` (SQLAlchemy Core: SQLite by default, PostgreSQL
through asyncpg). Events are appended in batches, each batch one transaction
that is durable when `append` returns. A snapshot of the whole table is written
every so often, so that a start folds only the events after the newest snapshot.

Events are never updated. The only delete is compaction behind a snapshot, in
the snapshot's own transaction: an event stays `retention` seconds after a
snapshot covers it (the replay and the metrics read them), then goes, with the
snapshots no longer needed. A journal's size is so bounded by its traffic over
the retention, not by its age.

One orchestrator writes a journal at a time: opening one claims it (an OS lock on
a file next to an SQLite journal; on PostgreSQL an advisory lock, held by a
connection of its own: `journal_claim`), and a second writer is refused with
the first one's pid and host. On PostgreSQL with a leader lease (`leader_lease`)
a second writer waits as a standby instead, and takes over once the active's
lease expires; every append is then fenced by the writer's epoch
(`journal_lease`). Every journal records its schema version: one written by a newer
timeslice, a file that is not SQLite and another application's database are
refused, never changed.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import math
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

from timeslice.errors import JournalClaimLostError
from timeslice.orchestrator.events import Event, event_from_dict, event_to_dict
from timeslice.orchestrator.journal_claim import (
    CLOSE_TIMEOUT,
    FileClaim,
    PostgresClaim,
    candidate_name,
    holder_name,
    within,
)
from timeslice.orchestrator.journal_lease import LeaderLease, fence
from timeslice.orchestrator.leadership import LeaseRow, Role
from timeslice.storage import (
    SQLITE_BUSY_TIMEOUT,
    configure_sqlite,
    database_error,
    meta_table,
    normalize_url,
    open_schema,
    prepare_sqlite_file,
    rollback,
    sqlite_path,
    while_busy,
    write_error,
)

_T = TypeVar("_T")

#: The schema this code writes. 1: events and snapshots; 2: and journal_meta.
SCHEMA_VERSION = 2
#: How long events stay once a snapshot covers them, by default: a day of history.
DEFAULT_RETENTION = 24 * 3600.0

_metadata = sa.MetaData()

events_table = sa.Table(
    "events",
    _metadata,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("ts", sa.Float, nullable=False),
    sa.Column("kind", sa.String(64), nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
)

snapshots_table = sa.Table(
    "snapshots",
    _metadata,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("ts", sa.Float, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
)


meta = meta_table(_metadata, "journal_meta")


@dataclass(frozen=True)
class Loaded:
    """What a start needs: the newest snapshot (if any) and the events after it."""

    snapshot_seq: int
    snapshot: dict[str, Any] | None
    tail: list[tuple[int, Event]]

    @property
    def last_seq(self) -> int:
        return self.tail[-1][0] if self.tail else self.snapshot_seq


class Journal(abc.ABC):
    """An append-only event log with snapshots.

    A journal whose writes are quick and local (`inline`: SQLite, memory) also
    writes on the caller's thread with `append_now` and `save_snapshot_now`,
    blocking it for the write: the journal engine then writes each loop turn's
    decisions without leaving the event loop.
    """

    @property
    def inline(self) -> bool:
        """Whether `append_now` and `save_snapshot_now` may be called."""
        return False

    def append_now(self, events: Sequence[Event]) -> int:
        """`append`, on the caller's thread: only where `inline`."""
        raise NotImplementedError(f"{type(self).__name__} does not write inline")

    def save_snapshot_now(self, seq: int, state: dict[str, Any]) -> None:
        """`save_snapshot`, on the caller's thread: only where `inline`."""
        raise NotImplementedError(f"{type(self).__name__} does not write inline")

    @abc.abstractmethod
    async def open(self) -> None:
        """Create what is missing and claim the journal for writing; idempotent."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections and the claim; idempotent."""

    @abc.abstractmethod
    async def append(self, events: Sequence[Event]) -> int:
        """Write `events` in one transaction, durably; return the last sequence number."""

    @abc.abstractmethod
    async def load(self) -> Loaded:
        """The newest snapshot and every event after it."""

    @abc.abstractmethod
    async def save_snapshot(self, seq: int, state: dict[str, Any]) -> None:
        """Record the table as it stood after event `seq`, and compact behind it."""

    @abc.abstractmethod
    async def snapshot_before(self, seq: int) -> tuple[int, dict[str, Any]] | None:
        """The newest snapshot kept of the table at or before event `seq`."""

    @abc.abstractmethod
    async def read(
        self, after: int = 0, limit: int | None = None
    ) -> list[tuple[int, float, Event]]:
        """Events with a sequence number above `after`, oldest first, with their times."""


def compaction(
    snapshots: Sequence[tuple[int, float]], now: float, retention: float
) -> tuple[int, list[int]]:
    """What a snapshot write deletes, given every (seq, time) snapshot kept with the
    new one: (the events up to this sequence number, these snapshots).

    The base is the newest snapshot at least `retention` old: every event it covers
    has been kept long enough. It stays, so that the first event kept follows a
    snapshot (a replay of what is kept can start from it). Between it and the
    newest, one snapshot per eighth of the retention is kept: the base moves on in
    such steps, and a long retention keeps a few snapshots, not one per
    `snapshot_every` events.
    """
    ordered = sorted(snapshots)
    if not ordered:
        return 0, []
    cutoff = now - retention
    old = [i for i, (_, ts) in enumerate(ordered) if ts <= cutoff]
    start = old[-1] if old else 0
    keep, last = {ordered[-1][0]}, -math.inf
    for seq, ts in ordered[start:]:
        if ts > last + retention / 8:
            keep.add(seq)
            last = ts
    events_upto = ordered[old[-1]][0] if old else 0
    return events_upto, [seq for seq, _ in ordered if seq not in keep]


class MemoryJournal(Journal):
    """A journal that lives as long as the process: for tests and notebooks."""

    def __init__(
        self, *, retention: float = DEFAULT_RETENTION, clock: Callable[[], float] = time.time
    ) -> None:
        self.retention, self._clock = retention, clock
        self._events: list[tuple[int, float, str]] = []
        self._snapshots: list[tuple[int, float, str]] = []
        self._seq = 0

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    @property
    def inline(self) -> bool:
        return True

    async def append(self, events: Sequence[Event]) -> int:
        return self.append_now(events)

    def append_now(self, events: Sequence[Event]) -> int:
        now = self._clock()
        # all or nothing, as a transaction would be
        rows = [(self._seq + i, now, json.dumps(event_to_dict(e))) for i, e in enumerate(events, 1)]
        self._events.extend(rows)
        self._seq += len(rows)
        return self._seq

    async def load(self) -> Loaded:
        after, state = (
            (self._snapshots[-1][0], json.loads(self._snapshots[-1][2]))
            if self._snapshots
            else (0, None)
        )
        tail = [(s, event_from_dict(json.loads(p))) for s, _, p in self._events if s > after]
        return Loaded(after, state, tail)

    async def save_snapshot(self, seq: int, state: dict[str, Any]) -> None:
        self.save_snapshot_now(seq, state)

    def save_snapshot_now(self, seq: int, state: dict[str, Any]) -> None:
        self._snapshots = sorted([*self._snapshots, (seq, self._clock(), json.dumps(state))])
        upto, drop = compaction(
            [(s, t) for s, t, _ in self._snapshots], self._clock(), self.retention
        )
        self._snapshots = [row for row in self._snapshots if row[0] not in drop]
        self._events = [row for row in self._events if row[0] > upto]

    async def snapshot_before(self, seq: int) -> tuple[int, dict[str, Any]] | None:
        found = [(s, json.loads(text)) for s, _, text in self._snapshots if s <= seq]
        return found[-1] if found else None

    async def read(
        self, after: int = 0, limit: int | None = None
    ) -> list[tuple[int, float, Event]]:
        rows = [(s, t, event_from_dict(json.loads(p))) for s, t, p in self._events if s > after]
        return rows[:limit] if limit is not None else rows


class SqlJournal(Journal):
    """A journal in SQLite (the default: WAL, synchronous=FULL) or PostgreSQL.

    The SQL is written once against a synchronous SQLAlchemy `Connection`. For
    SQLite it runs on the pysqlite driver in one dedicated thread, one hop per
    call: a durable append then costs about a third of what it costs through the
    aiosqlite adapter, which crosses threads for every cursor operation. For
    PostgreSQL it runs on asyncpg through `AsyncConnection.run_sync`.

    Grants wait on `append`, so on SQLite it takes the shortest path: one
    connection held for writes, `BEGIN IMMEDIATE`, one `executemany`,
    `COMMIT` (about 0.2 ms with the fsync, against 0.5 ms through Core's
    statement machinery), on the caller's thread (`inline`): a write handed to
    another thread waits for the event loop twice, to start and to be seen done,
    and a busy loop makes each wait longer than the write.

    `read_only` opens it to read what another process writes (no claim, nothing
    created or upgraded). `on_claim_lost` is called (on the event loop) if the
    claim of a PostgreSQL journal goes with its connection: appends fail from then on.

    `leader_lease` (seconds; PostgreSQL only, ignored on SQLite): `open` waits as a
    standby while another orchestrator holds the journal's leader lease (telling
    `on_standby` the row, once), takes the lease over when it expires, renews it,
    and fences every write by its epoch. A lost lease is a lost claim. `advertise`
    says, at takeover, the address written into the lease row (where clients reach
    this orchestrator; `leader_row` is how a standby reads the active's).
    """

    def __init__(
        self,
        url: str,
        *,
        retention: float = DEFAULT_RETENTION,
        read_only: bool = False,
        on_claim_lost: Callable[[JournalClaimLostError], None] | None = None,
        clock: Callable[[], float] = time.time,
        claim_check_every: float = 5.0,
        leader_lease: float | None = None,
        on_standby: Callable[[LeaseRow | None], None] | None = None,
        advertise: Callable[[], str] | None = None,
    ) -> None:
        self.url = make_url(normalize_url(url))
        self._sqlite = self.url.get_backend_name() == "sqlite"
        self._path = sqlite_path(self.url) if self._sqlite else None  # None: in memory
        #: How the journal is named in messages: its file, or its URL without a password.
        self.label = self._path or self.url.render_as_string(hide_password=True)
        self.retention, self.read_only, self._clock = retention, read_only, clock
        self._on_claim_lost, self._claim_check_every = on_claim_lost, claim_check_every
        self._engine: sa.Engine | AsyncEngine | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._claim: FileClaim | PostgresClaim | None = None
        self._lost: JournalClaimLostError | None = None
        self._seq = 0
        # Sequence numbers are handed out here, not by the database: one append at a time.
        self._append_lock = asyncio.Lock()
        # SQLite: the connection every write goes through, on the caller's thread.
        self._writer: sa.Connection | None = None
        self._leader_lease, self._on_standby = leader_lease, on_standby
        self._advertise = advertise
        self._lease: LeaderLease | None = None
        self._me = ""  # this writer's name in its sessions (and in the lease, when it has one)

    async def open(self) -> None:
        if self._engine is not None:
            return
        self._lost = None
        try:
            if self._sqlite:
                if (path := self._path) is not None:
                    self._executor = ThreadPoolExecutor(1, thread_name_prefix="timeslice-journal")
                    create = not self.read_only
                    await self._in_thread(lambda: prepare_sqlite_file(path, "journal", create))
                    if create:
                        self._claim = await self._in_thread(lambda: FileClaim.take(path))
                memory = self._path is None
                self._engine = sa.create_engine(
                    self.url,
                    poolclass=StaticPool if memory else None,
                    connect_args={"timeout": SQLITE_BUSY_TIMEOUT},
                )
                configure_sqlite(self._engine)
            else:
                # Every session of a candidate carries its name in the lease, so that
                # a takeover can end every session of an expired holder.
                leased = not self.read_only and self._leader_lease is not None
                self._me = candidate_name() if leased else holder_name()
                self._engine = create_async_engine(
                    self.url,
                    pool_pre_ping=True,
                    connect_args={"server_settings": {"application_name": self._me}},
                )
                if not self.read_only and self._leader_lease is not None:
                    await self._lead(self._engine, self._leader_lease)
                elif not self.read_only:
                    self._claim = await PostgresClaim.take(
                        self._engine, self.label, self._lose, self._claim_check_every
                    )
            label, read_only, shared = self.label, self.read_only, not self._sqlite
            self._seq = await self._run(lambda c: _open_journal(c, label, read_only, shared))
            if isinstance(self._engine, sa.Engine) and not self.read_only:
                self._writer = await self._in_thread(self._engine.connect)
                # A write finds the database locked at once rather than wait on the loop.
                raw = self._writer.connection.dbapi_connection
                assert raw is not None
                raw.execute("PRAGMA busy_timeout=0")
        except BaseException as exc:
            await self.close()
            if isinstance(exc, sa.exc.DBAPIError | sqlite3.Error | OSError):
                raise database_error("journal", self.label, exc) from exc
            raise

    @property
    def inline(self) -> bool:
        """SQLite, open for writing: appends and snapshots go on the caller's thread."""
        return self._writer is not None

    @property
    def shared(self) -> bool:
        """Whether this journal may have a standby: PostgreSQL with a leader lease."""
        return not self._sqlite and not self.read_only and self._leader_lease is not None

    @property
    def epoch(self) -> int:
        """The leader lease's epoch this writer holds (0: no lease)."""
        return self._lease.epoch if self._lease is not None else 0

    @property
    def lease(self) -> LeaderLease | None:
        """This writer's hold on the leader lease (None: the journal has none)."""
        return self._lease

    async def _lead(self, engine: AsyncEngine, lease: float) -> None:
        """Wait as a standby until this candidate holds the leader lease, then take
        the advisory lock as well (from a deposed holder, if need be)."""
        self._lease = LeaderLease(
            engine, me=self._me, lease=lease, label=self.label, lost=self._lose
        )
        if self._advertise is not None:
            self._lease.address = self._advertise()
        told = False
        while (await self._lease.take_over()).role is Role.STANDBY:
            if not told and self._on_standby is not None:
                self._on_standby(self._lease.row)
            told = True
            await asyncio.sleep(self._lease.wait_hint())
        self._claim = await PostgresClaim.take(
            engine, self.label, self._lose, self._claim_check_every, evict=lease
        )
        self._lease.start_renewing()

    async def _fenced(self, fn: Callable[[sa.Connection], _T]) -> _T:
        """Run `fn` in one transaction that commits only while this writer's epoch
        holds the leader lease (when it has one)."""
        lease = self._lease
        if lease is None:
            return await self._run(fn)
        epoch, me, label = lease.epoch, lease.me, self.label

        def in_epoch(conn: sa.Connection) -> _T:
            fence(conn, epoch, me, label)
            return fn(conn)

        try:
            return await self._run(in_epoch)
        except JournalClaimLostError as exc:
            lease.step_down(exc.message)
            raise
        except Exception as exc:
            lease.step_down(f"a journal write failed: {exc}")
            raise

    async def close(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            await lease.release()
        engine, self._engine = self._engine, None
        writer, self._writer = self._writer, None
        claim, self._claim = self._claim, None
        if isinstance(claim, PostgresClaim):
            await claim.release()
        if isinstance(engine, AsyncEngine):
            with contextlib.suppress(TimeoutError):  # a database cut off: drop the pool
                await within(engine.dispose(), CLOSE_TIMEOUT)
        elif engine is not None:
            if writer is not None:
                await self._in_thread(writer.close)
            await self._in_thread(engine.dispose)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if isinstance(claim, FileClaim):
            claim.release()  # last: nothing of ours writes the file any more

    def _lose(self, error: JournalClaimLostError) -> None:
        if self._lost is None:
            self._lost = error
            if self._on_claim_lost is not None:
                self._on_claim_lost(error)

    def _check_writable(self) -> None:
        if self.read_only:
            raise RuntimeError(f"journal {self.label} is open for reading only")
        if self._lost is not None:
            raise JournalClaimLostError(self._lost.message)

    async def _in_thread(self, fn: Callable[[], _T]) -> _T:
        """`fn` in the journal's thread. An SQLite database in memory has none: it
        has no disk to wait for, and its one connection stays on the loop's thread."""
        if self._executor is None:
            return fn()
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def _run(self, fn: Callable[[sa.Connection], _T]) -> _T:
        """Run `fn` in one transaction."""
        engine = self._engine
        if engine is None:
            raise RuntimeError("journal is not open")
        try:
            if isinstance(engine, AsyncEngine):
                async with engine.begin() as conn:
                    return await conn.run_sync(fn)

            def in_transaction() -> _T:
                with engine.begin() as conn:
                    return fn(conn)

            return await self._in_thread(in_transaction)
        except (sa.exc.DBAPIError, sqlite3.Error) as exc:
            raise database_error("journal", self.label, exc) from exc

    def _rows(self, events: Sequence[Event]) -> list[dict[str, Any]]:
        """`events` as the rows that follow the last one written."""
        now, first = self._clock(), self._seq + 1
        return [
            {
                "seq": first + i,
                "ts": now,
                "kind": type(e).__name__,
                "payload": json.dumps(event_to_dict(e)),
            }
            for i, e in enumerate(events)
        ]

    async def append(self, events: Sequence[Event]) -> int:
        if not events:
            return self._seq
        if self.inline:
            return await while_busy(lambda: self.append_now(events))
        self._check_writable()
        async with self._append_lock:
            rows = self._rows(events)
            await self._fenced(lambda conn: conn.execute(events_table.insert(), rows))
            self._seq = rows[-1]["seq"]
            return self._seq

    def append_now(self, events: Sequence[Event]) -> int:
        self._check_writable()
        if self._writer is None:
            return super().append_now(events)
        if not events:
            return self._seq
        rows = self._rows(events)
        try:
            _append_sqlite(self._writer.connection.dbapi_connection, rows)
        except sqlite3.Error as exc:
            raise write_error("journal", self.label, exc) from exc
        self._seq = rows[-1]["seq"]
        return self._seq

    async def load(self) -> Loaded:
        return await self._run(_load)

    async def save_snapshot(self, seq: int, state: dict[str, Any]) -> None:
        if self.inline:
            return await while_busy(lambda: self.save_snapshot_now(seq, state))
        self._check_writable()
        await self._fenced(self._snapshot_write(seq, state))

    def save_snapshot_now(self, seq: int, state: dict[str, Any]) -> None:
        self._check_writable()
        if (writer := self._writer) is None:
            return super().save_snapshot_now(seq, state)
        write = self._snapshot_write(seq, state)
        try:
            with writer.begin():
                write(writer)
        except (sa.exc.DBAPIError, sqlite3.Error) as exc:
            raise write_error("journal", self.label, exc) from exc

    def _snapshot_write(self, seq: int, state: dict[str, Any]) -> Callable[[sa.Connection], None]:
        """The transaction that records a snapshot and compacts behind it."""
        now, retention = self._clock(), self.retention
        row = {"seq": seq, "ts": now, "state": json.dumps(state)}

        def write(conn: sa.Connection) -> None:
            conn.execute(snapshots_table.insert(), row)
            kept = conn.execute(sa.select(snapshots_table.c.seq, snapshots_table.c.ts))
            upto, drop = compaction([(r.seq, r.ts) for r in kept], now, retention)
            if drop:
                conn.execute(snapshots_table.delete().where(snapshots_table.c.seq.in_(drop)))
            if upto:
                conn.execute(events_table.delete().where(events_table.c.seq <= upto))

        return write

    async def snapshot_before(self, seq: int) -> tuple[int, dict[str, Any]] | None:
        query = (
            sa.select(snapshots_table.c.seq, snapshots_table.c.state)
            .where(snapshots_table.c.seq <= seq)
            .order_by(snapshots_table.c.seq.desc())
            .limit(1)
        )
        found = await self._run(lambda conn: conn.execute(query).first())
        return (found.seq, json.loads(found.state)) if found else None

    async def read(
        self, after: int = 0, limit: int | None = None
    ) -> list[tuple[int, float, Event]]:
        query = (
            sa.select(events_table.c.seq, events_table.c.ts, events_table.c.payload)
            .where(events_table.c.seq > after)
            .order_by(events_table.c.seq)
            .limit(limit)
        )

        def rows(conn: sa.Connection) -> list[tuple[int, float, Event]]:
            return [
                (r.seq, r.ts, event_from_dict(json.loads(r.payload))) for r in conn.execute(query)
            ]

        return await self._run(rows)


_INSERT_EVENT = "INSERT INTO events (seq, ts, kind, payload) VALUES (:seq, :ts, :kind, :payload)"


def _append_sqlite(dbapi_connection: Any, rows: list[dict[str, Any]]) -> None:
    """One durable transaction on a pysqlite connection in autocommit mode."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("BEGIN IMMEDIATE")
        try:
            cursor.executemany(_INSERT_EVENT, rows)
            cursor.execute("COMMIT")
        except BaseException:
            rollback(dbapi_connection)
            raise
    finally:
        cursor.close()


def _open_journal(conn: sa.Connection, label: str, read_only: bool, shared: bool) -> int:
    """Check (and create or upgrade) the schema; the last sequence number used."""
    open_schema(
        conn,
        _metadata,
        meta,
        SCHEMA_VERSION,
        what="journal",
        label=label,
        read_only=read_only,
        shared=shared,
    )
    # Compaction may have removed every event: numbering goes on after the snapshot.
    last_event = conn.execute(sa.select(sa.func.max(events_table.c.seq))).scalar() or 0
    last_snapshot = conn.execute(sa.select(sa.func.max(snapshots_table.c.seq))).scalar() or 0
    return max(last_event, last_snapshot)


def _load(conn: sa.Connection) -> Loaded:
    snap = conn.execute(
        sa.select(snapshots_table.c.seq, snapshots_table.c.state)
        .order_by(snapshots_table.c.seq.desc())
        .limit(1)
    ).first()
    after = snap.seq if snap else 0
    result = conn.execute(
        sa.select(events_table.c.seq, events_table.c.payload)
        .where(events_table.c.seq > after)
        .order_by(events_table.c.seq)
    )
    tail = [(row.seq, event_from_dict(json.loads(row.payload))) for row in result]
    return Loaded(after, json.loads(snap.state) if snap else None, tail)


# --- choosing a journal ---------------------------------------------------------------


def open_journal(
    url: str | None,
    *,
    retention: float = DEFAULT_RETENTION,
    read_only: bool = False,
    on_claim_lost: Callable[[JournalClaimLostError], None] | None = None,
    leader_lease: float | None = None,
    on_standby: Callable[[LeaseRow | None], None] | None = None,
    advertise: Callable[[], str] | None = None,
) -> Journal:
    """The journal for `url`: None or "memory" keeps it in the process; "sqlite:///PATH"
    (or a bare file path) is SQLite; "postgresql://..." is PostgreSQL."""
    if url is None or url == "memory":
        return MemoryJournal(retention=retention)
    return SqlJournal(
        url,
        retention=retention,
        read_only=read_only,
        on_claim_lost=on_claim_lost,
        leader_lease=leader_lease,
        on_standby=on_standby,
        advertise=advertise,
    )
