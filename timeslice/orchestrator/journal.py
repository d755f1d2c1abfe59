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
connection of its own), and a second writer is refused with the first one's pid
and host. Every journal records its schema version: one written by a newer
timeslice, a file that is not SQLite and another application's database are
refused, never changed.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import fcntl
import json
import math
import os
import re
import socket
import sqlite3
import time
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

from timeslice.errors import (
    InvalidArgumentError,
    JournalClaimLostError,
    JournalError,
    JournalInUseError,
)
from timeslice.orchestrator.events import Event, event_from_dict, event_to_dict

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


def meta_table(metadata: sa.MetaData, name: str) -> sa.Table:
    """A key-value table of facts about a database (its `schema_version`)."""
    return sa.Table(
        name,
        metadata,
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
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
    """An append-only event log with snapshots."""

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

    async def append(self, events: Sequence[Event]) -> int:
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
    DB-API connection held for appends, `BEGIN IMMEDIATE`, one `executemany`,
    `COMMIT` (about 0.2 ms with the fsync, against 0.5 ms through Core's
    statement machinery).

    `read_only` opens it to read what another process writes (no claim, nothing
    created or upgraded). `on_claim_lost` is called (on the event loop) if the
    claim of a PostgreSQL journal goes with its connection: appends fail from then on.
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
        self._claim: _FileClaim | _PostgresClaim | None = None
        self._lost: JournalClaimLostError | None = None
        self._seq = 0
        # Sequence numbers are handed out here, not by the database: one append at a time.
        self._append_lock = asyncio.Lock()
        self._writer: Any = None  # SQLite: the DB-API connection appends go through

    async def open(self) -> None:
        if self._engine is not None:
            return
        self._lost = None
        try:
            if self._sqlite:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="timeslice-journal")
                if (path := self._path) is not None:
                    create = not self.read_only
                    await self._in_thread(lambda: prepare_sqlite_file(path, "journal", create))
                    if create:
                        self._claim = await self._in_thread(lambda: _FileClaim.take(path))
                memory = self._path is None
                self._engine = sa.create_engine(
                    self.url, poolclass=StaticPool if memory else None, connect_args={"timeout": 30}
                )
                configure_sqlite(self._engine)
            else:
                self._engine = create_async_engine(
                    self.url,
                    pool_pre_ping=True,
                    connect_args={"server_settings": {"application_name": _holder_name()}},
                )
                if not self.read_only:
                    self._claim = await _PostgresClaim.take(
                        self._engine, self.label, self._lose, self._claim_check_every
                    )
            label, read_only, shared = self.label, self.read_only, not self._sqlite
            self._seq = await self._run(lambda c: _open_journal(c, label, read_only, shared))
            if isinstance(self._engine, sa.Engine) and not self.read_only:
                self._writer = await self._in_thread(self._engine.raw_connection)
        except BaseException as exc:
            await self.close()
            if isinstance(exc, sa.exc.DBAPIError | sqlite3.Error | OSError):
                raise database_error("journal", self.label, exc) from exc
            raise

    async def close(self) -> None:
        engine, self._engine = self._engine, None
        writer, self._writer = self._writer, None
        claim, self._claim = self._claim, None
        if isinstance(claim, _PostgresClaim):
            await claim.release()
        if isinstance(engine, AsyncEngine):
            await engine.dispose()
        elif engine is not None:
            if writer is not None:
                await self._in_thread(writer.close)
            await self._in_thread(engine.dispose)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        if isinstance(claim, _FileClaim):
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
        assert self._executor is not None
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

    async def append(self, events: Sequence[Event]) -> int:
        if not events:
            return self._seq
        self._check_writable()
        async with self._append_lock:
            now = self._clock()
            first = self._seq + 1
            rows = [
                {
                    "seq": first + i,
                    "ts": now,
                    "kind": type(e).__name__,
                    "payload": json.dumps(event_to_dict(e)),
                }
                for i, e in enumerate(events)
            ]
            if self._writer is not None:
                try:
                    await self._in_thread(lambda: _append_sqlite(self._writer, rows))
                except sqlite3.Error as exc:
                    raise database_error("journal", self.label, exc) from exc
            else:
                await self._run(lambda conn: conn.execute(events_table.insert(), rows))
            self._seq = first + len(events) - 1
            return self._seq

    async def load(self) -> Loaded:
        return await self._run(_load)

    async def save_snapshot(self, seq: int, state: dict[str, Any]) -> None:
        self._check_writable()
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

        await self._run(write)

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


