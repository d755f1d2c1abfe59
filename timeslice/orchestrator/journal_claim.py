"""One writer per journal: the claim an orchestrator holds on the journal it writes.

On SQLite an exclusive `flock` on a file beside the journal; on PostgreSQL a
session advisory lock held by a connection of its own. A second writer is
refused with the first one's pid, host and start time.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import re
import secrets
import socket
import time
import zlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from timeslice.errors import JournalClaimLostError, JournalError, JournalInUseError
from timeslice.storage import create_private


def holder_name() -> str:
    return f"timeslice:{os.getpid()}@{socket.gethostname()}"[:63]  # PostgreSQL's limit


def candidate_name() -> str:
    """This process's name in a leader lease: its pid and host, and a random part,
    as two orchestrators in one process are two candidates."""
    return f"{holder_name()[:54]}/{secrets.token_hex(4)}"


#: The longest a closing writer waits on the database (which may be cut off).
CLOSE_TIMEOUT = 1.0

_T = TypeVar("_T")


async def within(work: Awaitable[_T], seconds: float) -> _T:
    """`work`'s result if it comes within `seconds`; else TimeoutError at once.

    Unlike `asyncio.wait_for`, this does not wait for the cancelled work to end: a
    statement on a connection to a database cut off (the connection open, nothing
    answering) may take as long to cancel as it would have taken to answer. It is
    cancelled and left to end whenever it does."""
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        task.add_done_callback(_retrieved)
        raise TimeoutError(f"no answer within {seconds:g} s")
    return task.result()


def _retrieved(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # nobody waits for it any more


def _in_use(label: str, holder: str) -> str:
    return f"journal {label} is in use by {holder}; stop that orchestrator or use another --db"


class FileClaim:
    """The writer's claim on an SQLite journal: an exclusive `flock` on the file
    next to it (`journal.db.lock`), held while the journal is open. The kernel
    releases it when the process ends, however it ends. The file says who holds it."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    @classmethod
    def take(cls, path: str) -> FileClaim:
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
_EVICT = sa.text("SELECT pg_terminate_backend(:pid)")
_STILL_HELD = sa.text(
    f"SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE {_ADVISORY} AND l.pid = pg_backend_pid())"
)


class PostgresClaim:
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
        evict: float | None = None,
    ) -> PostgresClaim:
        """Take the lock. `evict` (seconds): the caller has just taken the leader
        lease over, so whoever holds the lock is a deposed orchestrator: end its
        session (which releases the lock) and take it, trying for that long."""
        conn = await engine.connect()
        keys = dict(zip("ab", _CLAIM_KEYS, strict=True))
        try:
            # No transaction: one held open for the journal's life would stop vacuum.
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            taken = sa.text("SELECT pg_try_advisory_lock(:a, :b)")
            until = time.monotonic() + (evict or 0.0)
            while not (await conn.execute(taken, keys)).scalar():
                holder = (await conn.execute(_HOLDER, keys)).first()
                if evict is None or time.monotonic() > until:
                    raise JournalInUseError(_in_use(label, _describe_pg_holder(holder)))
                if holder is not None:
                    await conn.execute(_EVICT, {"pid": holder.pid})
                await asyncio.sleep(0.02)
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
                result = await within(self._conn.execute(_STILL_HELD, keys), self._every)
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
        unlock = self._conn.execute(sa.text("SELECT pg_advisory_unlock(:a, :b)"), keys)
        # Each bounded: the database may be cut off. The lock goes with the session.
        with contextlib.suppress(Exception):  # a connection gone took the lock with it
            await within(unlock, CLOSE_TIMEOUT)
        with contextlib.suppress(Exception):
            await within(self._conn.close(), CLOSE_TIMEOUT)


def _describe_pg_holder(row: Any) -> str:
    if row is None:
        return "another session (it is ending)"
    since = f" since {row.backend_start.isoformat(timespec='seconds')}" if row.backend_start else ""
    if match := re.fullmatch(r"timeslice:(\d+)@(.*?)(/[0-9a-f]+)?", row.application_name or ""):
        return f"pid {match[1]} on host {match[2]}{since}"
    return f"PostgreSQL session {row.pid} ({row.application_name or 'no application name'}){since}"
