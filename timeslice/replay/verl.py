"""The event schema of the recorded veRL time-slicing runs, read and written.

A document is `{"source": ..., "runs": [run, ...]}`; each run's
`timeslice.events` is a list of lock events per `pool` (a group) and `job`,
with times `t` in seconds:

    acquired       the job holds the pool: wait_ms (its wait, restore included),
                   restore_ms, step
    yielded        it gave the pool back: ckpt_ms (its context's next save)
    checkpointing  its context is being saved; ckpt_done: saved, after ms
    restoring      its context is being restored; restore_done: restored, after ms

A swap (a switch) begins where a context starts to move on a pool that has no
swap under way, takes in every checkpoint and restore that starts on that pool
until a job acquires it, and ends when that job holds it and its moves are
done. Its control overhead is the part of it in which no context moved and the
next job was already waiting.

What this tree writes adds to that schema, and reads back: `switching` (the
orchestrator decided to switch the pool to `job`: where the swap starts, even
one that moves nothing), `switch_failed` (`error`: the swap ended without a
grant), `bytes` on `ckpt_done` and `restore_done`, `reason` on a `yielded` that
was a revocation. Readers of the plain schema can skip those.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from timeslice.replay.timeline import (
    RESTORE,
    SNAPSHOT,
    Span,
    SpanKind,
    Switch,
    Timeline,
    ordered,
    uncovered,
)

KINDS: Final = (
    "acquired",
    "yielded",
    "checkpointing",
    "ckpt_done",
    "restoring",
    "restore_done",
    "switching",
    "switch_failed",
)
# For events at the same time: the order in which they happen.
_SAME_TIME: Final = (
    "yielded",
    "switching",
    "checkpointing",
    "ckpt_done",
    "restoring",
    "restore_done",
    "acquired",
    "switch_failed",
)
_ORDER: Final = {kind: i for i, kind in enumerate(_SAME_TIME)}


class ScheduleError(ValueError):
    """The document is not in the recorded runs' schema."""


# --- import ---------------------------------------------------------------------------


@dataclass
class _Swap:
    pool: str
    start: float
    job: str = ""
    acquired_at: float | None = None
    wait: float | None = None
    restore_ms: float | None = None
    error: str = ""
    failed_at: float | None = None
    saved: list[str] = field(default_factory=list)
    snapshots: dict[str, tuple[float, float]] = field(default_factory=dict)
    restores: dict[str, tuple[float, float]] = field(default_factory=dict)
    snapshot_s: dict[str, float] = field(default_factory=dict)
    restore_s: dict[str, float] = field(default_factory=dict)
    moved: int | None = None

    def add_bytes(self, value: object) -> None:
        if isinstance(value, int | float) and not isinstance(value, bool):
            self.moved = (self.moved or 0) + int(value)

    @property
    def open(self) -> bool:
        return self.acquired_at is None and self.failed_at is None

    def end(self) -> float:
        ends = [b for _, b in [*self.snapshots.values(), *self.restores.values()]]
        ends += [t for t in (self.acquired_at, self.failed_at) if t is not None]
        return max([self.start, *ends])