def rollback(dbapi_connection: Any) -> None:
    """Roll back what a failed statement left. SQLite has already rolled back after
    some errors (SQLITE_FULL among them): a ROLLBACK then fails with "no transaction
    is active", and would hide the error that says what happened."""
    if dbapi_connection.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            dbapi_connection.execute("ROLLBACK")


def _open_journal(conn: sa.Connection, label: str, read_only: bool, shared: bool) -> int:
    """Check (and create or upgrade) the schema; the last sequence number used."""
    open_schema(
        conn, _metadata, meta, SCHEMA_VERSION,
        what="journal", label=label, read_only=read_only, shared=shared,
    )  # fmt: skip
    # Compaction may have removed every event: numbering goes on after the snapshot.
    last_event = conn.execute(sa.select(sa.func.max(events_table.c.seq))).scalar() or 0
    last_snapshot = conn.execute(sa.select(sa.func.max(snapshots_table.c.seq))).scalar() or 0
    return max(last_event, last_snapshot)


def open_schema(
    conn: sa.Connection,
    metadata: sa.MetaData,
    meta: sa.Table,
    version: int,
    *,
    what: str,
    label: str,
    read_only: bool = False,
    shared: bool = False,
) -> None:
    """Make sure the database behind `conn` holds `metadata`'s tables at `version`:
    create them in an empty one, upgrade an older one (version 1 had every table
    but `meta`), refuse a newer one and another application's. `shared`: other
    applications' tables may be there too (a PostgreSQL database)."""
    names = set(sa.inspect(conn).get_table_names())
    ours = {table.name for table in metadata.sorted_tables} - {meta.name}
    found = 0
    if meta.name in names:
        rows = {r.key: r.value for r in conn.execute(sa.select(meta.c.key, meta.c.value))}
        text = rows.get("schema_version", "")
        if not text.isdigit():
            raise JournalError(f"{label} is not a timeslice {what}: its {meta.name} is not ours")
        found = int(text)
    elif names & ours:
        # Version 1, if every table is there with our columns.
        inspector = sa.inspect(conn)
        for table in (t for t in metadata.sorted_tables if t is not meta):
            have = inspector.get_columns(table.name) if table.name in names else []
            if not {column.name for column in table.columns} <= {c["name"] for c in have}:
                raise JournalError(
                    f"{label} is not a timeslice {what}: it has no {table.name} table of ours"
                )
        found = 1
    elif names and not shared:
        listed = ", ".join(sorted(names)[:5]) + (", ..." if len(names) > 5 else "")
        raise JournalError(
            f"{label} is not a timeslice {what}: it holds another application's tables ({listed})"
        )
    if found > version:
        raise JournalError(
            f"{what} {label}: schema {found} is newer than this timeslice ({version}):"
            " upgrade timeslice"
        )
    if read_only:
        if not found:
            raise JournalError(f"{label} is not a timeslice {what}: it is empty")
        return
    metadata.create_all(conn)  # only what is missing
    if found < version:
        conn.execute(meta.delete().where(meta.c.key == "schema_version"))
        conn.execute(meta.insert(), {"key": "schema_version", "value": str(version)})


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


# --- errors ---------------------------------------------------------------------------

_SQLITE_FULL = 13
_PG_DISK_FULL = "53100"


def database_error(what: str, label: str, exc: BaseException) -> JournalError:
    """The one-line error for a failure of the database behind `label`."""
    orig = getattr(exc, "orig", None) or exc  # SQLAlchemy's wrapper names the SQL too
    text = " ".join(str(orig).split()) or type(orig).__name__
    code = getattr(orig, "sqlite_errorcode", None)
    if code == _SQLITE_FULL or getattr(orig, "sqlstate", None) == _PG_DISK_FULL:
        return JournalError(f"{what} {label}: the disk is full ({text})")
    if isinstance(orig, sqlite3.DatabaseError) and "file is not a database" in text:
        return JournalError(f"{label} is not an SQLite database")
    return JournalError(f"{what} {label}: {text}")


# --- files: private, and checked before SQLite opens them -------------------------------

_SQLITE_HEADER = b"SQLite format 3\x00"


def sqlite_path(url: URL) -> str | None:
    """The absolute path of an SQLite URL's file; None for a database in memory."""
    database = url.database or ""
    if database in ("", ":memory:") or url.query.get("mode") == "memory":
        return None
    return os.path.abspath(database)


