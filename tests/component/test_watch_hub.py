"""The watch hub: one rendering and one encoding per event whatever the number of
watchers, a fan-out that leaves the event loop to others, and watchers that fall
behind ended without holding anyone up."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.waiting import until
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb
from timeslice.errors import ResourceExhaustedError
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.server import Orchestrator
from timeslice.orchestrator.service import OrchestratorService
from timeslice.orchestrator.watches import WAKES_PER_TURN, Notice, WatchHub


def yielded(group: str = "g", job: str = "a", token: int = 1) -> ev.Yielded:
    return ev.Yielded(
        group=group, job=job, token=token, pending_waiters=0, snapshot_deferred=False, next_job=""
    )


# --- the hub alone ------------------------------------------------------------------------


async def test_each_notice_is_rendered_once_for_all_watchers_of_a_form() -> None:
    hub = WatchHub(max_watchers=1000, backlog=100)
    rendered: list[Notice] = []

    def render(notice: Notice) -> str:
        rendered.append(notice)
        return f"{notice.effect.job}@{notice.effect.group}"

    wire = [hub.watch("g", render) for _ in range(300)] + [
        hub.watch("", render) for _ in range(300)
    ]
    plain = [hub.watch("g") for _ in range(10)]
    hub.publish(yielded(job="a"))
    hub.publish(yielded(job="b"))
    hub.publish(yielded(group="other", job="c"))
    assert len(rendered) == 3  # once per notice, not per watcher nor per filter
    for watch in wire[:300]:
        assert await asyncio.wait_for(watch.batch(), 5) == ["a@g", "b@g"]
    for watch in wire[300:]:
        assert await asyncio.wait_for(watch.batch(), 5) == ["a@g", "b@g", "c@other"]
    for watch in plain:
        notices = await asyncio.wait_for(watch.batch(), 5)
        assert [n.effect.job for n in notices] == ["a", "b"]
    hub.close()


async def test_the_fan_out_lets_the_event_loop_serve_others_meanwhile() -> None:
    hub = WatchHub(max_watchers=2000, backlog=100)
    watches = [hub.watch("g") for _ in range(2000)]
    got: list[int] = []
    turns = 0

    async def follow(i: int) -> None:
        await watches[i].batch()
        got.append(i)

    followers = [asyncio.ensure_future(follow(i)) for i in range(len(watches))]
    await asyncio.sleep(0)  # every follower waits
    hub.publish(yielded())
    # Publishing woke nobody by itself, and each turn of the loop wakes a few.
    assert not got
    while len(got) < len(watches):
        await asyncio.sleep(0)
        turns += 1
        assert len(got) <= (turns + 1) * WAKES_PER_TURN
    assert turns >= len(watches) // WAKES_PER_TURN - 1
    await asyncio.gather(*followers)
    hub.close()


async def test_a_watcher_that_falls_behind_is_ended_and_the_others_are_not() -> None:
    hub = WatchHub(max_watchers=10, backlog=5)
    slow, fast = hub.watch("g"), hub.watch("g")
    for token in range(1, 9):
        hub.publish(yielded(token=token))
        assert len(await asyncio.wait_for(fast.batch(), 5)) == 1
    assert await asyncio.wait_for(slow.batch(), 5) == []
    assert slow.lagged and not fast.lagged
    assert hub.count == 1  # its place is free again
    hub.publish(yielded(token=9))
    assert [n.effect.token for n in await asyncio.wait_for(fast.batch(), 5)] == [9]
    hub.close()


async def test_a_closed_hub_ends_its_watches_after_what_they_were_told() -> None:
    hub = WatchHub(max_watchers=10, backlog=5)
    watch = hub.watch("")
    hub.publish(yielded())
    hub.close()
    assert [n.effect.job async for n in watch] == ["a"]
    assert not watch.lagged
    assert [n async for n in hub.watch("g")] == []


def test_watches_over_the_limit_are_refused() -> None:
    hub = WatchHub(max_watchers=2, backlog=5)
    first, _ = hub.watch("g"), hub.watch("")
    with pytest.raises(ResourceExhaustedError, match="2 watchers"):
        hub.watch("g")
    first.close()
    first.close()  # closing twice frees one place, once
    hub.watch("g")
    with pytest.raises(ResourceExhaustedError):
        hub.watch("g")


# --- the orchestrator's Watch streams -----------------------------------------------------


async def test_a_watch_stream_that_falls_behind_ends_resource_exhausted() -> None:
    async with Orchestrator(watch_backlog=3) as orch:
        service = OrchestratorService(orch)
        events: Any = service.watch(pb.WatchRequest(group_id="g"))
        await orch.acquire("g", "a")
        current = await anext(events)  # a watch of a known group begins with its status
        assert current.kind is pb.WatchEventKind.CURRENT
        await orch.yield_("g", "a")
        for job in "bcdef":  # its reader stalls while the group changes hands
            await orch.acquire("g", job)
            await orch.yield_("g", job)
        await until(lambda: orch.watches.count == 0, "the watch is ended")
        with pytest.raises(ResourceExhaustedError, match="fell 3 events behind"):
            async for _ in events:
                pass
        assert orch.watches.count == 0