def _number(event: dict[str, Any], key: str) -> float | None:
    value = event.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def timeline_from_run(run: dict[str, Any], *, source: str = "", index: int = 0) -> Timeline:
    """The timeline of one recorded run (its `timeslice` part)."""
    if not isinstance(run, dict):
        raise ScheduleError(f"run {index} is not an object")
    part = run.get("timeslice")
    events = part.get("events") if isinstance(part, dict) else None
    if not isinstance(events, list):
        raise ScheduleError(f"run {index} has no timeslice.events list")
    notes: list[str] = []
    unknown: dict[str, int] = {}
    spans: list[Span] = []
    swaps: list[_Swap] = []
    open_swap: dict[str, _Swap] = {}
    moving: dict[tuple[str, str, SpanKind], tuple[_Swap, float]] = {}  # (pool, job, kind)
    holds: dict[str, tuple[str, float, float | None, _Swap | None]] = {}
    # each hold, with the swap that granted it; each move, with the swap it was part of
    linked: list[tuple[Span, _Swap | None]] = []
    pools: list[str] = []
    jobs: list[str] = []
    times: list[float] = []

    def close_hold(pool: str, t: float, note: str = "", is_open: bool = False) -> None:
        job, start, waited, swap = holds.pop(pool)
        linked.append((Span(pool, job, "hold", start, t, is_open, note, waited), swap))

    def swap_for(pool: str, t: float) -> _Swap:
        swap = open_swap.get(pool)
        if swap is None:
            swap = _Swap(pool, t)
            swaps.append(swap)
            open_swap[pool] = swap
        return swap

    indexed = sorted(enumerate(events), key=lambda ie: _sort_key(ie[1], ie[0]))
    for i, e in indexed:
        if not isinstance(e, dict):
            raise ScheduleError(f"run {index}: event {i} is not an object")
        kind, job, pool, t = e.get("kind"), e.get("job"), e.get("pool"), _number(e, "t")
        if not (isinstance(kind, str) and isinstance(job, str) and isinstance(pool, str)):
            raise ScheduleError(f"run {index}: event {i} lacks kind, job or pool: {e!r}")
        if t is None:
            raise ScheduleError(f"run {index}: event {i} has no time t: {e!r}")
        if kind not in KINDS:
            unknown[kind] = unknown.get(kind, 0) + 1
            continue
        times.append(t)
        if pool not in pools:
            pools.append(pool)
        if job and job not in jobs:
            jobs.append(job)
        if kind == "switching":
            open_swap.pop(pool, None)  # one never acquired stays as it is
            swap_for(pool, t)
        elif kind in ("checkpointing", "restoring"):
            swap = swap_for(pool, t)
            what: SpanKind = "snapshot" if kind == "checkpointing" else "restore"
            if what == SNAPSHOT and job not in swap.saved:
                swap.saved.append(job)
            moving[(pool, job, what)] = (swap, t)
        elif kind in ("ckpt_done", "restore_done"):
            what = "snapshot" if kind == "ckpt_done" else "restore"
            ms = _number(e, "ms")
            found = moving.pop((pool, job, what), None)
            if found is None:
                notes.append(f"{kind} of {job} on {pool} at t={t:g} without its start")
                swap, began = swap_for(pool, t), t - (ms or 0.0) / 1000
            else:
                swap, began = found
            seconds = ms / 1000 if ms is not None else t - began
            (swap.snapshots if what == SNAPSHOT else swap.restores)[job] = (began, t)
            (swap.snapshot_s if what == SNAPSHOT else swap.restore_s)[job] = seconds
            swap.add_bytes(e.get("bytes"))
            linked.append((Span(pool, job, what, began, t), swap))
        elif kind == "acquired":
            if pool in holds:
                close_hold(pool, t, "no yield recorded")
            wait_ms = _number(e, "wait_ms")
            waited = wait_ms / 1000 if wait_ms is not None else None
            granting = open_swap.pop(pool, None)
            if granting is not None:
                granting.job, granting.acquired_at, granting.wait = job, t, waited
                granting.restore_ms = _number(e, "restore_ms")
            if waited:  # from its request to this grant, its switch included
                spans.append(Span(pool, job, "wait", t - waited, t))
            holds[pool] = (job, t, waited, granting)
        elif kind == "yielded":
            if pool in holds and holds[pool][0] == job:
                close_hold(pool, t, str(e.get("reason", "")))
        elif kind == "switch_failed":
            swap = swap_for(pool, t)
            del open_swap[pool]
            swap.job = swap.job or job
            swap.error = str(e.get("error") or "the switch failed")
            swap.failed_at = t
    duration = _number(part, "duration_s") if isinstance(part, dict) else None
    # From t = 0 or earlier: the first events, or a wait that began before them.
    start = min([0.0, *times, *(s.start for s in spans)])
    end = max([*times, duration or 0.0, start])
    for pool in list(holds):
        close_hold(pool, end, is_open=True)
    for (pool, job, what), (swap, began) in moving.items():
        notes.append(f"the {what} of {job} on {pool} from t={began:g} has no end recorded")
        linked.append((Span(pool, job, what, began, end, open=True), swap))
    if unknown:
        kinds = ", ".join(f"{k or '?'} ({n})" for k, n in sorted(unknown.items()))
        notes.append(f"events of unknown kinds were skipped: {kinds}")

    switches: list[Switch] = []
    number: dict[int, int] = {}
    for swap in sorted(swaps, key=lambda s: s.start):
        number[id(swap)] = len(switches)
        switches.append(_switch(swap, len(switches)))
    unfinished = [s for s in swaps if s.open and not s.job]
    if unfinished:
        notes.append(f"{len(unfinished)} swap(s) saw no job acquire the pool afterwards")
    spans += [
        replace(span, switch=number[id(swap)] if swap is not None else None)
        for span, swap in linked
    ]
    labels = run.get("jobs") if isinstance(run.get("jobs"), dict) else {}
    job_names = {
        j: str(v.get("short") or v.get("full") or j)
        for j, v in (labels or {}).items()
        if isinstance(v, dict) and j in jobs
    }
    meta_in = run.get("meta") if isinstance(run.get("meta"), dict) else {}
    meta = {str(k): str(v) for k, v in (meta_in or {}).items() if isinstance(v, str | int | float)}
    label = run.get("label")
    return Timeline(
        label=str(label) if label else f"run {index + 1}",
        source=source,
        start=start,
        end=end,
        groups=tuple(pools),
        jobs=tuple(jobs),
        spans=tuple(sorted(spans, key=lambda s: (s.start, s.end))),
        switches=tuple(switches),
        notes=tuple(notes),
        origin=_number(meta_in or {}, "origin"),
        meta=meta,
        job_names=job_names,
    )


