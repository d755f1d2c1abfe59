"""A journal folded into a timeline (pure: no I/O, no clock).

`timeline_from_journal` interprets the Orchestrator's journal the way a restart
does: it folds the events through the pure `LockTable.handle` and reads the
effects each one produced (`Granted`, `Queued`, `Yielded`, `Revoked`,
`LeftQueue`, `SwitchStarted`...), so the replay shows what the code that made
the decisions decided, not a second reading of the events. Times are seconds
from the first event's wall clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from timeslice.errors import TimeSliceError
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.events import Effect, Event
from timeslice.orchestrator.state import LockTable
from timeslice.replay.timeline import (
    RESTORE,
    SNAPSHOT,
    Mark,
    Span,
    Step,
    Switch,
    Timeline,
    ordered,
    uncovered,
)

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
