"""The files of a journal and of an agent's job table: readable by their owner only,
whatever the umask; refused (never changed) when they are not ours to use: not
SQLite, a folder, another application's database, a newer schema; a full disk
that says so; and a database another writer holds, waited for off the event loop."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import stat
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from timeslice.agent.store import StateStore
from timeslice.errors import JournalError
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.events import event_to_dict
from timeslice.orchestrator.journal import SCHEMA_VERSION, SqlJournal, normalize_url
from timeslice.storage import JournalBusy

pytestmark = pytest.mark.timeout(30)

EVENT = ev.Acquire(now=1.0, group="g", job="a", call_id="0.1")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The most permissive umask: what is private is so by its own doing."""
    import os

    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def sqlite_rows(path: Path, query: str) -> list[tuple[object, ...]]:
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute(query).fetchall()


# --- modes ----------------------------------------------------------------------------


@pytest.mark.usefixtures("open_umask")
async def test_a_journal_and_its_files_are_readable_by_the_owner_only(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    path = tmp_path / "state" / "deeper" / "journal.db"
    journal = SqlJournal(str(path))
    await journal.open()
    try:
        await journal.append([EVENT])
        files = [path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}.lock")]
        assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}
        # the folders it made are private; the one that was there keeps its mode
        assert (mode(tmp_path / "state"), mode(path.parent)) == (0o700, 0o700)
        assert mode(tmp_path) == 0o755
    finally:
        await journal.close()


@pytest.mark.usefixtures("open_umask")
async def test_an_existing_journal_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    sqlite3.connect(path).close()  # an empty database, made by the user
    path.chmod(0o640)
    journal = SqlJournal(str(path))
    await journal.open()
    await journal.close()
    assert mode(path) == 0o640


@pytest.mark.usefixtures("open_umask")
async def test_an_agents_job_table_is_readable_by_the_owner_only(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    path = tmp_path / "agent" / "agent.db"
    store = StateStore(str(path))
    await store.open()
    try:
        store.save({"epoch": 1})
        files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
        assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}
        assert (mode(path.parent), mode(tmp_path)) == (0o700, 0o755)
    finally:
        await store.close()


# --- what is not ours -----------------------------------------------------------------


async def open_journal_error(url: str) -> str:
    journal = SqlJournal(url)
    with pytest.raises(JournalError) as refused:
        await journal.open()
    await journal.close()
    message = str(refused.value)
    assert "\n" not in message
    return message


async def open_store_error(url: str) -> str:
    store = StateStore(url)
    with pytest.raises(JournalError) as refused:
        await store.open()
    await store.close()
    message = str(refused.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("opener", [open_journal_error, open_store_error])
async def test_a_file_that_is_not_sqlite_is_refused_and_left_alone(
    tmp_path: Path, opener: object
) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"not a database, just text\n" * 100)
    message = await opener(str(path))  # type: ignore[operator]
    assert message == f"{path} is not an SQLite database"
    assert path.read_bytes() == b"not a database, just text\n" * 100


@pytest.mark.parametrize("opener", [open_journal_error, open_store_error])
async def test_a_folder_is_refused(tmp_path: Path, opener: object) -> None:
    message = await opener(str(tmp_path))  # type: ignore[operator]
    assert message.endswith(f"{tmp_path} is a folder, not a file")


@pytest.mark.parametrize("opener", [open_journal_error, open_store_error])
async def test_another_applications_database_is_refused_and_left_alone(
    tmp_path: Path, opener: object
) -> None:
    path = tmp_path / "other.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, owner TEXT)")
        conn.commit()
    message = await opener(str(path))  # type: ignore[operator]
    assert message.startswith(f"{path} is not a timeslice ")
    assert "accounts" in message
    assert sqlite_rows(path, "SELECT name FROM sqlite_master") == [("accounts",)]


async def test_a_table_of_our_name_but_not_ours_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, title TEXT)")
        conn.commit()
    message = await open_journal_error(str(path))
    assert "is not a timeslice journal" in message


# --- schema versions ------------------------------------------------------------------


async def test_a_new_journal_records_its_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    journal = SqlJournal(str(path))
    await journal.open()
    await journal.close()
    assert sqlite_rows(path, "SELECT key, value FROM journal_meta") == [
        ("schema_version", str(SCHEMA_VERSION))
    ]


