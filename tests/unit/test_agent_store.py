"""Where the agent keeps its job table: in memory, or in an SQLite file that a
restarted agent reads back."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from timeslice.agent.state import SNAPSHOT, Finish, JobState, JobTable, Register, Start
from timeslice.agent.store import PAGE_SIZE, StateStore
from timeslice.storage import JournalBusy


def job_table_document() -> dict[str, Any]:
    """A saved job table, with text that JSON must escape."""
    table = JobTable()
    table.handle(
        Register(
            now=1.0,
            group="gröup ✓",
            job="jöb 🚀",
            backend="noop",
            config={"q": 'a " b\n'},
            claims=("pid:1",),
        )
    )
    table.handle(
        Register(
            now=1.5, group="", job="any", backend="cuda", config={}, claims=(), state=JobState.SAVED
        )
    )
    table.handle(
        Start(now=2.0, kind=SNAPSHOT, group="gröup ✓", job="jöb 🚀", timeout=30.0, token=3)
    )
    table.handle(Finish(now=3.0, op_id="op-1", ok=True, storage_bytes=1 << 40))
    return table.to_dict()


@pytest.fixture(params=["memory", "file"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str | None:
    return None if request.param == "memory" else f"sqlite:///{tmp_path / 'agent.db'}"


async def test_an_empty_store_loads_nothing(url: str | None) -> None:
    store = StateStore(url)
    await store.open()
    try:
        assert await store.load() is None
    finally:
        await store.close()


async def test_a_saved_table_loads_back_equal(url: str | None) -> None:
    document = job_table_document()
    store = StateStore(url)
    await store.open()
    try:
        store.save(document)
        loaded = await store.load()
        assert loaded == document
        assert JobTable.from_dict(loaded).to_dict() == document
    finally:
        await store.close()


async def test_a_save_replaces_the_last_one(url: str | None) -> None:
    store = StateStore(url)
    await store.open()
    try:
        store.save({"version": 1})
        store.save(job_table_document())
        assert await store.load() == job_table_document()
    finally:
        await store.close()


async def test_a_save_finds_a_file_another_writer_holds_busy_at_once(tmp_path: Path) -> None:
    store = StateStore(f"sqlite:///{tmp_path / 'agent.db'}")
    await store.open()
    other = sqlite3.connect(tmp_path / "agent.db", isolation_level=None)
    try:
        store.save({"version": 1})
        other.execute("BEGIN IMMEDIATE")  # another writer: a sqlite3 shell, say
        started = time.monotonic()
        with pytest.raises(JournalBusy, match=r"job table .* is locked by another writer"):
            store.save({"version": 2})
        assert time.monotonic() - started < 1  # not SQLite's busy timeout, on the loop
        other.execute("ROLLBACK")
        assert await store.load() == {"version": 1}  # nothing of the busy save was kept
        store.save({"version": 3})
        assert await store.load() == {"version": 3}
    finally:
        other.close()
        await store.close()


async def test_what_was_saved_does_not_change_with_the_callers_dict(url: str | None) -> None:
    document = job_table_document()
    store = StateStore(url)
    await store.open()
    try:
        store.save(document)
        document["jobs"].clear()
        loaded = await store.load()
        assert loaded is not None and len(loaded["jobs"]) == 2
    finally:
        await store.close()


async def test_a_file_store_survives_close_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    document = job_table_document()
    first = StateStore(f"sqlite:///{path}")
    await first.open()
    first.save(document)
    await first.close()

    second = StateStore(f"sqlite:///{path}")
    await second.open()
    try:
        assert await second.load() == document
    finally:
        await second.close()
    # one document, whole, in the file
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT key, doc FROM agent_state").fetchall()
    assert [(key, json.loads(doc)) for key, doc in rows] == [("job_table", document)]


def wal_frames(path: Path, page_size: int) -> int:
    """The frames in the WAL next to the database at `path` (a 32-byte header, then a
    24-byte header and a page each)."""
    size = (path.parent / f"{path.name}-wal").stat().st_size
    assert (size - 32) % (24 + page_size) == 0, size
    return (size - 32) // (24 + page_size)


async def test_a_save_of_a_few_jobs_writes_one_page(tmp_path: Path) -> None:
    # Documents of another length each time, as a switch's saves are: on a page too
    # small for them, each save freed the overflow page of the last one and took a
    # new one (four pages a save).
    path = tmp_path / "agent.db"
    store = StateStore(f"sqlite:///{path}")
    await store.open()
    try:
        store.save({"pad": ""})
        before = wal_frames(path, PAGE_SIZE)
        for i in range(40):
            store.save({"pad": "x" * (4400 + 150 * (i % 3))})
        assert wal_frames(path, PAGE_SIZE) - before == 40
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA page_size").fetchone() == (PAGE_SIZE,)


async def test_a_file_made_with_other_pages_keeps_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "agent.db"
    document = job_table_document()
    with monkeypatch.context() as patched:  # made by an agent before 8 KiB pages
        patched.setattr("timeslice.agent.store.PAGE_SIZE", 4096)
        old = StateStore(f"sqlite:///{path}")
        await old.open()
        old.save(document)
        await old.close()
    store = StateStore(f"sqlite:///{path}")
    await store.open()
    try:
        assert await store.load() == document
        store.save({**document, "next_op": 9})
        assert await store.load() == {**document, "next_op": 9}
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA page_size").fetchone() == (4096,)


async def test_a_bare_path_is_an_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    store = StateStore(str(path))
    await store.open()
    try:
        store.save({"epoch": 3})
    finally:
        await store.close()
    again = StateStore(f"sqlite:///{path}")
    await again.open()
    try:
        assert await again.load() == {"epoch": 3}
    finally:
        await again.close()


async def test_open_and_close_are_idempotent(tmp_path: Path) -> None:
    store = StateStore(f"sqlite:///{tmp_path / 'agent.db'}")
    await store.open()
    store.save({"epoch": 1})
    await store.open()
    assert await store.load() == {"epoch": 1}
    await store.close()
    await store.close()


@pytest.mark.parametrize(
    "bad_url", ["postgresql://user@localhost/timeslice", "mysql://user@localhost/timeslice"]
)
async def test_a_store_that_is_not_sqlite_is_refused(bad_url: str) -> None:
    store = StateStore(bad_url)
    with pytest.raises(ValueError, match="SQLite|sqlite"):
        await store.open()
    await store.close()
