"""A recorded run as a timeline: who held, waited for, saved and restored what, when,
and every switch of contexts with its parts.

`timeline_from_journal` interprets the Orchestrator's journal the way a restart
does: it folds the events through the pure `LockTable.handle` and reads the
effects each one produced (`Granted`, `Queued`, `Yielded`, `Revoked`,
`LeftQueue`, `SwitchStarted`...), so the replay shows what the code that made
the decisions decided, not a second reading of the events. Nothing here does
I/O or reads a clock.

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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from timeslice.errors import TimeSliceError
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.events import Effect, Event
from timeslice.orchestrator.state import LockTable

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


# --- the journal ----------------------------------------------------------------------

JournalRow = tuple[int, float, Event]


@dataclass
class _Pending:
    """A switch the table started and the agents have not finished."""

    token: int
    job: str
    decided: float


class _JournalFold:
    """Turns the effects of each journaled event into spans, switches and marks."""

    def __init__(self, origin: float) -> None:
        self.origin = origin
        self.spans: list[Span] = []
        self.switches: list[Switch] = []
        self.marks: list[Mark] = []
        self.notes: list[str] = []
        self.groups: list[str] = []
        self.jobs: list[str] = []
        # (group, job) -> (start, token, waited, switch index) of an open hold
        self.holds: dict[tuple[str, str], tuple[float, int, float | None, int | None]] = {}
        self.waits: dict[tuple[str, str], float] = {}
        self.pending: dict[str, _Pending] = {}
        self.last = 0.0

    def seen(self, group: str, job: str = "") -> None:
        if group and group not in self.groups:
            self.groups.append(group)
        if job and job not in self.jobs:
            self.jobs.append(job)

    def seed(self, table: LockTable) -> None:
        """Start from a snapshot of the table: its holders hold and its queues wait
        from time 0."""
        for g in table.groups.values():
            if g.holder is not None:
                h = g.holder
                self.seen(g.name, h.job)
                if h.switching:
                    self.pending[g.name] = _Pending(h.token, h.job, 0.0)
                else:
                    self.holds[(g.name, h.job)] = (0.0, h.token, None, None)
            for job in g.queue:
                self.seen(g.name, job)
                self.waits[(g.name, job)] = 0.0

    def event(self, event: Event, effects: Sequence[Effect]) -> None:
        t = event.now - self.origin
        self.last = max(self.last, t)
        match event:
            case ev.Recover():
                self.marks.append(Mark(t, "", "", "restart", "the orchestrator (re)started"))
            case ev.SetGroupNodes():
                self.seen(event.group)
            case ev.Acquire():
                # It waits from its Acquire (until the grant, if one comes); a call
                # that re-attaches keeps the first one's start.
                for group in (event.group, *event.more_groups):
                    if (group, event.job) not in self.holds:
                        self.waits.setdefault((group, event.job), t)
            case ev.SwitchDone():
                self._switch_done(event, t, effects)
        for effect in effects:
            self._effect(event, t, effect)

    def _switch_done(self, e: ev.SwitchDone, t: float, effects: Sequence[Effect]) -> None:
        p = self.pending.get(e.group)
        if p is None or p.token != e.token:
            return  # the table ignored it (it would not have been journaled)
        del self.pending[e.group]
        granted = next(
            (x for x in effects if isinstance(x, ev.Granted) and x.token == e.token), None
        )
        steps = tuple(Step(*s) for s in e.steps)
        snaps: dict[str, float] = {}
        for s in steps:
            if s.kind == SNAPSHOT:
                snaps[s.job] = max(snaps.get(s.job, 0.0), s.seconds)
        restores = [s.seconds for s in steps if s.kind == RESTORE]
        snapshot = max(snaps.values(), default=0.0)
        restore = max(restores, default=0.0)
        began = e.began - self.origin if e.began else p.decided
        start = min(p.decided, began)

        def within(seconds: float) -> float:
            # The agents' figures are whole milliseconds of their own clocks: where
            # they add up past the switch's end, what is drawn ends with the switch.
            return began + min(seconds, max(0.0, t - began))

        work = [(began, within(snapshot)), (within(snapshot), within(snapshot + restore))]
        index = len(self.switches)
        failed = granted is None
        error = e.error or ("the switch failed" if failed else "")
        self.switches.append(
            Switch(
                index=index,
                group=e.group,
                job=p.job,
                saved=ordered(snaps),
                start=start,
                end=t,
                snapshot=snapshot,
                restore=restore,
                overhead=uncovered(start, t, [w for w in work if w[1] > w[0]]),
                wait=None if granted is None else granted.waited,
                moved_bytes=e.moved_bytes,
                restored=e.restored,
                error=error,
                token=e.token,
                agents_began=began,
                steps=steps,
                moves=(
                    *((job, SNAPSHOT, seconds) for job, seconds in snaps.items()),
                    *(((p.job, RESTORE, restore),) if restores else ()),
                ),
            )
        )
        for job, seconds in snaps.items():
            self.seen(e.group, job)
            self.spans.append(Span(e.group, job, "snapshot", began, within(seconds), switch=index))
        if restores:
            self.spans.append(
                Span(
                    e.group,
                    p.job,
                    "restore",
                    within(snapshot),
                    within(snapshot + restore),
                    note=error,
                    switch=index,
                )
            )

    def _effect(self, event: Event, t: float, effect: Effect) -> None:
        match effect:
            case ev.Queued(group=group, job=job):
                self.seen(group, job)
                self.waits.setdefault((group, job), t)
            case ev.SwitchStarted(group=group, job=job, token=token):
                self.seen(group, job)
                self.pending[group] = _Pending(token, job, t)
            case ev.Granted(group=group, job=job, token=token):
                self._granted(event, t, effect)
            case ev.Yielded(group=group, job=job, token=token, again=False):
                self._end_hold(group, job, token, t, "")
            case ev.Revoked(group=group, job=job, token=token):
                reason = effect.why
                self._end_hold(group, job, token, t, f"revoked: {reason}")
                self._end_wait(group, job, t, reason)  # a grant that never became live
                p = self.pending.get(group)
                if p is not None and p.token == token and not isinstance(event, ev.SwitchDone):
                    del self.pending[group]
                    self.marks.append(
                        Mark(t, group, job, "abandoned", f"switch to {job} abandoned: {reason}")
                    )
                else:
                    self.marks.append(Mark(t, group, job, "revoked", f"{job} revoked: {reason}"))
            case ev.LeftQueue(group=group, job=job):
                self._end_wait(group, job, t, f"left the queue: {effect.why}")
            case ev.Quarantined(group=group, job=job, reason=reason):
                self.marks.append(
                    Mark(t, group, job, "quarantined", f"{job} quarantined: {reason}")
                )
            case ev.YieldRequested(group=group, job=job):
                self.marks.append(
                    Mark(t, group, job, "yield-requested", f"{job} asked to yield (hold limit)")
                )
            case ev.JobReset(group=group, job=job):
                self.marks.append(Mark(t, group, job, "reset", f"{job}'s quarantine lifted"))

    def _granted(self, event: Event, t: float, g: ev.Granted) -> None:
        if not g.must_deliver:
            return  # a holder asking again: nothing changes hands
        self.seen(g.group, g.job)
        held = self.holds.get((g.group, g.job))
        if held is not None and held[1] == g.token:
            return  # a grant made while its client was away, claimed now
        if held is not None:
            self._end_hold(g.group, g.job, held[1], t, "")
        # Its wait is what the table counted: from its Acquire to this grant, the
        # switch included (also when it never queued behind a holder).
        self.waits.pop((g.group, g.job), None)
        if g.waited > 0:
            self.spans.append(Span(g.group, g.job, "wait", t - g.waited, t))
        switch = None
        if isinstance(event, ev.SwitchDone) and self.switches:
            last = self.switches[-1]
            if last.group == g.group and last.token == g.token:
                switch = last.index
        self.holds[(g.group, g.job)] = (t, g.token, g.waited, switch)

    def _end_hold(self, group: str, job: str, token: int, t: float, note: str) -> None:
        held = self.holds.get((group, job))
        if held is None or held[1] != token:
            return
        del self.holds[(group, job)]
        start, _, waited, switch = held
        self.spans.append(
            Span(group, job, "hold", start, t, note=note, waited=waited, switch=switch)
        )

    def _end_wait(self, group: str, job: str, t: float, note: str) -> None:
        start = self.waits.pop((group, job), None)
        if start is not None:
            self.spans.append(Span(group, job, "wait", start, t, note=note))

    def finish(self) -> None:
        end = self.last
        for (group, job), (start, _, waited, switch) in self.holds.items():
            self.spans.append(
                Span(group, job, "hold", start, end, open=True, waited=waited, switch=switch)
            )
        for (group, job), start in self.waits.items():
            self.spans.append(Span(group, job, "wait", start, end, open=True))
        self.holds.clear()
        self.waits.clear()
        for group, p in self.pending.items():
            self.notes.append(
                f"the switch of {group} to {p.job} was still running when the record ends"
            )


def timeline_from_journal(
    rows: Sequence[JournalRow],
    *,
    label: str = "journal",
    source: str = "",
    snapshot_seq: int = 0,
    snapshot: dict[str, Any] | None = None,
) -> Timeline:
    """The timeline of a journal's events (`Journal.read()` rows, oldest first).

    A journal is read from its first event. When its first events are gone
    (compacted), give the newest snapshot (`Journal.load()`): the fold then starts
    from the table that snapshot holds, and the notes say what is missing.
    """
    rows = sorted(rows, key=lambda r: r[0])
    notes: list[str] = []
    table = LockTable()
    first = rows[0][0] if rows else snapshot_seq + 1
    from_snapshot = False
    if first > 1:
        if snapshot is not None and snapshot_seq >= first - 1:
            table = LockTable.from_dict(snapshot)
            from_snapshot = True
            skipped = sum(1 for seq, _, _ in rows if seq <= snapshot_seq)
            rows = [r for r in rows if r[0] > snapshot_seq]
            notes.append(
                f"the journal was compacted: its events before #{first} are gone, so the"
                f" replay starts from the table's snapshot at #{snapshot_seq}"
                + (f" ({skipped} event(s) up to it are not shown)" if skipped else "")
            )
        else:
            notes.append(
                f"the journal was compacted: its events before #{first} are gone and no"
                " snapshot covers them; events that no longer apply are skipped"
            )
    gaps = sum(1 for a, b in zip(rows, rows[1:], strict=False) if b[0] != a[0] + 1)
    if gaps:
        notes.append(f"the journal has {gaps} gap(s) in its event numbers")
    times = [event.now for _, _, event in rows]
    origin = min(times) if times else 0.0
    fold = _JournalFold(origin)
    if from_snapshot:
        fold.seed(table)
    refused: list[str] = []
    for seq, _ts, event in rows:
        try:
            effects = table.handle(event)
        except TimeSliceError as exc:
            refused.append(f"#{seq} {type(event).__name__}: {exc}")
            continue
        fold.event(event, effects)
    fold.finish()
    if refused:
        shown = "; ".join(refused[:5]) + ("; ..." if len(refused) > 5 else "")
        notes.append(f"{len(refused)} event(s) did not apply and were skipped: {shown}")
    spans = sorted(fold.spans, key=lambda s: (s.start, s.end))
    return Timeline(
        label=label,
        source=source,
        # Before 0 only where a wait began before the first event left (compaction).
        start=min([0.0, *(s.start for s in spans)]),
        end=fold.last,
        groups=tuple(fold.groups),
        jobs=tuple(fold.jobs),
        spans=tuple(spans),
        switches=tuple(fold.switches),
        marks=tuple(sorted(fold.marks, key=lambda m: m.time)),
        notes=tuple(notes + fold.notes),
        origin=origin if rows else None,
    )
