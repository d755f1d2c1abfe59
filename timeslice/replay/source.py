"""Reading an Orchestrator journal for a replay: every event from the first, and the
newest snapshot only when the first events are gone.

A replay only reads, so a journal that is not there is an error here, never a
new empty one.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from timeslice.errors import TimeSliceError
from timeslice.orchestrator.journal import open_journal
from timeslice.storage import normalize_url
from timeslice.replay.from_journal import JournalRow, timeline_from_journal
from timeslice.replay.timeline import Timeline


class ReplayError(Exception):
    """What an operator must fix before a replay can be made (a missing journal...)."""


@dataclass(frozen=True)
class JournalRecord:
    """What a journal holds for a replay."""

    label: str
    source: str
    rows: list[JournalRow]
    snapshot_seq: int = 0
    snapshot: dict[str, Any] | None = None

    def timeline(self) -> Timeline:
        return timeline_from_journal(
            self.rows,
            label=self.label,
            source=self.source,
            snapshot_seq=self.snapshot_seq,
            snapshot=self.snapshot,
        )


def describe(url: str) -> tuple[str, str]:
    """(label, source) of journal `url`, the source without any password."""
    if url == "memory":
        raise ReplayError("an in-memory journal ('memory') keeps nothing to replay")
    try:
        parsed = make_url(normalize_url(url))
    except TimeSliceError as exc:
        raise ReplayError(exc.message) from None
    except Exception as exc:  # an URL SQLAlchemy cannot parse
        raise ReplayError(f"not a journal URL: {url!r} ({exc})") from None
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        if database in ("", ":memory:"):
            raise ReplayError(f"{url!r} is an in-memory SQLite journal: nothing to replay")
        return Path(database).name, database
    source = parsed.render_as_string(hide_password=True)
    return f"{parsed.database or parsed.host or 'journal'}", source


def check_sqlite(path: str) -> None:
    """Raise `ReplayError` unless `path` is a readable SQLite journal."""
    file = Path(path)
    if not file.exists():
        raise ReplayError(f"no journal at {path}: the file does not exist")
    if not file.is_file():
        raise ReplayError(f"no journal at {path}: not a file")
    try:
        with closing(sqlite3.connect(f"{file.resolve().as_uri()}?mode=ro", uri=True)) as conn:
            names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    except sqlite3.Error as exc:
        raise ReplayError(f"cannot read the journal {path}: {exc}") from None
    if "events" not in names:
        raise ReplayError(f"{path} is not a timeslice journal (it has no events table)")


async def read_journal(url: str) -> JournalRecord:
    """Every event of the journal at `url` (a path, sqlite:///PATH or postgresql://...)."""
    label, source = describe(url)
    if make_url(normalize_url(url)).get_backend_name() == "sqlite":
        check_sqlite(source)
    # A replay only reads: it claims nothing, so it runs beside the orchestrator
    # that serves the journal.
    journal = open_journal(url, read_only=True)
    try:
        await journal.open()
        rows = await journal.read()
        snapshot_seq, snapshot = 0, None
        if rows and rows[0][0] > 1:
            # Compacted: the replay starts from the snapshot the first event kept
            # follows (compaction keeps it), and shows every event kept after it.
            found = await journal.snapshot_before(rows[0][0] - 1)
            if found is None:
                loaded = await journal.load()
                snapshot_seq, snapshot = loaded.snapshot_seq, loaded.snapshot
                rows = [row for row in rows if row[0] > snapshot_seq]
            else:
                snapshot_seq, snapshot = found
    except ReplayError:
        raise
    except Exception as exc:
        raise ReplayError(f"cannot read the journal {source}: {exc}") from exc
    finally:
        await journal.close()
    return JournalRecord(label, source, rows, snapshot_seq, snapshot)