async def test_a_journal_written_before_schema_versions_opens_and_is_upgraded(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.db"
    with closing(sqlite3.connect(path)) as conn:
        # what the first releases created, with an event and a snapshot in it
        conn.executescript(
            """
            CREATE TABLE events (seq INTEGER NOT NULL, ts FLOAT NOT NULL,
                kind VARCHAR(64) NOT NULL, payload TEXT NOT NULL, PRIMARY KEY (seq));
            CREATE TABLE snapshots (seq INTEGER NOT NULL, ts FLOAT NOT NULL,
                state TEXT NOT NULL, PRIMARY KEY (seq));
            INSERT INTO snapshots VALUES (1, 1.0, '{"at": 1}');
            """
        )
        payload = json.dumps(event_to_dict(EVENT))
        conn.execute("INSERT INTO events VALUES (1, 1.0, 'Acquire', ?)", (payload,))
        conn.execute("INSERT INTO events VALUES (2, 1.0, 'Acquire', ?)", (payload,))
        conn.commit()
    journal = SqlJournal(str(path))
    await journal.open()
    try:
        loaded = await journal.load()
        assert (loaded.snapshot, [seq for seq, _ in loaded.tail]) == ({"at": 1}, [2])
        assert await journal.append([EVENT]) == 3
    finally:
        await journal.close()
    assert sqlite_rows(path, "SELECT value FROM journal_meta WHERE key = 'schema_version'") == [
        (str(SCHEMA_VERSION),)
    ]


async def test_a_journal_of_a_newer_schema_is_refused_naming_both_versions(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.db"
    journal = SqlJournal(str(path))
    await journal.open()
    await journal.close()
    newer = SCHEMA_VERSION + 1
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("UPDATE journal_meta SET value = ? WHERE key = 'schema_version'", (newer,))
        conn.commit()
    message = await open_journal_error(str(path))
    assert message == (
        f"journal {path}: schema {newer} is newer than this timeslice ({SCHEMA_VERSION}):"
        " upgrade timeslice"
    )
    reader = SqlJournal(str(path), read_only=True)
    with pytest.raises(JournalError, match="is newer than this timeslice"):
        await reader.open()
    await reader.close()


async def test_an_agents_job_table_of_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    store = StateStore(str(path))
    await store.open()
    store.save({"epoch": 1})
    await store.close()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT value FROM agent_meta").fetchall() == [("2",)]
        conn.execute("UPDATE agent_meta SET value = '7' WHERE key = 'schema_version'")
        conn.commit()
    message = await open_store_error(str(path))
    assert (
        message == f"job table {path}: schema 7 is newer than this timeslice (2): upgrade timeslice"
    )


async def test_an_agents_job_table_from_before_schema_versions_opens(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(
            "CREATE TABLE agent_state (key VARCHAR(64) NOT NULL, saved_at FLOAT NOT NULL,"
            " doc TEXT NOT NULL, PRIMARY KEY (key))"
        )
        conn.execute("INSERT INTO agent_state VALUES ('job_table', 1.0, '{\"epoch\": 4}')")
        conn.commit()
    store = StateStore(str(path))
    await store.open()
    try:
        assert await store.load() == {"epoch": 4}
    finally:
        await store.close()
    assert sqlite_rows(path, "SELECT value FROM agent_meta") == [("2",)]


# --- a full disk ----------------------------------------------------------------------


async def test_a_full_disk_says_so_and_the_journal_goes_on_once_there_is_room(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.db"
    journal = SqlJournal(str(path))
    await journal.open()
    try:
        await journal.append([EVENT])
        assert journal._writer is not None  # the appends' connection: make its database full
        writer = journal._writer.connection.dbapi_connection
        assert writer is not None
        pages = writer.execute("PRAGMA page_count").fetchone()[0]
        writer.execute(f"PRAGMA max_page_count = {pages}")
        big = ev.ForceRelease(now=2.0, group="g", job="a", reason="x" * 200_000)
        with pytest.raises(JournalError) as full:
            await journal.append([big])
        assert str(full.value) == f"journal {path}: the disk is full (database or disk is full)"
        writer.execute("PRAGMA max_page_count = 1073741823")
        assert await journal.append([EVENT]) == 2  # nothing of the failed one was kept
        assert [seq for seq, _, _ in await journal.read()] == [1, 2]
    finally:
        await journal.close()


async def test_a_database_held_by_another_writer_is_busy_at_once_and_written_once_free(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.db"
    journal = SqlJournal(str(path))
    await journal.open()
    other = sqlite3.connect(path, isolation_level=None)
    try:
        assert journal.inline
        assert journal.append_now([EVENT]) == 1
        other.execute("BEGIN IMMEDIATE")  # another writer: a sqlite3 shell, say
        started = time.monotonic()
        with pytest.raises(JournalBusy, match="is locked by another writer"):
            journal.append_now([EVENT])
        with pytest.raises(JournalBusy):
            journal.save_snapshot_now(1, {"groups": {}})
        assert time.monotonic() - started < 1  # not SQLite's busy timeout, on the loop
        # `append` waits for it without holding up the loop, which goes on meanwhile.
        appended = asyncio.ensure_future(journal.append([EVENT]))
        await asyncio.sleep(0.2)
        assert not appended.done()
        other.execute("ROLLBACK")
        assert await asyncio.wait_for(appended, 5) == 2  # nothing of the busy ones was kept
        journal.save_snapshot_now(2, {"groups": {}})
        assert [seq for seq, _, _ in await journal.read()] == [1, 2]
        assert await journal.snapshot_before(2) == (2, {"groups": {}})
    finally:
        other.close()
        await journal.close()


async def test_an_agents_full_disk_says_so(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    store = StateStore(str(path))
    await store.open()
    try:
        store.save({"epoch": 1})
        assert store._writer is not None  # the connection the saves are written on
        raw = store._writer.connection.dbapi_connection
        assert raw is not None
        pages = raw.execute("PRAGMA page_count").fetchone()[0]
        raw.execute(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(JournalError, match=r"job table .*: the disk is full"):
            store.save({"epoch": 2, "pad": "x" * 200_000})
        assert await store.load() == {"epoch": 1}
    finally:
        await store.close()


# --- URLs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "database"),
    [
        ("/var/lib/timeslice/journal.db", "/var/lib/timeslice/journal.db"),
        ("/tmp/a.db", "/tmp/a.db"),
        ("sqlite:////tmp/a.db", "/tmp/a.db"),
        ("sqlite:///relative/a.db", "relative/a.db"),
        ("relative/a.db", "relative/a.db"),
    ],
)
def test_sqlite_paths_keep_sqlalchemys_meaning(given: str, database: str) -> None:
    from sqlalchemy.engine import make_url

    assert make_url(normalize_url(given)).database == database
    assert normalize_url("/tmp/a.db") == "sqlite:////tmp/a.db"


def test_a_relative_journal_is_named_by_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert SqlJournal("sqlite:///sub/j.db").label == str(tmp_path / "sub" / "j.db")
