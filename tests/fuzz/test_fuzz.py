"""Ten thousand hostile requests over every RPC of the orchestrator and the agent
leave both serving, their tables consistent, and every call answered in time with
a status a caller can act on; each bug the fuzzer found stays here as its smallest
request."""

from __future__ import annotations

import pytest

from .caller import Caller
from .fuzzer import fuzz, route_named, serving
from .generate import AGENT, ORCHESTRATOR, UNKNOWN_ROUTE, Generator, Request, routes
from .hostile import Pools, frame

SEED = 20_240_601
REQUESTS = 10_000


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_ten_thousand_hostile_requests_find_nothing() -> None:
    report = await fuzz(requests=REQUESTS, seed=SEED)
    print(f"\n{report.table()}\nstatuses: {dict(report.statuses.most_common())}")
    assert report.requests == REQUESTS
    found = {f: f.describe(report.occurrences[f.key()]) for f in report.findings}
    print("\n".join(found.values()))
    asserted = [text for finding, text in found.items() if finding.asserted]
    assert not asserted, "\n".join(asserted)


def test_every_route_of_both_services_is_fuzzed() -> None:
    names = {route.name for route in routes()}
    assert len(names) == 22
    assert {"TimeSliceOrchestratorService/Watch", "TimeSliceOrchestratorService/AgentSession",
            "SnapshotAgentService/WorkloadChannel", "Health/Watch"} <= names  # fmt: skip
    generator = Generator(1, Pools(node="n1", agent_address="127.0.0.1:1"), routes())
    drawn = {generator.request(index).route.name for index in range(2000)}
    assert drawn == names | {UNKNOWN_ROUTE.name}


def test_a_request_is_the_same_for_the_same_seed_and_index() -> None:
    def draw(seed: int) -> list[Request]:
        generator = Generator(seed, Pools(node="n1", agent_address="127.0.0.1:1"), routes())
        return [generator.request(index) for index in range(300)]

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


# An app_channel or app_endpoint backend with a SuspendMode no version defines (3).
# `timeslice.api.backend_config.backend_of` looks the mode up in MODE_NAME and the
# KeyError reaches the edge as INTERNAL; it should be INVALID_ARGUMENT.
_UNKNOWN_MODE = "22041a020803"  # BackendConfig{app_channel: {mode: 3}} as field 4
_UNKNOWN_MODE_REQUESTS = [
    pytest.param("TimeSliceOrchestratorService/RegisterJob", "0a016712016a" + _UNKNOWN_MODE,
                 id="RegisterJob-app_channel"),
    pytest.param("SnapshotAgentService/Snapshot", "0a016a120167" + _UNKNOWN_MODE,
                 id="Snapshot-app_channel"),
    pytest.param("SnapshotAgentService/Restore", "0a016a120167" + _UNKNOWN_MODE,
                 id="Restore-app_channel"),
    pytest.param("SnapshotAgentService/Snapshot", "0a016a120167" + "2206120408011803",
                 id="Snapshot-app_endpoint"),
    pytest.param("SnapshotAgentService/SwitchGroup", "0a016720642a090a016a12041a020803",
                 id="SwitchGroup-jobs-app_channel"),
]  # fmt: skip


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("route", "body"), _UNKNOWN_MODE_REQUESTS)
async def test_an_unknown_suspend_mode_is_an_invalid_argument(route: str, body: str) -> None:
    async with serving() as (orch, agent):
        caller = Caller({ORCHESTRATOR: orch.address, AGENT: agent.address})
        try:
            outcome = await caller.call(Request(0, route_named(route), "repro",
                                                frame(bytes.fromhex(body))))  # fmt: skip
        finally:
            caller.close()
    assert outcome.code == "INVALID_ARGUMENT", (outcome.code, outcome.message)