def _switch(swap: _Swap, index: int) -> Switch:
    snapshot = max(swap.snapshot_s.values(), default=0.0)
    restore = swap.restore_s.get(swap.job)
    if restore is None:
        restore = max(swap.restore_s.values(), default=(swap.restore_ms or 0.0) / 1000)
    end = swap.end()
    moved = [*swap.snapshots.values(), *swap.restores.values()]
    idle = (swap.start, swap.start)
    if swap.acquired_at is not None and swap.wait is not None:
        # Before the next job asked, the pool was idle, not switching.
        idle = (swap.start, min(end, swap.acquired_at - swap.wait))
    restored = bool(swap.restores) or bool(swap.restore_ms)
    return Switch(
        index=index,
        group=swap.pool,
        job=swap.job,
        saved=ordered(swap.saved),
        start=swap.start,
        end=end,
        snapshot=snapshot,
        restore=restore,
        overhead=uncovered(swap.start, end, [*moved, idle]),
        wait=swap.wait if not swap.error else None,
        moved_bytes=swap.moved,
        restored=restored and not swap.error,
        error=swap.error,
        moves=(
            *((job, SNAPSHOT, seconds) for job, seconds in swap.snapshot_s.items()),
            *((job, RESTORE, seconds) for job, seconds in swap.restore_s.items()),
        ),
        idle=uncovered(*idle, moved),  # of the idle stretch, what no move overlaps
    )


def _sort_key(event: Any, i: int) -> tuple[float, int]:
    t = _number(event, "t") if isinstance(event, dict) else None
    return (t if t is not None else float("inf"), i)


def timelines_from_document(doc: Any, *, source: str = "") -> list[Timeline]:
    """Every run of a recorded-runs document."""
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list):
        raise ScheduleError('expected an object with a "runs" list')
    return [timeline_from_run(run, source=source, index=i) for i, run in enumerate(doc["runs"])]


