"""Where the agent keeps its job table: one JSON document, saved whole after every
change (a node has a handful of jobs), in SQLite or in memory. A restart loads it
back, so that no saved job is forgotten.

SQLite runs in WAL mode with synchronous=NORMAL: a commit is in the operating
system's hands when `save` returns, so a crash or a kill of the agent loses
nothing, and no commit waits for the disk. Only a power loss could take the last
commits back, and a power loss also ends every process whose context the table
describes: the table that matters after a reboot is an empty one.

Such a commit is an append to the WAL file (tens of microseconds), so `save`
writes on the event loop's own thread, on one connection kept for it: handing it
to a worker thread and back cost more than the write, three times in every
switch. That connection has no busy timeout: a save that finds the file held by
another writer (an `sqlite3` shell in a transaction, say) raises `JournalBusy` at
once, nothing written, rather than hold up the loop, and the engine tries again
(`storage.while_busy`). The document comes as text (`JobTable.encode`, which
encodes each finished operation once). Opening, loading and closing, which may
wait for the disk, run in the worker thread.

The file is the orchestrator journal's kind: created readable by its owner only,
with a schema version; a file that is not SQLite, another application's
database and a newer schema are refused, never changed.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import sqlalchemy as sa

from timeslice.errors import InvalidArgumentError
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
    write_error,
)

#: The schema this code writes. 1: agent_state; 2: and agent_meta.
SCHEMA_VERSION = 2

_metadata = sa.MetaData()
_documents = sa.Table(
    "agent_state",
    _metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("saved_at", sa.Float, nullable=False),
    sa.Column("doc", sa.Text, nullable=False),
)
_meta = meta_table(_metadata, "agent_meta")
_KEY = "job_table"
# The page size of a new file: the document of a node's few jobs with their last
# operations (4.4 KiB for two jobs) on one page. On 4 KiB pages it spilled onto an
# overflow page that every save of a document of another length freed and took
# again: four pages written to the WAL a save instead of one, and 50 against 30 us
# a commit in an agent under a switch's load.
PAGE_SIZE = 8192
# An upsert, not INSERT OR REPLACE, which deletes the row and inserts it again:
# 16 against 28 us a save of the same document, timed alone.
_SAVE = (
    "INSERT INTO agent_state (key, saved_at, doc) VALUES (?, ?, ?)"
    " ON CONFLICT (key) DO UPDATE SET saved_at = excluded.saved_at, doc = excluded.doc"
)
_WHAT = "job table"


class StateStore:
    """The agent's saved job table. `url` None keeps it in memory."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self.label = url or "memory"  # the file, once open
        self._memory: str | None = None
        self._engine: sa.Engine | None = None
        self._writer: sa.Connection | None = None  # the saves' connection
        self._raw: Any = None  # its DB-API connection
        self._executor: ThreadPoolExecutor | None = None

    async def open(self) -> None:
        if self.url is None or self._engine is not None:
            return
        url = sa.engine.make_url(normalize_url(self.url))
        if url.get_backend_name() != "sqlite":
            raise InvalidArgumentError("the agent keeps its state in SQLite (a file on its node)")
        path = sqlite_path(url)
        self.label = path or self.url
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="timeslice-agent-store")
        self._engine = engine = sa.create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT})
        configure_sqlite(engine, synchronous="NORMAL", page_size=PAGE_SIZE)
        label = self.label

        def prepare() -> sa.Connection:
            if path is not None:
                prepare_sqlite_file(path, _WHAT)
            with engine.begin() as conn:
                open_schema(conn, _metadata, _meta, SCHEMA_VERSION, what=_WHAT, label=label)
            writer = engine.connect()
            raw = writer.connection.dbapi_connection
            assert raw is not None
            raw.execute("PRAGMA busy_timeout=0")  # a save finds the file locked at once
            return writer

        try:
            self._writer = await self._in_thread(prepare)
            self._raw = self._writer.connection.dbapi_connection
        except BaseException as exc:
            await self.close()
            if isinstance(exc, sa.exc.DBAPIError | sqlite3.Error):
                raise database_error(_WHAT, label, exc) from exc
            raise

    async def close(self) -> None:
        writer, self._writer, self._raw = self._writer, None, None
        engine, self._engine = self._engine, None
        if writer is not None:
            await self._in_thread(writer.close)
        if engine is not None:
            await self._in_thread(engine.dispose)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    async def _in_thread(self, fn: Any) -> Any:
        assert self._executor is not None
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def load(self) -> dict[str, Any] | None:
        """The saved document, or None."""
        if self._engine is None:
            return json.loads(self._memory) if self._memory else None
        engine = self._engine

        def read() -> str | None:
            with engine.connect() as conn:
                query = sa.select(_documents.c.doc).where(_documents.c.key == _KEY)
                return conn.execute(query).scalar()

        doc = await self._in_thread(read)
        return json.loads(doc) if doc else None

    def save(self, document: dict[str, Any] | str) -> None:
        """Replace the saved document (or its JSON text), durably. Synchronous: on
        the event loop's thread (see the module's docstring); raises `JournalBusy`,
        nothing saved, while another writer holds the file."""
        text = (
            document if isinstance(document, str) else json.dumps(document, separators=(",", ":"))
        )
        if self._engine is None:
            self._memory = text
            return
        # The statements go on the kept connection's DB-API connection: a pool
        # checkout and SQLAlchemy's per-statement work would cost more than the write.
        raw = self._raw
        assert raw is not None
        try:
            raw.execute("BEGIN IMMEDIATE")
            try:
                raw.execute(_SAVE, (_KEY, time.time(), text))
                raw.execute("COMMIT")
            except BaseException:
                rollback(raw)
                raise
        except sqlite3.Error as exc:
            raise write_error(_WHAT, self.label, exc) from exc
