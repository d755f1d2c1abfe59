"""`in_own_task`: what grpclib does to the task awaiting a call stays with a task
of its own, and a cancellation of the caller still reaches the call."""

from __future__ import annotations

import asyncio

import pytest
from grpclib.exceptions import StreamTerminatedError
from grpclib.utils import Wrapper

from timeslice.client._transport import call_with_retry, in_own_task, own_tasks


async def _call(wrapper: Wrapper, started: asyncio.Event) -> str:
    # What a grpclib call does: await inside its stream's wrapper.
    with wrapper:
        started.set()
        await asyncio.sleep(10)
    return "answered"


async def test_a_call_cut_by_its_connection_leaves_its_caller_uncancelled() -> None:
    current = asyncio.current_task()
    assert current is not None
    for own_task in (False, True):
        wrapper, started = Wrapper(), asyncio.Event()

        async def cut() -> None:
            await started.wait()
            wrapper.cancel(StreamTerminatedError("connection lost"))

        cutter = asyncio.create_task(cut())
        call = _call(wrapper, started)
        with pytest.raises(StreamTerminatedError):
            await (in_own_task(call) if own_task else call)
        await cutter
        if own_task:
            assert current.cancelling() == 0
        else:  # what the wrapper does to a caller that awaits it directly
            assert current.cancelling() == 1
            current.uncancel()


async def test_cancelling_the_caller_cancels_the_call() -> None:
    wrapper, started = Wrapper(), asyncio.Event()
    inner_cancelled = asyncio.Event()

    async def call() -> str:
        try:
            return await _call(wrapper, started)
        except asyncio.CancelledError:
            inner_cancelled.set()
            raise

    caller = asyncio.create_task(in_own_task(call()))
    await started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert inner_cancelled.is_set()


async def test_own_tasks_reads_a_stream_to_its_end_and_closes_it() -> None:
    closed = asyncio.Event()

    async def stream() -> object:
        try:
            for i in range(3):
                yield i
                await asyncio.sleep(0)
        finally:
            closed.set()

    async with own_tasks(stream()) as items:
        assert [i async for i in items] == [0, 1, 2]
    assert closed.is_set()

    closed.clear()
    async with own_tasks(stream()) as items:
        async for i in items:
            break
    assert closed.is_set()


@pytest.mark.parametrize("own_task", [True, False])
async def test_a_retried_call_runs_in_a_task_of_its_own_unless_told_not_to(own_task: bool) -> None:
    ran_in: list[asyncio.Task[object] | None] = []

    async def attempt(left: float | None) -> str:
        ran_in.append(asyncio.current_task())
        return "answered"

    answer = await call_with_retry(
        attempt, what="Call", budget_sec=None, reconnect_timeout_sec=1.0, own_task=own_task
    )
    assert answer == "answered"
    assert (ran_in[0] is asyncio.current_task()) is not own_task