def load_runs(path: Path) -> list[Timeline]:
    """The runs of the document at `path`. Raises `ScheduleError` (or `OSError`)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ScheduleError(f"{path} is not JSON: {exc}") from None
    try:
        return timelines_from_document(doc, source=str(path))
    except ScheduleError as exc:
        raise ScheduleError(f"{path}: {exc}") from None


# --- export ---------------------------------------------------------------------------


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _t(seconds: float) -> float:
    return round(seconds, 6)


def events_from_timeline(tl: Timeline) -> list[dict[str, Any]]:
    """`tl` as the schema's events, oldest first."""
    out: list[tuple[float, int, int, dict[str, Any]]] = []

    def add(t: float, kind: str, job: str, pool: str, **fields: Any) -> None:
        event = {"t": _t(t), "kind": kind, "job": job, "pool": pool, **fields}
        out.append((_t(t), _ORDER[kind], len(out), event))

    moved_bytes: dict[tuple[int, str, str], int] = {}  # (switch, job, kind), all nodes
    for s in tl.switches:
        for step in s.steps:
            key = (s.index, step.job, step.kind)
            moved_bytes[key] = moved_bytes.get(key, 0) + step.bytes
    for s in tl.switches:
        add(s.start, "switching", s.job, s.group)
        if not s.ok:
            add(s.end, "switch_failed", s.job, s.group, error=s.error)
    for sp in tl.spans:
        if sp.kind not in (SNAPSHOT, RESTORE) or sp.open:
            continue
        switch = tl.switches[sp.switch] if sp.switch is not None else None
        extra: dict[str, Any] = {}
        if switch is not None and switch.steps:
            extra["bytes"] = moved_bytes.get((switch.index, sp.job, sp.kind), 0)
        begin, done = (
            ("checkpointing", "ckpt_done") if sp.kind == SNAPSHOT else ("restoring", "restore_done")
        )
        add(sp.start, begin, sp.job, sp.group)
        add(sp.end, done, sp.job, sp.group, ms=_ms(_recorded(tl, sp)), **extra)
    saves: dict[tuple[str, str], list[Span]] = {}
    for sp in sorted(tl.spans_of(SNAPSHOT), key=lambda sp: sp.start):
        saves.setdefault((sp.group, sp.job), []).append(sp)
    holds: dict[tuple[str, str], list[Span]] = {}
    for sp in sorted(tl.spans_of("hold"), key=lambda sp: sp.start):
        holds.setdefault((sp.group, sp.job), []).append(sp)
    for pair, turns in holds.items():
        after = saves.get(pair, [])
        starts = [sp.start for sp in after]
        for turn, sp in enumerate(turns):  # a job's holds of a pool so far: its "step"
            switch = tl.switches[sp.switch] if sp.switch is not None else None
            restore = switch.restore if switch is not None and switch.restored else 0.0
            add(
                sp.start,
                "acquired",
                sp.job,
                sp.group,
                wait_ms=_ms(sp.waited or 0.0),
                restore_ms=_ms(restore),
                step=turn,
            )
            if sp.open:
                continue
            extra = {"reason": sp.note} if sp.note else {}
            # The save of its context after it, if one came before its next hold.
            until = turns[turn + 1].start if turn + 1 < len(turns) else float("inf")
            i = bisect_left(starts, sp.end)
            if i < len(after) and after[i].start < until:
                extra["ckpt_ms"] = _ms(_recorded(tl, after[i]))
            add(sp.end, "yielded", sp.job, sp.group, **extra)
    out.sort(key=lambda x: (x[0], x[1], x[2]))
    return [event for *_, event in out]


def _recorded(tl: Timeline, move: Span) -> float:
    """How long a snapshot or restore took, as recorded (its span is drawn from
    times that may be rounded)."""
    switch = tl.switches[move.switch] if move.switch is not None else None
    seconds = switch.move(move.job, move.kind) if switch is not None else None
    return seconds if seconds is not None else move.end - move.start


def run_from_timeline(tl: Timeline) -> dict[str, Any]:
    """One run of the schema."""
    summary = tl.summary()

    def ms(value: float | None) -> float | None:
        return None if value is None else _ms(value)

    meta: dict[str, Any] = {"framework": "timeslice", **tl.meta, "source": tl.source}
    if tl.origin is not None:
        meta["origin"] = tl.origin
    return {
        "label": tl.label,
        "mode": "timeslice",
        "meta": meta,
        "jobs": {
            j: {"short": tl.job_names.get(j, j), "full": tl.job_names.get(j, j)} for j in tl.jobs
        },
        "timeslice": {
            "duration_s": _t(max(tl.end, 0.0)),  # from t = 0, as recorded
            "events": events_from_timeline(tl),
        },
        "summary": {
            "swaps": summary["switches"],
            "failed_swaps": summary["failed"],
            "med_ckpt_ms": ms(summary["median_snapshot"]),
            "med_restore_ms": ms(summary["median_restore"]),
            "moved_bytes": summary["moved_bytes"],
        },
    }


def export_document(timelines: Sequence[Timeline]) -> dict[str, Any]:
    """A recorded-runs document holding `timelines`."""
    return {
        "source": "timeslice replay export",
        "runs": [run_from_timeline(tl) for tl in timelines],
    }
