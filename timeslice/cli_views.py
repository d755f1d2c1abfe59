"""What the operator commands print: each answer as a JSON document with stable
keys (`--json`) or as lines of text, and what `timeslice inspect` finds wrong.

Pure: values in, dicts and strings out; the commands in `cli_ops.py` do the I/O.
The JSON keys are documented in the README (Watching and checking a cluster); a key, once
there, keeps its name and meaning. Absent values are null, never missing keys.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from enum import StrEnum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from timeslice.errors import TimeSliceError, UnimplementedError

if TYPE_CHECKING:
    from timeslice.client.agent_types import StatusResponse
    from timeslice.client.types import (
        AgentList,
        GroupStatus,
        KnownAgent,
        Leadership,
        OrchestratorGroupStatus,
        WatchEvent,
    )

Json = dict[str, Any]


def dumps(document: Json) -> str:
    """One JSON document on one line, keys in the order written."""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"))


def _time(value: datetime.datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _or_none(value: str) -> str | None:
    return value or None


# --- status ----------------------------------------------------------------------------


def group_json(g: GroupStatus) -> Json:
    """One group's lock as `status --json` and `watch --json` show it."""
    return {
        "group": g.group_id,
        "state": g.group_state.value,
        "since": _time(g.state_timestamp),
        "holder": _or_none(g.locking_job),
        "active": _or_none(g.active_job),
        "loaded": _or_none(g.loaded_job),
        "queue": list(g.waiting_jobs),
        "queue_depth": g.waiter_queue_depth,
        "fencing_token": g.fencing_token,
        "epoch": g.epoch,
        "nodes": list(g.nodes),
        "quarantined": dict(g.quarantined_jobs),
    }


def status_json(
    answers: list[OrchestratorGroupStatus],
    standings: Sequence[tuple[str, Leadership | TimeSliceError]] = (),
) -> Json:
    """`timeslice status --json`: where each orchestrator of the target stands, then
    every group asked for, with its contexts on the nodes."""
    groups = []
    for answer in answers:
        contexts = [
            {"node": s.agent, "job": s.job_id, "state": s.job_state.value}
            for s in answer.agent_job_states
        ]
        groups.append({**group_json(answer.group), "contexts": contexts})
    orchestrators = [leadership_json(address, s) for address, s in standings]
    return {"orchestrators": orchestrators, "groups": groups}


def leadership_json(address: str, standing: Leadership | TimeSliceError) -> Json:
    """Where one orchestrator stands, as `status --json` shows it (`error`: why it
    did not say; the rest is then null)."""
    if isinstance(standing, TimeSliceError):
        unsaid = dict.fromkeys(("role", "lease_epoch", "lease_seconds", "lease_left_seconds",
                                "holder", "active_address", "table_epoch", "version"))  # fmt: skip
        return {"address": address, **unsaid, "error": _failure(standing)}
    return {
        "address": address,
        "role": standing.role,
        "lease_epoch": standing.lease_epoch,
        "lease_seconds": standing.lease_sec,
        "lease_left_seconds": standing.lease_left_sec,
        "holder": _or_none(standing.holder),
        "active_address": _or_none(standing.active_address),
        "table_epoch": standing.table_epoch,
        "version": standing.version,
        "error": None,
    }


def leadership_line(address: str, standing: Leadership | TimeSliceError) -> str:
    """One line: where the orchestrator at `address` stands."""
    if isinstance(standing, TimeSliceError):
        return f"orchestrator {address}: no answer ({_failure(standing)})"
    if not standing.lease_sec:
        return (
            f"orchestrator {address}: {standing.role}, the only writer of its journal"
            f" (table epoch {standing.table_epoch})"
        )
    where = ""
    if standing.role != "active" and standing.active_address:
        where = f", the active is {standing.active_address}"
    by = f" held by {standing.holder}" if standing.role != "active" and standing.holder else ""
    return (
        f"orchestrator {address}: {standing.role} (lease epoch {standing.lease_epoch}{by},"
        f" {standing.lease_left_sec:.1f} s of {standing.lease_sec:g} s left{where};"
        f" table epoch {standing.table_epoch})"
    )


def _failure(error: TimeSliceError) -> str:
    if isinstance(error, UnimplementedError):
        return "too old to say"
    return f"{error.message} ({error.code.name})"


# --- watch -----------------------------------------------------------------------------


def event_json(event: WatchEvent) -> Json:
    """One event of `timeslice watch --json` (one line each)."""
    return {
        "kind": event.kind.value,
        "group": event.group_id,
        "job": _or_none(event.job_id),
        "time": _time(event.time),
        "fencing_token": event.fencing_token,
        "reason": _or_none(event.reason),
        "context_restored": event.context_restored,
        "switch_bytes": event.switch_bytes,
        "status": group_json(event.status) if event.status is not None else None,
    }


def event_line(event: WatchEvent) -> str:
    """One event of `timeslice watch`, as a line of text."""
    parts = [_time(event.time) or "-", event.group_id, event.kind.value]
    if event.job_id:
        parts.append(event.job_id)
    if event.fencing_token:
        parts.append(f"token={event.fencing_token}")
    if event.reason:
        parts.append(f"reason={event.reason!r}")
    if event.kind.value == "GRANTED":
        parts.append("restored" if event.context_restored else "not-restored")
        if event.switch_bytes:
            parts.append(f"moved={_bytes(event.switch_bytes)}")
    if (g := event.status) is not None:
        parts.append(f"-> {g.group_state.value} holder={g.locking_job or '-'}")
        parts.append(f"queue[{g.waiter_queue_depth}]")
    return " ".join(parts)


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