def prepare_sqlite_file(path: str, what: str, create: bool = True) -> None:
    """Refuse what cannot hold an SQLite database (a folder, a file of something
    else), and create a missing one (with the folders it needs) readable by its
    owner only: what the file records is no other user's to read. SQLite gives its
    -wal and -shm files the mode of the database."""
    file = Path(path)
    try:
        if file.is_dir():
            raise JournalError(f"{what} {path} is a folder, not a file")
        if file.exists():
            if not file.is_file():
                raise JournalError(f"{what} {path} is not a regular file")
            with file.open("rb") as f:
                header = f.read(len(_SQLITE_HEADER))
            if header and header != _SQLITE_HEADER:
                raise JournalError(f"{path} is not an SQLite database")
            return
        if not create:
            raise JournalError(f"no {what} at {path}")
        make_private_dirs(file.parent)
        os.close(create_private(path, os.O_WRONLY))
    except OSError as exc:
        raise JournalError(f"{what} {path}: {exc.strerror or exc}") from None


def create_private(path: str, flags: int) -> int:
    """Open `path`, creating it with mode 0600 if missing; the descriptor."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return os.open(path, flags)
    os.fchmod(fd, 0o600)  # exactly, whatever the umask took away
    return fd


def make_private_dirs(folder: Path) -> None:
    """Create the missing folders of `folder`, each 0700; folders that exist are the
    user's and keep their modes."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for made in reversed(missing):
        try:
            os.mkdir(made, 0o700)
        except FileExistsError:
            continue  # made by someone else meanwhile
        os.chmod(made, 0o700)


# --- one writer per journal -------------------------------------------------------------


def _holder_name() -> str:
    return f"timeslice:{os.getpid()}@{socket.gethostname()}"[:63]  # PostgreSQL's limit


def _in_use(label: str, holder: str) -> str:
    return f"journal {label} is in use by {holder}; stop that orchestrator or use another --db"


