"""The trace export (Trace Event Format JSON, as Perfetto's UI and chrome://tracing
read it), checked against the format's rules: each phase's required keys and types,
microsecond times, slices that nest on each thread, times in order on every track,
and a name for every process and thread. `check_trace` states the rules those
viewers apply; test_trace_engine.py also loads the export in Chrome DevTools' trace
engine (Perfetto's Python trace processor downloads its binary on first use)."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tests.replay.test_timeline import fold, two_node_handover
from timeslice.cli import app
from timeslice.replay import load_runs
from timeslice.replay.timeline import Timeline, tracks
from timeslice.replay.trace import duration, lanes, trace_document

PHASES = {"X", "C", "M", "i", "I"}
METADATA = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


def number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_trace(doc: Any) -> None:
    """Raise AssertionError where `doc` breaks a rule of the Trace Event Format's JSON
    Object Format that a viewer relies on."""
    json.dumps(doc, allow_nan=False)  # plain JSON, no NaN or infinities
    assert isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list)
    assert doc.get("displayTimeUnit", "ms") in ("ms", "ns")
    named_processes: set[int] = set()
    named_threads: set[tuple[int, int]] = set()
    used_processes: set[int] = set()
    used_threads: set[tuple[int, int]] = set()
    last_ts: dict[tuple[Any, ...], float] = {}
    # Viewers hold times as whole nanoseconds once read (Perfetto does): so does this.
    open_slices: dict[tuple[int, int], list[int]] = defaultdict(list)
    # Chrome DevTools does not round: it compares the float sums ts + dur.
    open_sums: dict[tuple[int, int], list[float]] = defaultdict(list)
    for event in doc["traceEvents"]:
        assert isinstance(event, dict), event
        ph = event.get("ph")
        assert ph in PHASES, event
        assert isinstance(event.get("name"), str) and event["name"], event
        assert isinstance(event.get("pid"), int) and isinstance(event.get("tid"), int), event
        assert number(event.get("ts")) and event["ts"] >= 0, event
        assert isinstance(event.get("args", {}), dict), event
        pid, tid, ts = event["pid"], event["tid"], event["ts"]
        if ph == "M":
            assert event["name"] in METADATA, event
            key = "name" if event["name"].endswith("_name") else "sort_index"
            value = event["args"].get(key)
            assert isinstance(value, str) if key == "name" else isinstance(value, int), event
            if event["name"] == "process_name":
                named_processes.add(pid)
            elif event["name"] == "thread_name":
                named_threads.add((pid, tid))
            continue
        assert isinstance(event.get("cat"), str), event
        used_processes.add(pid)
        if ph == "C":
            assert event["args"] and all(number(v) for v in event["args"].values()), event
            track: tuple[Any, ...] = ("C", pid, event["name"])
        else:
            used_threads.add((pid, tid))
            track = ("T", pid, tid)
        # Times in order on every track (a counter's samples, a thread's events).
        assert ts >= last_ts.get(track, -math.inf), f"ts goes back on {track}: {event}"
        last_ts[track] = ts
        if ph in ("i", "I"):
            assert event.get("s", "t") in ("g", "p", "t"), event
        if ph == "X":
            assert number(event.get("dur")) and event["dur"] >= 0, event
            # Slices of a thread nest: each one inside the one open, or after it.
            stack = open_slices[(pid, tid)]
            start = round(ts * 1000)
            while stack and stack[-1] <= start:
                stack.pop()
            end = start + round(event["dur"] * 1000)
            assert not stack or end <= stack[-1], f"crosses the slice open: {event}"
            stack.append(end)
            sums = open_sums[(pid, tid)]
            while sums and sums[-1] <= ts:
                sums.pop()
            end_sum = ts + event["dur"]
            assert not sums or end_sum <= sums[-1], f"crosses the slice open (as floats): {event}"
            sums.append(end_sum)
    assert used_processes <= named_processes, used_processes - named_processes
    assert used_threads <= named_threads, used_threads - named_threads


def events(doc: dict[str, Any], ph: str, name: str | None = None) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e["ph"] == ph and (name is None or e["name"] == name)]


def thread_names(doc: dict[str, Any]) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in events(doc, "M", "thread_name")}


def test_a_handover_as_a_trace() -> None:
    tl = fold(*two_node_handover())
    doc = trace_document([tl])
    check_trace(doc)
    assert {e["args"]["name"] for e in events(doc, "M", "process_name")} == {"group g"}
    assert sorted(thread_names(doc).values()) == ["A", "B", "switches"]
    slices = events(doc, "X")
    # Every span and switch once, in microseconds from the run's start.
    assert len(slices) == len(tl.spans) + len(tl.switches)
    handover = next(e for e in slices if e["name"].startswith("switch A"))
    assert handover["name"] == "switch A \u2192 B"
    assert (handover["ts"], handover["dur"]) == (10_000_000, 1_000_000)
    assert handover["args"]["snapshot_s"] == 0.5 and handover["args"]["moved_bytes"] == 600
    snapshot = next(e for e in slices if e["name"] == "snapshot")
    assert (snapshot["ts"], snapshot["dur"]) == (10_250_000, 500_000)
    assert thread_names(doc)[(snapshot["pid"], snapshot["tid"])] == "A"
    # The counters are the tracks the page draws.
    (track,) = tracks(tl)
    depth = [(e["ts"] / 1e6, e["args"]["waiting"]) for e in events(doc, "C", "queue depth")]
    assert depth == list(track.queue)
    usage = events(doc, "C", "utilisation %")
    assert len(usage) == len(track.usage) + 1  # and where the last window ends
    for e, u in zip(usage, track.usage, strict=False):
        assert e["ts"] == pytest.approx(u.start * 1e6)
        assert e["args"]["busy"] == pytest.approx(100 * u.busy)
        assert e["args"]["switching"] == pytest.approx(100 * u.switching)


def test_the_recorded_runs_as_one_trace(journal_timeline: Timeline, verl_runs_path: Path) -> None:
    runs = [journal_timeline, *load_runs(verl_runs_path)]
    doc = trace_document(runs)
    check_trace(doc)
    processes = events(doc, "M", "process_name")
    assert len(processes) == sum(len(tl.groups) for tl in runs)
    assert all(" \u00b7 group " in e["args"]["name"] for e in processes)  # run and group
    slices = events(doc, "X")
    assert len(slices) == sum(len(tl.spans) + len(tl.switches) for tl in runs)
    assert sum(e["name"].startswith("switch") for e in slices) == sum(
        len(tl.switches) for tl in runs
    )
    assert [r["label"] for r in doc["otherData"]["runs"]] == [tl.label for tl in runs]


def test_spans_that_would_cross_go_on_a_thread_beside() -> None:
    assert lanes([(0, 10), (2, 5), (5, 8), (9, 12), (12, 13)]) == [0, 0, 0, 1, 0]
    assert lanes([]) == []
    tl = fold(*two_node_handover())
    crossing = next(s for s in tl.spans if s.kind == "snapshot")  # 10.25..10.75
    late = type(crossing)("g", "A", "restore", 10.5, 12.0)
    doc = trace_document([replace(tl, spans=(*tl.spans, late))])
    check_trace(doc)
    assert "A (2)" in thread_names(doc).values()


def test_a_slice_ends_where_the_next_starts_as_floats_too() -> None:
    # 215697.765 + 47800.78 is 263498.54500000004: with that dur, DevTools took the hold
    # that starts at 263498.545 for a slice crossing the wait, and dropped it.
    assert 215697.765 + 47800.78 > 263498.545
    tl = fold(*two_node_handover())
    Span = type(tl.spans[0])
    wait = Span("g", "A", "wait", tl.start + 0.215697765, tl.start + 0.263498545)
    hold = Span("g", "A", "hold", tl.start + 0.263498545, tl.start + 0.29)
    doc = trace_document([replace(tl, spans=(*tl.spans, wait, hold))])
    check_trace(doc)
    first, second = (e for e in events(doc, "X") if e["ts"] in (215697.765, 263498.545))
    assert first["ts"] + first["dur"] == second["ts"]
    assert round(first["dur"] * 1000) == 47_800_780  # to the nanosecond, as before


BROKEN: list[tuple[str, Any]] = [
    ("no dur", lambda e: e["ph"] == "X" and e.pop("dur")),
    ("negative dur", lambda e: e["ph"] == "X" and e.update(dur=-1)),
    ("a number as a name", lambda e: e["ph"] == "X" and e.update(name=3)),
    ("a thread without a name", lambda e: e["name"] == "thread_name" and e.update(tid=999)),
    ("time going back", lambda e: e["ph"] == "C" and e.update(ts=e["ts"] + 1e12)),
    ("a negative time", lambda e: e["ph"] == "X" and e.update(ts=-1)),
]


@pytest.mark.parametrize(("why", "breaks"), BROKEN, ids=[b[0] for b in BROKEN])
def test_the_checks_catch_a_broken_trace(why: str, breaks: Any) -> None:
    doc = trace_document([fold(*two_node_handover())])
    for e in doc["traceEvents"]:
        if breaks(e) is not False:
            break
    with pytest.raises(AssertionError):
        check_trace(doc)


def test_the_checks_catch_crossing_slices() -> None:
    doc = trace_document([fold(*two_node_handover())])
    first = events(doc, "X")[0]
    at = doc["traceEvents"].index(first) + 1
    doc["traceEvents"].insert(at, {**first, "ts": first["ts"] + 1, "dur": first["dur"] + 5})
    with pytest.raises(AssertionError, match="crosses"):
        check_trace(doc)


def test_the_command_writes_the_trace(recorded_journal: Path, tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    result = CliRunner().invoke(app, ["replay", str(recorded_journal), "--trace", str(out)])
    assert result.exit_code == 0, result.output
    assert str(out) in result.output
    check_trace(json.loads(out.read_text()))


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 10**13), st.integers(0, 10**11))
def test_a_slice_never_ends_past_its_end_as_a_viewer_adds_it(start_ns: int, length_ns: int) -> None:
    ts, end = start_ns / 1000, (start_ns + length_ns) / 1000
    dur = duration(ts, end)
    assert dur >= 0 and ts + dur <= end
    if ts + (end - ts) == end:  # exact where the plain difference is
        assert ts + dur == end


def test_a_slice_that_no_float_duration_ends_exactly_ends_just_before() -> None:
    ts, end = 8964118.879, 102900251.746  # end - ts sums past end by one ulp
    assert ts + (end - ts) > end
    assert ts + duration(ts, end) <= end
