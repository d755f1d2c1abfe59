"""A journal the real system wrote, replayed: the switches are the journal's, with
its bytes, waits and parts; reading refuses what is not a journal; the command
line writes the page and the export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.replay.conftest import ARRAY_BYTES, TURNS, connect, journal_rows
from timeslice.cli import app
from timeslice.orchestrator.server import Orchestrator
from timeslice.orchestrator.events import event_from_dict
from timeslice.orchestrator.state import LockTable
from timeslice.replay import ReplayError, read_journal, timelines_from_document
from timeslice.replay.page import embed_json
from timeslice.replay.timeline import Timeline


@pytest.fixture
def timeline(journal_timeline: Timeline) -> Timeline:
    return journal_timeline


def test_every_switch_the_journal_holds_is_replayed(
    recorded_journal: Path, timeline: Timeline
) -> None:
    done = [json.loads(payload) for _, _, payload in journal_rows(recorded_journal, "SwitchDone")]
    # Two jobs taking turns: every grant moves the contexts.
    assert len(done) == 2 * TURNS
    assert len(timeline.switches) == len(done)
    assert timeline.notes == ()
    for switch, event in zip(timeline.switches, done, strict=True):
        assert switch.token == event["token"] and switch.ok
        assert switch.end == pytest.approx(event["now"] - timeline.origin)
        assert switch.moved_bytes == event["moved_bytes"]
        assert switch.moved_bytes == sum(step[4] for step in event["steps"])
        snapshots = [step[3] for step in event["steps"] if step[2] == "snapshot"]
        restores = [step[3] for step in event["steps"] if step[2] == "restore"]
        assert switch.snapshot == max(snapshots, default=0.0)
        assert switch.restore == max(restores, default=0.0)
        # What the agents did between their start and the switch's end (their figures,
        # whole milliseconds, can add up to a little more).
        assert switch.agents_began is not None
        work = min(switch.snapshot + switch.restore, switch.end - switch.agents_began)
        assert switch.overhead == pytest.approx(max(0.0, switch.duration - work), abs=1e-9)


def test_the_switches_move_each_context_out_and_in(timeline: Timeline) -> None:
    first, *handovers = timeline.switches
    # The first grant saves the other registered job's context (it was live).
    assert first.saved == (("B",) if first.job == "A" else ("A",)) and not first.restored
    assert first.moved_bytes == ARRAY_BYTES
    previous = first.job
    for switch in handovers:
        assert switch.saved == (previous,) and switch.job != previous
        assert switch.restored
        assert switch.moved_bytes == 2 * ARRAY_BYTES  # one context out, one in
        assert switch.snapshot > 0
        # The restore came in as the snapshot freed room (a pipelined switch): its time
        # is what it added after the snapshot, which may round to nothing.
        assert [(s.job, s.bytes) for s in switch.steps if s.kind == "restore"] == [
            (switch.job, ARRAY_BYTES)
        ]
        previous = switch.job


def test_queue_waits_run_from_the_acquire_to_the_grant(
    recorded_journal: Path, timeline: Timeline
) -> None:
    asked: dict[str, list[float]] = {}
    for _, _, payload in journal_rows(recorded_journal, "Acquire"):
        event = json.loads(payload)
        asked.setdefault(event["job"], []).append(event["now"] - timeline.origin)
    for switch in timeline.switches:
        acquire = max(t for t in asked[switch.job] if t <= switch.end)
        assert switch.wait == pytest.approx(switch.end - acquire)
        assert switch.wait >= switch.duration - 1e-9


def test_holds_take_turns(timeline: Timeline) -> None:
    holds = sorted(timeline.spans_of("hold"), key=lambda s: s.start)
    assert [h.job for h in holds].count("A") == TURNS
    assert [h.job for h in holds].count("B") == TURNS
    for a, b in zip(holds, holds[1:], strict=False):
        assert a.end <= b.start and a.job != b.job
    # Each hold after a switch names it, and began when it ended.
    for hold in holds:
        assert hold.switch is not None
        assert hold.start == timeline.switches[hold.switch].end
        assert hold.waited == timeline.switches[hold.switch].wait


async def test_a_missing_journal_is_an_error_and_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "nope.db"
    with pytest.raises(ReplayError, match="does not exist"):
        await read_journal(str(missing))
    with pytest.raises(ReplayError, match="does not exist"):
        await read_journal(f"sqlite:///{missing}")
    assert not missing.exists()


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("memory", "keeps nothing"),
        ("sqlite://", "in-memory"),
        ("ftp://host/x", "unsupported journal URL"),
    ],
)
async def test_urls_with_nothing_to_replay(url: str, match: str) -> None:
    with pytest.raises(ReplayError, match=match):
        await read_journal(url)


async def test_a_file_that_is_not_a_journal(tmp_path: Path) -> None:
    text = tmp_path / "notes.db"
    text.write_text("not a database, just text\n" * 100)
    with pytest.raises(ReplayError, match="cannot read the journal"):
        await read_journal(str(text))
    other = tmp_path / "other.db"
    with connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    with pytest.raises(ReplayError, match="no events table"):
        await read_journal(str(other))
    with pytest.raises(ReplayError, match="not a file"):
        await read_journal(str(tmp_path))


async def test_a_compacted_journal_is_read_from_its_snapshot(
    recorded_journal: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "compacted.db"
    with connect(recorded_journal) as source, connect(copy) as target:
        source.backup(target)
    with connect(copy) as conn:
        # The table as it stood after event 10, then the events up to it gone.
        table = LockTable()
        for (payload,) in conn.execute("SELECT payload FROM events WHERE seq <= 10 ORDER BY seq"):
            table.handle(event_from_dict(json.loads(payload)))
        conn.execute(
            "INSERT INTO snapshots (seq, ts, state) VALUES (10, 0, ?)",
            (json.dumps(table.to_dict()),),
        )
        conn.execute("DELETE FROM events WHERE seq <= 10")
    record = await read_journal(str(copy))
    assert record.snapshot_seq == 10 and record.rows[0][0] == 11
    tl = record.timeline()
    assert any("compacted" in note for note in tl.notes)
    left = len(journal_rows(copy, "SwitchDone"))
    assert 0 < left < 2 * TURNS
    assert len(tl.switches) == left


async def test_a_journal_is_read_while_its_orchestrator_serves_it(tmp_path: Path) -> None:
    journal = tmp_path / "journal.db"
    async with Orchestrator(db=f"sqlite:///{journal}") as orch:
        await orch.acquire("g", "a")
        record = await read_journal(str(journal))  # the writer's claim is not in the way
        assert [row[2].__class__.__name__ for row in record.rows][-1] == "Acquire"
        await orch.yield_("g", "a")
    assert len((await read_journal(str(journal))).rows) > len(record.rows)


# --- the command line -----------------------------------------------------------------


def test_the_command_writes_the_page_and_the_export(
    recorded_journal: Path, timeline: Timeline, tmp_path: Path
) -> None:
    page, export = tmp_path / "replay.html", tmp_path / "events.json"
    result = CliRunner().invoke(
        app, ["replay", str(recorded_journal), "-o", str(page), "--export", str(export)]
    )
    assert result.exit_code == 0, result.output
    assert f"1 run(s), {len(timeline.switches)} switch(es)" in result.output
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>")
    assert embed_json({"runs": [timeline.to_dict()]})[1:-1] in text
    # The export, read back: the same switches, parts and bytes (to the microsecond).
    (back,) = timelines_from_document(json.loads(export.read_text()))
    assert len(back.switches) == len(timeline.switches)
    for a, b in zip(timeline.switches, back.switches, strict=True):
        assert (a.group, a.job, a.saved, a.restored, a.moved_bytes, a.error) == (
            b.group,
            b.job,
            b.saved,
            b.restored,
            b.moved_bytes,
            b.error,
        )
        for part in ("start", "end", "snapshot", "restore", "overhead", "wait"):
            assert getattr(a, part) == pytest.approx(getattr(b, part), abs=2e-6), part


def test_the_command_reports_a_missing_journal(tmp_path: Path) -> None:
    page = tmp_path / "replay.html"
    result = CliRunner().invoke(app, ["replay", str(tmp_path / "gone.db"), "-o", str(page)])
    assert result.exit_code == 1
    assert "no journal at" in result.output and "does not exist" in result.output
    assert not page.exists() and not (tmp_path / "gone.db").exists()


def test_the_command_needs_something_to_write(recorded_journal: Path) -> None:
    result = CliRunner().invoke(app, ["replay", str(recorded_journal)])
    assert result.exit_code == 2
    assert "--output" in result.output


def test_the_command_reads_the_default_journal(
    recorded_journal: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["replay", "-o", "page.html"])
    assert result.exit_code == 1 and "timeslice-journal.db" in result.output
    with connect(recorded_journal) as source, connect(tmp_path / "timeslice-journal.db") as target:
        source.backup(target)
    result = CliRunner().invoke(app, ["replay", "-o", "page.html"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "page.html").stat().st_size > 0
