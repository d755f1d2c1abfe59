"""A recorded run as a timeline: who held, waited for, saved and restored what, when,
and every switch of contexts with its parts.

A timeline is made from the Orchestrator's journal (`from_journal`) or from the
recorded veRL runs' events (`verl`), and read by the page (`page`), the trace
(`trace`) and the tracks below (how busy each group was, window by window).
Nothing here does I/O or reads a clock.

Times are seconds from the timeline's `origin` (for a journal, the first
event's wall clock). A switch runs from the decision to switch (the event that
started it) to its `SwitchDone`; its parts are the agents' snapshot and restore
phases (each node's snapshots run at once, then its restore, and the nodes work
in parallel: a phase lasts as long as its slowest node) and the control
overhead, the part of the switch during which no agent was working on it
(journal write, dispatch, answers). A step carries its duration, not its start:
the phases are drawn from the moment the agents were asked (`SwitchDone.began`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

SpanKind = Literal["hold", "wait", "snapshot", "restore"]
SPAN_KINDS: Final = ("hold", "wait", "snapshot", "restore")
SNAPSHOT: Final = "snapshot"
RESTORE: Final = "restore"


@dataclass(frozen=True)
class Span:
    """`job` on `group` from `start` to `end`: holding it, waiting for it (queued),
    or having its context saved or restored there."""

    group: str
    job: str
    kind: SpanKind
    start: float
    end: float
    # Still going when the record ends (`end` is then the record's end).
    open: bool = False
    # How it ended, when that says more than its kind ("revoked: lease expired"...).
    note: str = ""
    # For a hold: the queue wait of its grant (Acquire to grant). The switch (by
    # index) that made a hold's context live, or that a snapshot or restore was part of.
    waited: float | None = None
    switch: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "job": self.job,
            "kind": self.kind,
            "start": self.start,
            "end": self.end,
            "open": self.open,
            "note": self.note,
            "waited": self.waited,
            "switch": self.switch,
        }


@dataclass(frozen=True)
class Step:
    """What one node did in a switch: snapshot or restore `job`'s context."""

    node: str
    job: str
    kind: str
    seconds: float
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "job": self.job,
            "kind": self.kind,
            "seconds": self.seconds,
            "bytes": self.bytes,
        }


@dataclass(frozen=True)
class Switch:
    """One switch of `group`'s contexts: `saved` out, `job` in.

    `wait` is the queue wait of the job it was for (its Acquire to its grant,
    the switch included); None when the switch failed or it is not recorded.
    `moved_bytes` is None when the record has no byte counts.
    """

    index: int
    group: str
    job: str
    saved: tuple[str, ...]
    start: float
    end: float
    snapshot: float
    restore: float
    overhead: float
    wait: float | None
    moved_bytes: int | None
    restored: bool
    error: str = ""
    token: int | None = None
    # When the agents were asked (the phases are drawn from there).
    agents_began: float | None = None
    steps: tuple[Step, ...] = ()
    # (job, "snapshot" or "restore", seconds): each context's move, its slowest node's
    moves: tuple[tuple[str, str, float], ...] = ()
    # The part of it in which nothing moved and nobody waited for the group yet (a
    # recorded swap that began before the next job asked): neither work nor overhead.
    idle: float = 0.0

    def move(self, job: str, kind: str) -> float | None:
        """How long `job`'s `kind` took in this switch, if it had one."""
        return next((s for j, k, s in self.moves if j == job and k == kind), None)

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def ok(self) -> bool:
        return not self.error

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "group": self.group,
            "job": self.job,
            "saved": list(self.saved),
            "start": self.start,
            "end": self.end,
            "duration": self.duration,
            "snapshot": self.snapshot,
            "restore": self.restore,
            "overhead": self.overhead,
            "wait": self.wait,
            "moved_bytes": self.moved_bytes,
            "restored": self.restored,
            "error": self.error,
            "token": self.token,
            "agents_began": self.agents_began,
            "steps": [s.to_dict() for s in self.steps],
            "moves": [list(m) for m in self.moves],
            "idle": self.idle,
        }


@dataclass(frozen=True)
class Mark:
    """A moment worth pointing at: a restart ("" group: every group), a revocation,
    a quarantine, a yield request, an abandoned switch."""

    time: float
    group: str
    job: str
    kind: str
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "group": self.group,
            "job": self.job,
            "kind": self.kind,
            "text": self.text,
        }


