"""The checker of one run: the orchestrator's journal beside the jobs' hold logs.

The journal is folded through the same `LockTable.handle` a restart uses; the
grants, their ends and the switches are read from the effects each event
produced, so the checker sees what the orchestrator decided. The jobs' logs say
what each job did with its grants. A violation is anything that must never
happen whatever the faults:

- a fencing token granted twice (to two jobs, or again after its grant ended),
  or a new grant whose token is not above every earlier one;
- a journal event the table refuses when folded, or an invariant broken after one;
- a hold with a token the journal never granted to that job, or that began
  before its grant was journaled; two holds with one token;
- a confirmed hold (its release accepted) whose grant the journal ends otherwise
  than by its yield, that ends after that yield, or that overlaps another
  confirmed hold; a release refused although the journal holds its yield;
- a corrupt context (bytes other than the job last wrote), or a context out of
  memory during a confirmed hold;
- a job that crashed, or a live job without a confirmed hold in the calm period
  after the last fault;
- a journal that does not load again, or whose fold from its newest snapshot
  differs from the fold from its first event.

A hold that was not confirmed (its grant revoked: the job was frozen past its
lease, or lost it while the orchestrator was down) may overlap the holds after
it. How long such a stale holder went on working after its revocation is
measured (`stale_steps`, `stale_seconds`), not forbidden: a holder frozen
between two checks cannot know, and what keeps it from harm is that its
context is moved out and its release refused.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from timeslice.orchestrator import events as ev
from timeslice.orchestrator.events import Event
from timeslice.orchestrator.journal import open_journal
from timeslice.orchestrator.state import LockTable

# Every time compared is one machine's time.time(): the job reads it after its
# grant was journaled, and before its Yield is sent. This is float slack only.
EPS: Final = 1e-3
# Release errors that say the grant is not the job's any more.
REFUSED: Final = ("LeaseLostError", "ConflictError", "NotHolderError", "NotFoundError")


@dataclass
class Grant:
    """One fencing token of a group, as the journal decided it."""

    group: str
    token: int
    job: str
    decided: float  # the grant (or the switch before it) was decided
    granted: float | None = None  # announced to the job (after its switch)
    ended: float | None = None
    end: str = ""  # "yield", "revoked: REASON", or "" while it lasts


@dataclass
class Fold:
    """What folding a journal found."""

    table: LockTable
    grants: dict[tuple[str, int], Grant] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    recovered: list[float] = field(default_factory=list)  # when each epoch began


@dataclass
class Evidence:
    """Where one run left its evidence, and what the campaign knows of it."""

    journal_url: str
    job_logs: dict[str, Path]
    # When the last fault was over, and the jobs that should have held since.
    calm_start: float
    live_jobs: tuple[str, ...]
    # How many epochs the journal may hold, at least and at most (one per start of
    # a lone orchestrator; with standbys, one per takeover).
    epochs: tuple[int, int]


@dataclass
class Report:
    violations: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    stale_seconds: float = 0.0  # the longest a revoked holder worked after its revocation
    recovered: list[float] = field(default_factory=list)  # when each epoch began
    grants: list[float] = field(default_factory=list)  # when each grant was announced


def fold(rows: Iterable[tuple[int, float, Event]], table: LockTable | None = None) -> Fold:
    """Fold journal rows through the lock table, reading grants from the effects."""
    result = Fold(table or LockTable())
    # A fold from a snapshot starts with the grants the snapshot holds.
    newest = {name: g.token for name, g in result.table.groups.items()}
    for name, g in result.table.groups.items():
        if (h := g.holder) is not None:
            granted = None if h.switching else h.granted_at
            result.grants[(name, h.token)] = Grant(name, h.token, h.job, h.granted_at, granted)
    for seq, _, event in rows:
        try:
            effects = result.table.handle(event)
            result.table.validate()
        except Exception as exc:  # a journaled event must fold as it was applied
            result.violations.append(f"journal event {seq} ({type(event).__name__}): {exc!r}")
            continue
        if isinstance(event, ev.Recover):
            result.recovered.append(event.now)
        for effect in effects:
            _read_effect(result, newest, seq, event.now, effect)
    return result


def _read_effect(
    result: Fold, newest: dict[str, int], seq: int, now: float, effect: ev.Effect
) -> None:
    match effect:
        case ev.SwitchStarted(group=group, job=job, token=token):
            _decide(result, newest, seq, group, token, job, now)
            result.counts["switches"] += 1
        case ev.Granted(group=group, job=job, token=token):
            grant = _decide(result, newest, seq, group, token, job, now)
            if grant.granted is None:
                grant.granted = now
        case ev.Yielded(group=group, token=token, again=False):
            _end(result, seq, group, token, now, "yield")
        case ev.Revoked(group=group, token=token, reason=reason):
            _end(result, seq, group, token, now, f"revoked: {reason}")
            result.counts[f"revoked: {_short(reason)}"] += 1
        case ev.Quarantined(reason=reason):
            result.counts[f"quarantined: {_short(reason)}"] += 1
        case ev.JobReset():
            result.counts["jobs reset"] += 1
        case _:
            pass


def _decide(
    result: Fold, newest: dict[str, int], seq: int, group: str, token: int, job: str, now: float
) -> Grant:
    grant = result.grants.get((group, token))
    if grant is None:
        if token <= newest.get(group, 0):
            result.violations.append(
                f"event {seq}: new grant of {group} to {job} with token {token},"
                f" not above {newest[group]}"
            )
        newest[group] = max(newest.get(group, 0), token)
        grant = result.grants[(group, token)] = Grant(group, token, job, now)
        return grant
    if grant.job != job:
        result.violations.append(
            f"event {seq}: token {token} of {group} granted to {job}, already {grant.job}'s"
        )
    elif grant.end:
        result.violations.append(
            f"event {seq}: token {token} of {group} granted to {job} again after its {grant.end}"
        )
    return grant


def _end(result: Fold, seq: int, group: str, token: int, now: float, how: str) -> None:
    grant = result.grants.get((group, token))
    if grant is None:
        result.violations.append(f"event {seq}: token {token} of {group} ended, never granted")
    elif grant.end:
        result.violations.append(f"event {seq}: token {token} of {group} ended twice")
    else:
        grant.ended, grant.end = now, how


def _short(reason: str) -> str:
    """A reason without its particulars (node addresses, timings), for counting."""
    return reason.split(":")[0].split(" (")[0].strip()


def projection(table: LockTable) -> dict[str, Any]:
    """What two folds of one journal must agree on: not lease expiries, which
    unjournaled renewals move in the live table and so in its snapshots."""
    groups = {
        name: {
            "token": g.token,
            "holder": (g.holder.job, g.holder.token, g.holder.switching) if g.holder else None,
            "queue": list(g.queue),
            "active": g.active_job,
            "loaded": g.loaded_job,
            "quarantined": sorted(g.quarantined),
        }
        for name, g in table.groups.items()
    }
    return {"epoch": table.epoch, "groups": groups, "nodes": dict(table.nodes)}


def read_log(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The records of a job's log, and how many lines could not be read (a line
    cut short by a SIGKILL)."""
    records, torn = [], 0
    if not path.exists():
        return [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            torn += 1
    return records, torn


def check_holds(
    grants: dict[tuple[str, int], Grant],
    group: str,
    records: list[dict[str, Any]],
    calm_start: float,
    live_jobs: Iterable[str],
) -> Report:
    """The jobs' records against the journal's grants."""
    report = Report()
    holds = [r for r in records if r["kind"] == "hold"]
    for record in records:
        if record["kind"] in ("acquire_error", "lease_lost"):
            report.counts[record["kind"]] += 1
        elif record["kind"] == "crash":
            report.violations.append(
                f"{record['job']} (pid {record['pid']}) crashed: {record['error']}"
            )
    for hold in holds:
        _check_hold(report, grants, group, hold)
    # Each hold follows an Acquire of its own: one token, one hold.
    for token, times in Counter(h["token"] for h in holds).items():
        if times > 1:
            report.violations.append(f"token {token} of {group} held {times} times")
    confirmed = sorted((h for h in holds if h["confirmed"]), key=lambda h: h["start"])
    report.counts["holds confirmed"] = len(confirmed)
    report.counts["holds not confirmed"] = len(holds) - len(confirmed)
    latest: dict[str, Any] | None = None
    for hold in confirmed:
        if latest is not None and hold["start"] < latest["end"] - EPS:
            report.violations.append(
                f"confirmed holds overlap: {_name(latest)} until {latest['end']:.3f},"
                f" {_name(hold)} from {hold['start']:.3f}"
            )
        if latest is None or hold["end"] > latest["end"]:
            latest = hold
    for job in live_jobs:
        if not any(h["job"] == job and h["start"] >= calm_start for h in confirmed):
            report.violations.append(f"{job} made no confirmed hold after the last fault")
    return report


def _check_hold(
    report: Report, grants: dict[tuple[str, int], Grant], group: str, hold: dict[str, Any]
) -> None:
    name = _name(hold)
    for check in ("found", "after"):
        if hold[check] == "corrupt":
            report.violations.append(f"{name}: corrupt context ({check} in the hold)")
    saved = "saved" in (hold["found"], hold["wrote"], hold["after"])
    grant = grants.get((group, hold["token"]))
    if grant is None or grant.job != hold["job"]:
        owner = f"granted to {grant.job}" if grant else "never granted"
        report.violations.append(f"{name}: the journal has that token {owner}")
        return
    if grant.granted is None or hold["start"] < grant.granted - EPS:
        report.violations.append(f"{name}: began before its grant was journaled")
    refused = hold["release_error"].startswith(REFUSED)
    if hold["confirmed"]:
        if saved:
            report.violations.append(f"{name}: its context was out of memory while it held")
        if grant.end != "yield":
            why = grant.end or "never ended"
            report.violations.append(f"{name}: release accepted, but the journal says {why}")
        elif grant.ended is not None and hold["end"] > grant.ended + EPS:
            report.violations.append(f"{name}: held past its journaled yield")
    elif refused and grant.end == "yield":
        report.violations.append(
            f"{name}: release refused ({hold['release_error']}), the journal holds its yield"
        )
    elif saved:
        report.counts["stale holder found its context saved"] += 1
    if not hold["confirmed"] and grant.ended is not None and grant.end != "yield":
        late = [s - grant.ended for s in hold["steps"] if s > grant.ended]
        report.counts["stale steps"] += len(late)
        report.stale_seconds = max([report.stale_seconds, *late])


def _name(hold: dict[str, Any]) -> str:
    return f"{hold['job']} token {hold['token']} (pid {hold['pid']}, round {hold['round']})"


async def check_run(evidence: Evidence, group: str) -> Report:
    """Every check of one run, after its servers have stopped."""
    journal = open_journal(evidence.journal_url)
    await journal.open()
    try:
        rows = await journal.read()
        loaded = await journal.load()
    finally:
        await journal.close()
    folded = fold(rows)
    # The journal reopens as a restart would read it: its newest snapshot, then the rest.
    base = LockTable.from_dict(loaded.snapshot) if loaded.snapshot is not None else None
    reopened = fold(((seq, 0.0, e) for seq, e in loaded.tail), base)
    records: list[dict[str, Any]] = []
    torn = 0
    for path in evidence.job_logs.values():
        found, cut = read_log(path)
        records += found
        torn += cut
    report = check_holds(folded.grants, group, records, evidence.calm_start, evidence.live_jobs)
    report.violations[:0] = folded.violations
    report.violations += [f"reopened: {v}" for v in reopened.violations]
    if projection(reopened.table) != projection(folded.table):
        report.violations.append(
            "the journal's fold from its snapshot differs from its fold from the start:"
            f" {projection(reopened.table)} != {projection(folded.table)}"
        )
    least, most = evidence.epochs
    if not least <= folded.table.epoch <= most:
        expected = f"{least}" if least == most else f"{least} to {most}"
        report.violations.append(
            f"the journal has {folded.table.epoch} epochs; {expected} were expected"
            " (one per start of a lone orchestrator, one per takeover with standbys)"
        )
    report.recovered = folded.recovered
    report.grants = [g.granted for g in folded.grants.values() if g.granted is not None]
    report.counts.update(folded.counts)
    report.counts["grants"] = len(folded.grants)
    report.counts["events"] = len(rows)
    report.counts["reopened from a snapshot"] = int(loaded.snapshot is not None)
    report.counts["torn log lines"] = torn
    return report
