"""The jobs a switch sends each node: encoded once, and made again whenever what
they are made of changes (a new backend, another registrant, a revoked job's limit)."""

from __future__ import annotations

import asyncio
from typing import Any

from timeslice.api.gen.snapshot_agent import v1alpha1 as apb
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.handoff import HandoffDriver, NodeResult
from timeslice.orchestrator.state import LockTable


class Journaled:
    def __init__(self) -> None:
        self.table = LockTable()

    def apply(self, event: ev.Event) -> asyncio.Future[list[ev.Effect]]:
        raise AssertionError("not called here")


def sent(driver: HandoffDriver, node: str = "n1", revoked: str = "") -> list[dict[str, Any]]:
    return [
        apb.SwitchJob.FromString(job).to_dict()
        for job in driver._jobs("g", node, revoked)  # noqa: SLF001
    ]


def register(
    table: LockTable, job: str, backend: dict[str, Any], node: str = "", by: str = ""
) -> None:
    table.handle(ev.SetJobBackend(now=1.0, group="g", job=job, node=node, backend=backend, by=by))


def test_a_new_registration_is_what_the_next_switch_sends() -> None:
    journaled = Journaled()
    driver = HandoffDriver(journaled, agents=None, timeout=30.0, revoked_snapshot_timeout=2.0)  # type: ignore[arg-type]
    register(journaled.table, "a", {"named": {"name": "noop"}}, by="alice")
    register(journaled.table, "b", {"named": {"name": "noop"}})
    first = sent(driver)
    assert [job["jobId"] for job in first] == ["a", "b"]
    assert first[0]["backendConfig"] == {"named": {"name": "noop"}}
    assert first[0]["registeredBy"] == "alice"
    assert sent(driver) == first  # the same again, from what was kept

    register(journaled.table, "a", {"appChannel": {}}, by="bob")
    again = sent(driver)
    assert again[0]["backendConfig"] == {"appChannel": {}}
    assert again[0]["registeredBy"] == "bob"
    assert again[1] == first[1]

    # A node's own registration wins on that node only.
    register(journaled.table, "b", {"appChannel": {}}, node="n2")
    assert sent(driver, "n2")[1]["backendConfig"] == {"appChannel": {}}
    assert sent(driver, "n1")[1]["backendConfig"] == {"named": {"name": "noop"}}

    # The revoked job carries its shorter snapshot limit; the others none.
    revoked = sent(driver, revoked="a")
    assert revoked[0]["snapshotTimeoutMs"] == "2000"
    assert "snapshotTimeoutMs" not in revoked[1]
    assert "snapshotTimeoutMs" not in sent(driver)[0]


class Recording(Journaled):
    def __init__(self) -> None:
        super().__init__()
        self.applied: list[ev.Event] = []

    def apply(self, event: ev.Event) -> asyncio.Future[list[ev.Effect]]:
        self.applied.append(event)
        done: asyncio.Future[list[ev.Effect]] = asyncio.get_running_loop().create_future()
        done.set_result([])
        return done


async def test_a_switch_asks_its_nodes_ahead_of_what_the_next_turn_writes() -> None:
    journaled = Recording()
    journaled.table.handle(ev.SetGroupNodes(now=1.0, group="g", nodes=("n1", "n2")))
    driver = HandoffDriver(journaled, agents=None, timeout=30.0)  # type: ignore[arg-type]
    order: list[str] = []

    async def node(name: str, *_: object) -> NodeResult:
        order.append(name)
        return NodeResult(node=name)

    driver._node = node  # type: ignore[method-assign]  # noqa: SLF001
    driver.start(ev.SwitchStarted(group="g", job="b", token=1, previous="a"))
    # What the turn that started the switch set going (the Yield's answer, say).
    asyncio.get_running_loop().call_soon(order.append, "answer")
    await asyncio.sleep(0.05)
    assert order == ["n1", "n2", "answer"]
    [done] = journaled.applied
    assert isinstance(done, ev.SwitchDone) and (done.group, done.token) == ("g", 1)


async def test_a_switch_dropped_before_it_began_drops_its_nodes_calls() -> None:
    journaled = Recording()
    journaled.table.handle(ev.SetGroupNodes(now=1.0, group="g", nodes=("n1",)))
    driver = HandoffDriver(journaled, agents=None, timeout=30.0)  # type: ignore[arg-type]
    calls: dict[int, asyncio.Event] = {}

    async def node(name: str, switch: ev.SwitchStarted, *_: object) -> NodeResult:
        calls[switch.token] = asyncio.Event()
        await calls[switch.token].wait()
        return NodeResult(node=name)

    driver._node = node  # type: ignore[method-assign]  # noqa: SLF001
    driver.start(ev.SwitchStarted(group="g", job="b", token=1, previous="a"))
    first = driver._running["g"][1]  # noqa: SLF001
    driver.start(ev.SwitchStarted(group="g", job="c", token=2, previous="a"))  # same turn
    await asyncio.sleep(0.05)
    assert first.cancelled()
    assert list(calls) == [2]  # token 1's call was cancelled before it ran
    calls[2].set()
    await asyncio.sleep(0.05)
    assert [e.token for e in journaled.applied if isinstance(e, ev.SwitchDone)] == [2]