@dataclass(frozen=True)
class Timeline:
    """One recorded run, ready to draw."""

    label: str
    source: str
    start: float
    end: float
    groups: tuple[str, ...]
    jobs: tuple[str, ...]
    spans: tuple[Span, ...]
    switches: tuple[Switch, ...]
    marks: tuple[Mark, ...] = ()
    # What the reader should know about the record (compaction, skipped events...).
    notes: tuple[str, ...] = ()
    # Wall clock (seconds since the epoch) of time 0, when known.
    origin: float | None = None
    # Free-form facts about the run (framework, model, hardware...).
    meta: dict[str, str] = field(default_factory=dict)
    # Display names of jobs, where they differ from their ids.
    job_names: dict[str, str] = field(default_factory=dict)

    def spans_of(self, kind: str) -> list[Span]:
        return [s for s in self.spans if s.kind == kind]

    def summary(self) -> dict[str, Any]:
        """Headline figures: switch counts, bytes, median parts (seconds)."""
        done = [s for s in self.switches if s.ok]
        moved = [s.moved_bytes for s in self.switches if s.moved_bytes is not None]

        def median(values: Iterable[float | None]) -> float | None:
            present = [v for v in values if v is not None]
            return statistics.median(present) if present else None

        return {
            "switches": len(self.switches),
            "failed": len(self.switches) - len(done),
            "per_group": {g: sum(s.group == g for s in self.switches) for g in self.groups},
            "moved_bytes": sum(moved) if moved else None,
            "median_snapshot": median(s.snapshot for s in done if s.saved),
            "median_restore": median(s.restore for s in done if s.restored),
            "median_overhead": median(s.overhead for s in done),
            "median_wait": median(s.wait for s in done),
            "median_duration": median(s.duration for s in done),
        }

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: what the page is drawn from."""
        return {
            "label": self.label,
            "source": self.source,
            "start": self.start,
            "end": self.end,
            "origin": self.origin,
            "groups": list(self.groups),
            "jobs": list(self.jobs),
            "job_names": dict(self.job_names),
            "meta": dict(self.meta),
            "notes": list(self.notes),
            "spans": [s.to_dict() for s in self.spans],
            "switches": [s.to_dict() for s in self.switches],
            "marks": [m.to_dict() for m in self.marks],
            "summary": self.summary(),
            "resolution": time_resolution(self),
            "tracks": [t.to_dict() for t in tracks(self)],
        }


def uncovered(start: float, end: float, covered: Iterable[tuple[float, float]]) -> float:
    """How much of [start, end] none of the `covered` intervals overlaps."""
    length = max(0.0, end - start)
    clipped = sorted(
        (max(a, start), min(b, end)) for a, b in covered if min(b, end) > max(a, start)
    )
    union = 0.0
    cursor = start
    for a, b in clipped:
        a = max(a, cursor)
        if b > a:
            union += b - a
            cursor = b
    return max(0.0, length - union)


def ordered(names: Iterable[str]) -> tuple[str, ...]:
    """Names once each, in the order first seen."""
    return tuple(dict.fromkeys(n for n in names if n))


def covered(start: float, end: float, intervals: Iterable[tuple[float, float]]) -> float:
    """How much of [start, end] the union of `intervals` covers."""
    return max(0.0, end - start) - uncovered(start, end, intervals)


# --- the data's time resolution -------------------------------------------------------

# The finest resolution a replay shows: a microsecond (a journal's times are wall-clock
# floats whose last digits are noise once the origin is taken off).
FINEST_DECIMALS: Final = 6


def _decimals(value: float) -> int:
    """How many decimals `value` is written with (at most FINEST_DECIMALS), allowing
    for the binary noise of values read from decimal text (-933.5139999999999 is
    -933.514: 3)."""
    for d in range(FINEST_DECIMALS):
        scaled = value * 10**d
        if abs(scaled - round(scaled)) <= 1e-6 + 1e-12 * abs(scaled):
            return d
    return FINEST_DECIMALS


def time_resolution(tl: Timeline) -> float:
    """The time resolution of the data (seconds, a power of ten from 1 s down to 1 µs):
    the finest decimal any of its times or durations is written to. A journal's
    wall-clock times give 1 µs; runs recorded in milliseconds give 1 ms. The page
    zooms no finer than this and shows durations to this precision, no finer."""
    values: list[float] = [tl.start, tl.end]
    for s in tl.spans:
        values += (s.start, s.end)
    for w in tl.switches:
        values += (w.start, w.end, w.snapshot, w.restore)
        values += (step.seconds for step in w.steps)
    values += (m.time for m in tl.marks)
    decimals = max((_decimals(v) for v in values if math.isfinite(v)), default=0)
    return float(f"1e-{decimals}")


# --- tracks over time: utilisation and queue depth ------------------------------------

# At most this many utilisation windows per group: enough to see the shape of a run,
# few enough to keep the page small.
MAX_WINDOWS: Final = 200


@dataclass(frozen=True, kw_only=True)
class UsageWindow:
    """How `group`'s accelerators spent [start, end): the shares (0..1, summing to 1)
    of the time a job held them and worked (`busy`), they were switching between
    jobs (`switching`: from the decision to switch to its end), or neither (`idle`)."""

    start: float
    end: float
    busy: float
    switching: float
    idle: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "busy": self.busy,
            "switching": self.switching,
            "idle": self.idle,
        }


@dataclass(frozen=True, kw_only=True)
class Track:
    """One group's tracks over time: its utilisation in windows of `window` seconds
    (the last one may be shorter), and its queue depth, the number of jobs waiting
    for it (from their Acquire to their grant, as the waits are drawn), as
    (time, depth) points, each depth holding until the next point."""

    group: str
    window: float
    usage: tuple[UsageWindow, ...]
    queue: tuple[tuple[float, int], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "window": self.window,
            "usage": [u.to_dict() for u in self.usage],
            "queue": [list(q) for q in self.queue],
        }


def window_width(length: float, resolution: float, max_windows: int = MAX_WINDOWS) -> float:
    """The shortest round width (1, 2 or 5 times a power of ten seconds, at least
    `resolution`) that cuts `length` seconds into at most `max_windows` windows."""
    if max_windows < 1:
        raise ValueError(f"max_windows must be at least 1, not {max_windows}")
    wanted = max(length / max_windows, resolution, 1e-9)
    exponent = math.floor(math.log10(wanted))
    for mantissa in (1, 2, 5, 10):
        width = float(f"{mantissa}e{exponent}")
        if width * (1 + 1e-9) >= wanted:
            return width
    raise AssertionError("unreachable: 10 * 10**exponent >= wanted")


def utilisation(tl: Timeline, group: str, window: float) -> tuple[UsageWindow, ...]:
    """`group`'s utilisation over the run, in windows of `window` seconds from its
    start. Switching wins over holding where both are recorded at once."""
    if window <= 0:
        raise ValueError(f"a window must be longer than 0 s, not {window}")
    holds = [(s.start, s.end) for s in tl.spans if s.group == group and s.kind == "hold"]
    switching = [(w.start, w.end) for w in tl.switches if w.group == group]
    windows: list[UsageWindow] = []
    count = math.ceil((tl.end - tl.start) / window - 1e-9) if tl.end > tl.start else 0
    for i in range(count):
        start = tl.start + i * window
        end = min(tl.end, start + window)
        length = end - start
        switched = covered(start, end, switching)
        busy = covered(start, end, holds + switching) - switched
        windows.append(
            UsageWindow(
                start=start,
                end=end,
                busy=busy / length,
                switching=switched / length,
                idle=max(0.0, length - busy - switched) / length,
            )
        )
    return tuple(windows)


def queue_depth(tl: Timeline, group: str) -> tuple[tuple[float, int], ...]:
    """How many jobs wait for `group` over the run: (time, depth) from the run's start,
    one point where the depth changes. A wait still open when the record ends is
    still counted at its end."""
    changes: dict[float, int] = {}
    for s in tl.spans:
        if s.group == group and s.kind == "wait" and (s.end > s.start or s.open):
            changes[s.start] = changes.get(s.start, 0) + 1
            if not s.open:
                changes[s.end] = changes.get(s.end, 0) - 1
    points = [(tl.start, 0)]
    depth = 0
    for t in sorted(changes):
        depth += changes[t]
        if t <= tl.start:
            points[0] = (tl.start, depth)
        elif depth != points[-1][1]:
            points.append((t, depth))
    return tuple(points)


def tracks(tl: Timeline, max_windows: int = MAX_WINDOWS) -> tuple[Track, ...]:
    """Every group's utilisation and queue depth, in windows of one width for all."""
    window = window_width(tl.end - tl.start, time_resolution(tl), max_windows)
    return tuple(
        Track(
            group=g,
            window=window,
            usage=utilisation(tl, g, window),
            queue=queue_depth(tl, g),
        )
        for g in tl.groups
    )