# --- agent status ----------------------------------------------------------------------


def agent_status_json(target: str, answer: StatusResponse) -> Json:
    """`timeslice agent status --json`: one agent's node, version, jobs and memory."""
    return {
        "target": target,
        "node": answer.node_name,
        "version": _or_none(answer.version),
        "jobs": [
            {
                "job": j.job_id,
                "group": _or_none(j.group),
                "state": j.state.removeprefix("JOB_STATE_"),
                "backend": _or_none(j.backend),
                "liveness": j.liveness,
                "store": _or_none(j.store),
                "fault": _or_none(j.fault),
                "operation": _or_none(j.operation_id),
            }
            for j in answer.job_statuses
        ],
        "accelerators": [
            {
                "id": a.id,
                "memory_used_bytes": a.memory_used_bytes,
                "memory_total_bytes": a.memory_total_bytes,
            }
            for a in answer.accelerator_statuses
        ],
    }


def agent_status_lines(target: str, answer: StatusResponse) -> list[str]:
    """`timeslice agent status` as lines of text."""
    version = answer.version or "unknown version"
    lines = [f"agent {answer.node_name or '?'} at {target} ({version})"]
    if not answer.job_statuses:
        lines.append("  no jobs")
    for j in answer.job_statuses:
        where = f"{j.group}/{j.job_id}" if j.group else j.job_id
        line = (
            f"  job {where}: {j.state.removeprefix('JOB_STATE_')}"
            f"  backend={j.backend or '-'}  liveness={j.liveness}"
        )
        if j.store:
            line += f"  store={j.store}"
        if j.fault:
            line += f"  fault: {j.fault}"
        lines.append(line)
    for a in answer.accelerator_statuses:
        lines.append(
            f"  accelerator {a.id}: {_bytes(a.memory_used_bytes)} of"
            f" {_bytes(a.memory_total_bytes)} used"
        )
    return lines


# --- inspect ---------------------------------------------------------------------------


class ProblemKind(StrEnum):
    """What `timeslice inspect` can find wrong."""

    NO_AGENT = "no_agent"
    UNREACHABLE = "unreachable"
    VERSION_MISMATCH = "version_mismatch"


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One thing wrong, in words, with what to do about it."""

    kind: ProblemKind
    node: str
    groups: tuple[str, ...]
    message: str


def problems(found: AgentList, target: str) -> list[Problem]:
    """What is wrong with the agents the orchestrator at `target` knows: a group's
    node with no agent, an agent of a group that does not answer, and an agent whose
    version is not the orchestrator's."""
    out: list[Problem] = []
    for a in found.agents:
        groups = ", ".join(a.groups)
        if not a.address:
            out.append(
                Problem(
                    kind=ProblemKind.NO_AGENT,
                    node=a.node,
                    groups=a.groups,
                    message=f"node {a.node} of group(s) {groups} has no agent: run `timeslice"
                    f" serve agent --node-name {a.node} --orchestrator {target}` on it, or"
                    " take it out of the group with `timeslice group-nodes`",
                )
            )
        elif not a.reachable:
            if a.groups:  # an agent of no group holds nothing up
                out.append(
                    Problem(
                        kind=ProblemKind.UNREACHABLE,
                        node=a.node,
                        groups=a.groups,
                        message=f"the agent of node {a.node} (group(s) {groups}) at {a.address}"
                        f" does not answer the orchestrator ({a.error or 'no reason given'}):"
                        " is it running, and can the orchestrator reach that address?",
                    )
                )
        elif a.version != found.version:
            theirs = a.version or "a version too old to say"
            out.append(
                Problem(
                    kind=ProblemKind.VERSION_MISMATCH,
                    node=a.node,
                    groups=a.groups,
                    message=f"the agent of node {a.node} runs {theirs}, the orchestrator"
                    f" {found.version}: run the same timeslice version on both",
                )
            )
    return out


def _agent_json(a: KnownAgent) -> Json:
    return {
        "node": a.node,
        "address": _or_none(a.address),
        "in_session": a.in_session,
        "groups": list(a.groups),
        "reachable": a.reachable,
        "version": _or_none(a.version),
        "error": _or_none(a.error),
    }


def inspect_json(target: str, found: AgentList, wrong: list[Problem]) -> Json:
    """`timeslice inspect --json`."""
    return {
        "target": target,
        "orchestrator_version": found.version,
        "agents": [_agent_json(a) for a in found.agents],
        "problems": [
            {"kind": p.kind.value, "node": p.node, "groups": list(p.groups), "message": p.message}
            for p in wrong
        ],
        "ok": not wrong,
    }


def inspect_lines(target: str, found: AgentList, wrong: list[Problem]) -> list[str]:
    """`timeslice inspect` as lines of text: the agents, then one line per problem."""
    lines = [f"orchestrator at {target}: version {found.version}"]
    if not found.agents:
        lines.append("no agents known")
    for a in found.agents:
        answer = f"answers, {a.version or 'version unknown'}" if a.reachable else "does not answer"
        if not a.address:
            answer = "no agent"
        session = "in session" if a.in_session else "no session"
        lines.append(
            f"  {a.node}  {a.address or '-'}  {answer}  {session}"
            f"  groups: {', '.join(a.groups) or '-'}"
        )
    lines += [f"problem: {p.message}" for p in wrong]
    lines.append("no problems found" if not wrong else f"{len(wrong)} problem(s) found")
    return lines
