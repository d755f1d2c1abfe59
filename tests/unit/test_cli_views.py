"""What the operator commands print, from values alone: a watch event's line and
`timeslice inspect`'s problems."""

from __future__ import annotations

import datetime

from timeslice.cli_views import ProblemKind, event_json, event_line, inspect_json, problems
from timeslice.client.types import (
    AgentList,
    GroupLockState,
    GroupStatus,
    KnownAgent,
    WatchEvent,
    WatchEventKind,
)

WHEN = datetime.datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.UTC)


def group(holder: str = "b") -> GroupStatus:
    return GroupStatus("g", GroupLockState.LOCKED, WHEN, holder, holder, 1, holder, 7)


def test_a_grant_reads_as_one_line_with_its_token_restore_and_bytes() -> None:
    event = WatchEvent(WatchEventKind.GRANTED, "g", "b", WHEN, 7, "", group(), True, 3 << 20)
    assert event_line(event) == (
        "2025-01-02T03:04:05.678Z g GRANTED b token=7 restored moved=3.0 MiB"
        " -> LOCKED holder=b queue[1]"
    )
    revoked = WatchEvent(WatchEventKind.REVOKED, "g", "a", WHEN, 6, "lease expired", None)
    assert (
        event_line(revoked) == "2025-01-02T03:04:05.678Z g REVOKED a token=6 reason='lease expired'"
    )
    assert (
        event_json(revoked)["status"] is None and event_json(revoked)["reason"] == "lease expired"
    )


def agent(node: str, **fields: object) -> KnownAgent:
    base: dict[str, object] = dict(
        node=node, address=f"{node}:9001", in_session=True, groups=("g",), reachable=True,
        version="1.0",
    )  # fmt: skip
    base.update(fields)
    return KnownAgent(**base)  # type: ignore[arg-type]


def test_inspect_finds_each_kind_of_problem_and_only_those() -> None:
    found = AgentList(
        agents=(
            agent("fine"),
            agent("ghost", address="", reachable=False, version=""),
            agent("away", reachable=False, version="", error="connection refused"),
            agent("idle-away", groups=(), reachable=False, version=""),  # in no group
            agent("old", version=""),
            agent("newer", version="2.0"),
        ),
        version="1.0",
    )
    wrong = problems(found, "orch:50051")
    assert [(p.kind, p.node) for p in wrong] == [
        (ProblemKind.NO_AGENT, "ghost"),
        (ProblemKind.UNREACHABLE, "away"),
        (ProblemKind.VERSION_MISMATCH, "old"),
        (ProblemKind.VERSION_MISMATCH, "newer"),
    ]
    assert "--orchestrator orch:50051" in wrong[0].message
    assert "connection refused" in wrong[1].message
    assert "a version too old to say" in wrong[2].message
    document = inspect_json("orch:50051", found, wrong)
    assert document["ok"] is False and len(document["problems"]) == 4
    assert problems(AgentList(agents=(agent("fine"),), version="1.0"), "o:1") == []
