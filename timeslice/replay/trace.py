"""A run as a trace in the Trace Event Format (the JSON that Perfetto's UI and
chrome://tracing open), built from the same `Timeline` the replay page draws.

Each group of each run is a process and each of its jobs a thread; holds, waits,
snapshots and restores are complete events (`"ph": "X"`) on their job's thread, the
switches on a thread of the group's own, marks (restarts, revocations...) instant
events, and the queue depth and the utilisation counters (`"ph": "C"`). Times are
microseconds from the run's start. The events of one thread must nest (one inside
another, or apart): a span that would cross another is put on a thread of its own
beside it ("A (2)"), so that a viewer never drops one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from timeslice.replay.timeline import Span, Switch, Timeline, tracks

# Thread ids of a group's process: its switches, then its jobs' threads.
SWITCHES_TID: Final = 1
_CATEGORY: Final = "timeslice"


def _ns(seconds: float) -> int:
    """Seconds as whole nanoseconds, as viewers hold times once they have read them."""
    return round(seconds * 1e9)


def _us(seconds: float) -> float:
    """Seconds as microseconds, to the nanosecond (the format takes fractions)."""
    return _ns(seconds) / 1000


def lanes(intervals: Sequence[tuple[float, float]]) -> list[int]:
    """A lane for each interval such that the intervals of one lane nest (each inside
    another or apart from it), the fewest lanes a greedy pass in time order finds."""
    order = sorted(range(len(intervals)), key=lambda i: (intervals[i][0], -intervals[i][1]))
    stacks: list[list[float]] = []  # per lane, the ends of the intervals open there
    lane_of = [0] * len(intervals)
    for i in order:
        start, end = intervals[i]
        for lane, stack in enumerate(stacks):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                lane_of[i] = lane
                break
        else:
            stacks.append([end])
            lane_of[i] = len(stacks) - 1
    return lane_of


def duration(ts: float, end: float) -> float:
    """The `dur` from `ts` to `end` (both in microseconds, `end` not before `ts`)
    whose float sum `ts + dur` is `end` itself where one near `end - ts` is, and
    otherwise the largest of those whose sum is not past `end`: Chrome DevTools
    compares those sums with the next slice's `ts`, and drops a slice that seems to
    cross it by one ulp."""
    naive = end - ts
    step = math.ulp(end)  # about what one step of `dur` moves the sum by
    best = 0.0
    for k in range(-8, 9):
        dur = naive + k * step
        if dur < 0:
            continue
        total = ts + dur
        if total == end:
            return dur
        if total < end:
            best = max(best, dur)
    return best


def _complete(
    name: str, start: float, end: float, pid: int, tid: int, origin: float, args: dict[str, Any]
) -> dict[str, Any]:
    # The end rounded as the start is, so that what nests in seconds nests here.
    ts = _us(start - origin)
    return {
        "name": name,
        "cat": _CATEGORY,
        "ph": "X",
        "ts": ts,
        "dur": duration(ts, max(ts, _us(end - origin))),
        "pid": pid,
        "tid": tid,
        "args": {k: v for k, v in args.items() if v is not None and v != ""},
    }


def _metadata(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": args}


def _span_event(s: Span, pid: int, tid: int, origin: float) -> dict[str, Any]:
    args = {
        "group": s.group,
        "job": s.job,
        "note": s.note,
        "waited_s": s.waited,
        "switch": None if s.switch is None else s.switch + 1,
        "open": True if s.open else None,
    }
    return _complete(s.kind, s.start, s.end, pid, tid, origin, args)


def _switch_event(w: Switch, pid: int, tid: int, origin: float, tl: Timeline) -> dict[str, Any]:
    saved = ", ".join(tl.job_names.get(j, j) for j in w.saved) or "nothing"
    name = f"switch {saved} \u2192 {tl.job_names.get(w.job, w.job)}"
    args = {
        "switch": w.index + 1,
        "failed": w.error or None,
        "snapshot_s": w.snapshot,
        "restore_s": w.restore,
        "overhead_s": w.overhead,
        "idle_s": w.idle or None,
        "queue_wait_s": w.wait,
        "moved_bytes": w.moved_bytes,
        "token": w.token,
    }
    return _complete(name if w.ok else name + " (failed)", w.start, w.end, pid, tid, origin, args)


def _threads(
    events: list[dict[str, Any]],
    pid: int,
    last_tid: int,
    name: str,
    items: Sequence[Any],
    intervals: Sequence[tuple[float, float]],
    event: Callable[[Any, int], dict[str, Any]],
    always: bool = False,
) -> int:
    """Add `items` (one per interval) to `events` as threads of `pid` named `name`
    ("name (2)"... where they would cross), numbered after `last_tid`; the last
    thread id used. With `always`, the first thread is named even if it is empty."""
    placed = lanes(intervals)
    tids: dict[int, int] = {}
    for lane in sorted(set(placed) | ({0} if always else set())):
        last_tid += 1
        tids[lane] = last_tid
        thread = name if lane == 0 else f"{name} ({lane + 1})"
        events.append(_metadata("thread_name", pid, last_tid, {"name": thread}))
        events.append(_metadata("thread_sort_index", pid, last_tid, {"sort_index": last_tid}))
    for item, lane in zip(items, placed, strict=True):
        events.append(event(item, tids[lane]))
    return last_tid


def _run_events(tl: Timeline, first_pid: int, several: bool) -> list[dict[str, Any]]:
    """The events of one run, its groups' processes numbered from `first_pid`."""
    origin = tl.start
    events: list[dict[str, Any]] = []
    pids = {g: first_pid + i for i, g in enumerate(tl.groups)}
    for g, pid in pids.items():
        label = f"{tl.label} \u00b7 group {g}" if several else f"group {g}"
        events.append(_metadata("process_name", pid, 0, {"name": label}))
        events.append(_metadata("process_sort_index", pid, 0, {"sort_index": pid}))
        switches = [w for w in tl.switches if w.group == g]
        tid = _threads(
            events,
            pid,
            SWITCHES_TID - 1,
            "switches",
            switches,
            [(w.start, w.end) for w in switches],
            lambda w, t: _switch_event(w, pid, t, origin, tl),
            always=True,  # the marks are drawn there too
        )
        for job in tl.jobs:
            spans = [s for s in tl.spans if s.group == g and s.job == job]
            tid = _threads(
                events,
                pid,
                tid,
                tl.job_names.get(job, job),
                spans,
                [(s.start, s.end) for s in spans],
                lambda s, t: _span_event(s, pid, t, origin),
            )
    for m in tl.marks:
        for g in [m.group] if m.group in pids else tl.groups:
            events.append(
                {
                    "name": m.kind,
                    "cat": _CATEGORY,
                    "ph": "i",
                    "s": "p",
                    "ts": _us(m.time - origin),
                    "pid": pids[g],
                    "tid": SWITCHES_TID,
                    "args": {"text": m.text, **({"job": m.job} if m.job else {})},
                }
            )
    for track in tracks(tl):
        pid = pids[track.group]
        for t, depth in track.queue:
            events.append(_counter("queue depth", t - origin, pid, {"waiting": depth}))
        for u in track.usage:
            shares = {"busy": u.busy, "switching": u.switching, "idle": u.idle}
            percent = {k: round(100 * v, 3) for k, v in shares.items()}
            events.append(_counter("utilisation %", u.start - origin, pid, percent))
        if track.usage:  # where the last window ends: nothing after it
            events.append(
                _counter(
                    "utilisation %",
                    track.usage[-1].end - origin,
                    pid,
                    {"busy": 0, "switching": 0, "idle": 0},
                )
            )
    return events


def _counter(name: str, t: float, pid: int, values: dict[str, float]) -> dict[str, Any]:
    return {
        "name": name,
        "cat": _CATEGORY,
        "ph": "C",
        "ts": _us(t),
        "pid": pid,
        "tid": 0,
        "args": values,
    }


def _order(event: dict[str, Any]) -> tuple[int, float, float]:
    """Metadata first, then by time, a longer slice before the ones it holds."""
    return (0 if event["ph"] == "M" else 1, event["ts"], -event.get("dur", 0.0))


def trace_document(timelines: Iterable[Timeline]) -> dict[str, Any]:
    """The Trace Event Format document (JSON Object Format) of `timelines`: one
    process per group of each run, the events in time order."""
    runs = list(timelines)
    events: list[dict[str, Any]] = []
    pid = 1
    runs_meta = []
    for tl in runs:
        events += _run_events(tl, pid, len(runs) > 1)
        runs_meta.append(
            {
                "label": tl.label,
                "source": tl.source,
                "origin": tl.origin,
                "start_s": tl.start,
                "first_pid": pid,
            }
        )
        pid += len(tl.groups)
    events.sort(key=_order)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"producer": "timeslice replay", "runs": runs_meta},
    }
