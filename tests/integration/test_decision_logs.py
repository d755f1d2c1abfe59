"""The decision log in JSON: a real in-process Orchestrator and Agent driven through
grants, yields, switches, revocations (lease expiry, hold limit, operator), a
quarantine and its reset, and an agent joining and leaving; every line the
handler wrote parses on its own, and each decision carries its fields."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from tests.waiting import until
from timeslice import Agent, AsyncTimeSliceOrchestratorClient, Orchestrator
from timeslice.client.workload import register_workload
from timeslice.logs import JsonFormatter

# Every decision line has these keys (None or "" where a decision concerns none).
DECISION_KEYS = {"decision", "group", "job", "token", "node"}


class Flaky:
    """A workload whose snapshot fails while told to."""

    def __init__(self) -> None:
        self.state = "RUNNING"
        self.fail_snapshot = False

    def snapshot(self, mode: str, tags: Iterable[str]) -> None:
        if self.fail_snapshot:
            raise RuntimeError("device busy")
        self.state = "SAVED"

    def restore(self, tags: Iterable[str]) -> None:
        self.state = "RUNNING"


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """What the package logs at INFO and above, as `--log-format json` writes it."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("timeslice")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def lines(out: io.StringIO) -> list[dict[str, Any]]:
    parsed = [json.loads(line) for line in out.getvalue().splitlines()]
    for line in parsed:
        assert {"time", "level", "logger", "message"} <= set(line), line
    return parsed


def decisions(out: io.StringIO, kind: str, /, **match: Any) -> list[dict[str, Any]]:
    found = [
        line
        for line in lines(out)
        if line.get("decision") == kind and all(line.get(k) == v for k, v in match.items())
    ]
    for line in found:
        assert DECISION_KEYS <= set(line), line
    return found


def one(out: io.StringIO, kind: str, /, **match: Any) -> dict[str, Any]:
    found = decisions(out, kind, **match)
    assert found, f"no {kind} line with {match}: {[x['message'] for x in lines(out)]}"
    return found[-1]


async def test_each_decision_is_one_json_line_with_its_fields(json_log: io.StringIO) -> None:
    workloads = {"a": Flaky(), "b": Flaky()}
    async with Orchestrator(group_nodes={"g": ("n1",)}, hold_limits={"k": 0.2}) as orch:
        async with Agent(
            node_name="n1", backends=("app_channel",), orchestrator=orch.address
        ) as agent:
            await until(lambda: decisions(json_log, "agent-joined", node="n1"), "n1 joins")
            joined = one(json_log, "agent-joined", node="n1")
            assert joined["address"] == agent.address and joined["level"] == "INFO"

            registrations = [
                await register_workload(agent.address, job, "g", w) for job, w in workloads.items()
            ]
            assert {x["job"] for x in decisions(json_log, "channel", phase="open")} == {"a", "b"}

            async with AsyncTimeSliceOrchestratorClient(orch.address, group_id="g") as c:
                first = await c.acquire("a")
                grant = one(json_log, "grant", job="a")
                assert grant["group"] == "g" and grant["token"] == first.fencing_token
                assert grant["node"] == "n1" and grant["waited_s"] >= 0

                b_waits = asyncio.ensure_future(c.acquire("b"))
                await until(lambda: "b" in orch.table.groups["g"].queue, "b waits")
                await c.release("a")
                granted = await asyncio.wait_for(b_waits, 10)

                released = one(json_log, "yield", job="a")
                assert released["token"] == first.fencing_token and released["next_job"] == "b"
                switch = one(json_log, "switch", job="b", outcome="ok")
                assert switch["token"] == granted.fencing_token and switch["saved"] == ["a"]
                assert switch["previous"] == "a" and switch["restored"] is True
                assert switch["bytes"] >= 0 and switch["queued_s"] >= 0
                parts = switch["snapshot_s"] + switch["restore_s"] + switch["overhead_s"]
                assert switch["snapshot_s"] > 0 and switch["restore_s"] > 0
                assert parts == pytest.approx(switch["seconds"], abs=1e-6)
                ended = one(json_log, "operation", phase="end", kind="snapshot", job="a")
                assert ended["outcome"] == "ok" and ended["backend"] == "app_channel"
                assert ended["node"] == "n1" and ended["seconds"] >= 0
                assert one(json_log, "operation", phase="start", kind="restore", job="b")

                # b's snapshot fails on the way to a: b is quarantined, a goes on.
                a_waits = asyncio.ensure_future(c.acquire("a"))
                await until(lambda: "a" in orch.table.groups["g"].queue, "a waits")
                workloads["b"].fail_snapshot = True
                await c.release("b")
                await asyncio.wait_for(a_waits, 10)
                quarantine = one(json_log, "quarantine", job="b")
                assert "device busy" in quarantine["reason"] and quarantine["level"] == "WARNING"
                failed = one(json_log, "operation", phase="end", job="b", outcome="failed")
                assert "device busy" in failed["error"]

                workloads["b"].fail_snapshot = False
                assert await c.reset_job("b")
                assert one(json_log, "reset", job="b", group="g")
                action = one(json_log, "operator", action="reset-job", job="b")
                assert action["principal"] and action["was_quarantined"] is True

                taken = await c.force_release(job_id="a", reason="maintenance")
                assert taken.released_job_id == "a"
                revoke = one(json_log, "revoke", job="a", reason="released by operator")
                assert revoke["detail"] == "maintenance" and revoke["level"] == "WARNING"
                action = one(json_log, "operator", action="force-release", group="g")
                assert action["job"] == "a" and action["token"] == revoke["token"]

                await c.set_group_nodes(["n1"], group_id="g")
                assert one(json_log, "operator", action="set-group-nodes", node="n1")

            # Revocations by the clock: a lease nobody renews, and a hold limit.
            held = await orch.acquire("h", "x", lease_ttl=0.2)
            await until(lambda: decisions(json_log, "revoke", job="x"), "x's lease expires")
            expired = one(json_log, "revoke", job="x", group="h")
            assert expired["reason"] == "lease expired" and expired["token"] == held.token
            await orch.acquire("k", "y")
            await until(lambda: decisions(json_log, "revoke", job="y"), "y's hold limit")
            assert one(json_log, "revoke", job="y")["reason"] == "hold limit reached"

            for registration in registrations:
                await registration.close()
            await until(
                lambda: len(decisions(json_log, "channel", phase="close")) == 2, "channels close"
            )
        await until(lambda: decisions(json_log, "agent-lost", node="n1"), "n1 leaves")
        # The agent stopped and closed its session: said at INFO, not as a loss.
        lost = one(json_log, "agent-lost", node="n1")
        assert lost["closed"] is True and lost["level"] == "INFO", lost
        orch.table.validate()
