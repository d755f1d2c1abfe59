"""Replays of recorded runs: the Orchestrator's journal (or the recorded veRL runs'
lock events) as a timeline of holds, waits, snapshots, restores and switches,
drawn in a self-contained HTML page (`timeslice replay`).

- `timeline`: a run as a `Timeline` of spans, switches and marks, and its tracks (pure)
- `from_journal`: the journal folded through the lock table into a `Timeline` (pure)
- `verl`: the recorded runs' event schema, read into a `Timeline` and written from one
- `page`: the HTML page
- `trace`: a run as a Chrome/Perfetto trace (Trace Event Format JSON)
- `source`: reading a journal
"""

from timeslice.replay.from_journal import timeline_from_journal
from timeslice.replay.page import render_page
from timeslice.replay.source import JournalRecord, ReplayError, read_journal
from timeslice.replay.timeline import Mark, Span, Step, Switch, Timeline
from timeslice.replay.verl import (
    ScheduleError,
    events_from_timeline,
    export_document,
    load_runs,
    timelines_from_document,
)

__all__ = [
    "JournalRecord",
    "Mark",
    "ReplayError",
    "ScheduleError",
    "Span",
    "Step",
    "Switch",
    "Timeline",
    "events_from_timeline",
    "export_document",
    "load_runs",
    "read_journal",
    "render_page",
    "timeline_from_journal",
    "timelines_from_document",
]
