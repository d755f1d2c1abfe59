"""`timeslice serve orchestrator` with `--log-format json` (here from
TIMESLICE_LOG_FORMAT): every line of its stderr is a JSON object, its own
announcements included, and a grant and a yield are lines with their fields."""

from __future__ import annotations

import json
import signal
from collections.abc import Awaitable, Callable

import pytest
from orchestrator_process import Server, connect

from tests.ports import free_port
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb

pytestmark = pytest.mark.timeout(60)


async def test_every_line_is_json_and_decisions_carry_their_fields(
    serve: Callable[..., Awaitable[Server]],
) -> None:
    port = free_port()
    server = await serve(port, "memory", env={"TIMESLICE_LOG_FORMAT": "json"})
    async with connect(port) as stub:
        granted = await stub.acquire(pb.AcquireRequest(group_id="g", job_id="a"))
        await stub.yield_(pb.YieldRequest(group_id="g", job_id="a"))
    assert server.stop(signal.SIGTERM, 20) == 0

    lines = [json.loads(line) for line in server.log.read_text().splitlines()]
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    serving = next(line for line in lines if "serving on" in line["message"])
    assert serving["address"] == f"127.0.0.1:{port}"
    grant = next(line for line in lines if line.get("decision") == "grant")
    assert grant["group"] == "g" and grant["job"] == "a"
    assert grant["token"] == granted.fencing_token
    released = next(line for line in lines if line.get("decision") == "yield")
    assert released["token"] == granted.fencing_token and released["next_job"] == ""
    assert lines[-1]["message"] == "shutting down"
