"""What the orchestrator's journal and the agent's job table share: their URLs,
SQLite's settings, schema versions, files readable by their owner only and
checked before SQLite opens them, and one-line errors for what a database says.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import URL

from timeslice.errors import InvalidArgumentError, JournalError

_T = TypeVar("_T")


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


#: How long an SQLite write waits for another writer to let go of the database (seconds;
#: what sqlite3.connect calls its timeout, and PRAGMA busy_timeout in ms).
SQLITE_BUSY_TIMEOUT = 30.0


def configure_sqlite(
    engine: sa.Engine, synchronous: str = "FULL", page_size: int | None = None
) -> None:
    """WAL with `synchronous` (FULL: a commit survives a power loss), and
    transactions that take the write lock when they begin (`BEGIN IMMEDIATE`),
    since the driver's own transaction handling would not. `page_size`: the page
    size of a database file created by this engine (one that exists keeps its own)."""

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        if page_size is not None:  # before WAL: an empty file in WAL mode has its size
            cursor.execute(f"PRAGMA page_size={int(page_size)}")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute(f"PRAGMA busy_timeout={round(SQLITE_BUSY_TIMEOUT * 1000)}")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def meta_table(metadata: sa.MetaData, name: str) -> sa.Table:
    """A key-value table of facts about a database (its `schema_version`)."""
    return sa.Table(
        name,
        metadata,
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )


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


def rollback(dbapi_connection: Any) -> None:
    """Roll back what a failed statement left. SQLite has already rolled back after
    some errors (SQLITE_FULL among them): a ROLLBACK then fails with "no transaction
    is active", and would hide the error that says what happened."""
    if dbapi_connection.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            dbapi_connection.execute("ROLLBACK")


# --- errors ---------------------------------------------------------------------------

_SQLITE_FULL = 13
_PG_DISK_FULL = "53100"


class JournalBusy(JournalError):
    """A write on the loop's thread found the database held by another writer (an
    `sqlite3` shell in a transaction, say): nothing was written, and the same write
    may be tried again."""


def write_error(what: str, label: str, exc: BaseException) -> JournalError:
    """What a failed write on a connection without a busy timeout raises:
    `JournalBusy` if another writer holds the database, else `database_error`."""
    orig = getattr(exc, "orig", None) or exc  # SQLAlchemy's wrapper, or the driver's own
    code = getattr(orig, "sqlite_errorcode", 0) or 0
    if code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return JournalBusy(f"{what} {label} is locked by another writer")
    return database_error(what, label, exc)


async def while_busy(write: Callable[[], _T]) -> _T:
    """`write()` (synchronous, on the loop's thread), again while it raises
    `JournalBusy`, for as long as SQLite's busy timeout would wait, without holding
    up the loop meanwhile; then the last `JournalBusy`."""
    deadline, delay = time.monotonic() + SQLITE_BUSY_TIMEOUT, 0.001
    while True:
        try:
            return write()
        except JournalBusy:
            if time.monotonic() + delay > deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.05)


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