class _FileClaim:
    """The writer's claim on an SQLite journal: an exclusive `flock` on the file
    next to it (`journal.db.lock`), held while the journal is open. The kernel
    releases it when the process ends, however it ends. The file says who holds it."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    @classmethod
    def take(cls, path: str) -> _FileClaim:
        lock = f"{path}.lock"
        try:
            fd = create_private(lock, os.O_RDWR)
        except OSError as exc:
            raise JournalError(f"journal {path}: cannot open {lock}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0)
            os.close(fd)
            raise JournalInUseError(_in_use(path, _describe_file_holder(holder))) from None
        except BaseException:
            os.close(fd)
            raise
        since = datetime.now(UTC).isoformat(timespec="seconds")
        text = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since})
        os.ftruncate(fd, 0)
        os.pwrite(fd, text.encode() + b"\n", 0)
        return cls(fd)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            # The file stays: removing it would let a process that opened it before
            # the removal lock a file that nobody else sees.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)


def _describe_file_holder(text: bytes) -> str:
    try:
        holder = json.loads(text)
        return f"pid {holder['pid']} on host {holder['host']} since {holder['since']}"
    except (ValueError, KeyError, TypeError):
        return "another process (it is starting)"


# Session advisory lock keys: constants derived from names, the same in every release.
_CLAIM_KEYS = (
    zlib.crc32(b"timeslice") & 0x7FFFFFFF,
    zlib.crc32(b"timeslice.journal.writer") & 0x7FFFFFFF,
)
_ADVISORY = (
    "l.locktype = 'advisory' AND l.granted AND l.classid = :a AND l.objid = :b"
    " AND l.objsubid = 2 AND l.database = (SELECT oid FROM pg_database"
    " WHERE datname = current_database())"
)
_HOLDER = sa.text(
    "SELECT a.pid, a.application_name, a.backend_start FROM pg_locks l"
    f" JOIN pg_stat_activity a ON a.pid = l.pid WHERE {_ADVISORY}"
)
_STILL_HELD = sa.text(
    f"SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE {_ADVISORY} AND l.pid = pg_backend_pid())"
)


class _PostgresClaim:
    """The writer's claim on a PostgreSQL journal: a session advisory lock held by a
    connection of its own while the journal is open. The lock lives as long as that
    connection, so when it goes, another orchestrator may take the journal: `lost`
    is told, from the connection's end or from a check every `check_every` seconds
    that the lock is still held."""

    def __init__(
        self,
        conn: AsyncConnection,
        driver: Any,
        label: str,
        lost: Callable[[JournalClaimLostError], None],
        check_every: float,
    ) -> None:
        self._conn, self._driver, self._label, self._lost = conn, driver, label, lost
        self._every, self._over = check_every, False
        self._listener = self._terminated  # one bound method: removed as it was added
        driver.add_termination_listener(self._listener)
        self._task = asyncio.get_running_loop().create_task(self._watch())

    @classmethod
    async def take(
        cls,
        engine: AsyncEngine,
        label: str,
        lost: Callable[[JournalClaimLostError], None],
        check_every: float,
    ) -> _PostgresClaim:
        conn = await engine.connect()
        keys = dict(zip("ab", _CLAIM_KEYS, strict=True))
        try:
            # No transaction: one held open for the journal's life would stop vacuum.
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            taken = sa.text("SELECT pg_try_advisory_lock(:a, :b)")
            if not (await conn.execute(taken, keys)).scalar():
                holder = (await conn.execute(_HOLDER, keys)).first()
                raise JournalInUseError(_in_use(label, _describe_pg_holder(holder)))
            raw = await conn.get_raw_connection()
            return cls(conn, raw.driver_connection, label, lost, check_every)
        except BaseException:
            await conn.close()
            raise

    def _lose(self, why: str) -> None:
        if not self._over:
            self._over = True
            self._lost(
                JournalClaimLostError(
                    f"journal {self._label}: the writer's claim is lost ({why});"
                    " another orchestrator may write it now"
                )
            )

    def _terminated(self, _connection: Any) -> None:
        self._lose("its connection closed")

    async def _watch(self) -> None:
        keys = dict(zip("ab", _CLAIM_KEYS, strict=True))
        while not self._over:
            await asyncio.sleep(self._every)
            try:
                result = await asyncio.wait_for(self._conn.execute(_STILL_HELD, keys), self._every)
                held = bool(result.scalar())
            except Exception as exc:  # a dead or unresponsive connection
                self._lose(
                    f"its connection failed: {' '.join(str(exc).split()) or type(exc).__name__}"
                )
                return
            if not held:
                self._lose("its lock is no longer held")

    async def release(self) -> None:
        self._over = True
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._driver.remove_termination_listener(self._listener)
        keys = dict(zip("ab", _CLAIM_KEYS, strict=True))
        with contextlib.suppress(Exception):  # a connection gone took the lock with it
            await self._conn.execute(sa.text("SELECT pg_advisory_unlock(:a, :b)"), keys)
        with contextlib.suppress(Exception):
            await self._conn.close()


def _describe_pg_holder(row: Any) -> str:
    if row is None:
        return "another session (it is ending)"
    since = f" since {row.backend_start.isoformat(timespec='seconds')}" if row.backend_start else ""
    if match := re.fullmatch(r"timeslice:(\d+)@(.*)", row.application_name or ""):
        return f"pid {match[1]} on host {match[2]}{since}"
    return f"PostgreSQL session {row.pid} ({row.application_name or 'no application name'}){since}"


# --- choosing a journal ---------------------------------------------------------------


def open_journal(
    url: str | None,
    *,
    retention: float = DEFAULT_RETENTION,
    read_only: bool = False,
    on_claim_lost: Callable[[JournalClaimLostError], None] | None = None,
) -> Journal:
    """The journal for `url`: None or "memory" keeps it in the process; "sqlite:///PATH"
    (or a bare file path) is SQLite; "postgresql://..." is PostgreSQL."""
    if url is None or url == "memory":
        return MemoryJournal(retention=retention)
    return SqlJournal(url, retention=retention, read_only=read_only, on_claim_lost=on_claim_lost)


def normalize_url(url: str) -> str:
    """The SQLAlchemy URL of `url`. A bare path is an SQLite file: "/var/lib/x.db"
    becomes "sqlite:////var/lib/x.db" (absolute), "x.db" "sqlite:///x.db" (relative
    to the working folder), as SQLAlchemy reads them."""
    if "://" not in url:  # a bare path
        return f"sqlite:///{url}"
    scheme, rest = url.split("://", 1)
    drivers = {
        "sqlite": "sqlite",
        "postgresql": "postgresql+asyncpg",
        "postgres": "postgresql+asyncpg",
    }
    if scheme in drivers:
        return f"{drivers[scheme]}://{rest}"
    if scheme in drivers.values():
        return url
    raise InvalidArgumentError(
        f"unsupported journal URL {url!r}: use sqlite:///PATH or postgresql://..."
    )


def configure_sqlite(engine: sa.Engine, synchronous: str = "FULL") -> None:
    """WAL with `synchronous` (FULL: a commit survives a power loss), and
    transactions that take the write lock when they begin (`BEGIN IMMEDIATE`),
    since the driver's own transaction handling would not."""

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")
