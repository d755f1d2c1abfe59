"""`timeslice serve orchestrator` as a process: killed with SIGKILL, restarted on
the same journal, stopped with SIGTERM, and driven by the `timeslice` CLI."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from orchestrator_process import TIMESLICE, Server, Stub, connect

from tests.ports import free_port
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


async def status_of(stub: Stub, group: str) -> pb.GroupStatus:
    return (await stub.get_group_status(pb.GetGroupStatusRequest(group_id=group))).group


async def wait_queued(
    stub: Stub, group: str, jobs: list[str], timeout: float = 5.0
) -> pb.GroupStatus:
    deadline = time.monotonic() + timeout
    while list((status := await status_of(stub, group)).waiting_jobs) != jobs:
        assert time.monotonic() < deadline, f"queue is {list(status.waiting_jobs)}, not {jobs}"
        await asyncio.sleep(0.01)
    return status


async def grpc_status(call: Awaitable[Any]) -> Status:
    try:
        answer = await call
    except GRPCError as exc:
        return exc.status
    raise AssertionError(f"the call succeeded: {answer!r}")


def acquire(job: str, group: str, request_id: str = "") -> pb.AcquireRequest:
    return pb.AcquireRequest(job_id=job, group_id=group, request_id=request_id)


@pytest.fixture
def journal(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'journal.db'}"


async def test_sigkill_and_restart_keep_holder_queue_and_token(
    serve: Callable[..., Awaitable[Server]], journal: str
) -> None:
    group, port = "gpus", free_port()
    server = await serve(port, journal, "--recovery-grace", "15")
    async with connect(port) as stub:
        held = await stub.acquire(acquire("holder", group, "acquire-holder"))
        waiters = []
        for job in ("first", "second"):
            waiters.append(
                asyncio.ensure_future(stub.acquire(acquire(job, group, f"acquire-{job}")))
            )
            await wait_queued(stub, group, ["first", "second"][: len(waiters)])
        before = await status_of(stub, group)

        assert server.stop(signal.SIGKILL, 10) == -signal.SIGKILL
        outcomes = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 10)
        assert all(isinstance(outcome, Exception) for outcome in outcomes), outcomes

    await serve(port, journal, "--recovery-grace", "15")
    async with connect(port) as stub:
        after = await status_of(stub, group)
        assert (after.locking_job, list(after.waiting_jobs), after.fencing_token) == (
            "holder",
            ["first", "second"],
            held.fencing_token,
        )
        assert after.fencing_token == before.fencing_token
        assert after.epoch == before.epoch + 1
        # The holder's own retry is answered with the grant it has.
        retried = await stub.acquire(acquire("holder", group, "acquire-holder"))
        assert retried.fencing_token == held.fencing_token

        # The waiters retry with their request ids, in the opposite order; each retry
        # that takes its place back is told on a watch.
        watch = stub.watch(pb.WatchRequest(group_id=group), timeout=30)
        assert (await anext(watch)).kind == pb.WatchEventKind.CURRENT
        second = asyncio.ensure_future(stub.acquire(acquire("second", group, "acquire-second")))
        await next_queued(watch, "second")
        first = asyncio.ensure_future(stub.acquire(acquire("first", group, "acquire-first")))
        try:
            await next_queued(watch, "first")
            assert list((await status_of(stub, group)).waiting_jobs) == ["first", "second"]
            handover = await stub.yield_(
                pb.YieldRequest(job_id="holder", group_id=group, fencing_token=held.fencing_token)
            )
            assert handover.next_job_id == "first"
            first_grant = await asyncio.wait_for(first, 5)
            assert first_grant.fencing_token > held.fencing_token
            assert not second.done()

            # A retry of an answered request gets the same grant, not a second one.
            again = await stub.acquire(acquire("first", group, "acquire-first"))
            assert again.fencing_token == first_grant.fencing_token
            assert (await status_of(stub, group)).fencing_token == first_grant.fencing_token

            await stub.yield_(
                pb.YieldRequest(job_id="first", group_id=group, request_id="yield-first")
            )
            second_grant = await asyncio.wait_for(second, 5)
            assert second_grant.fencing_token > first_grant.fencing_token

            # Once its grant has ended, retrying the request neither grants nor queues it.
            assert await grpc_status(stub.acquire(acquire("first", group, "acquire-first"))) == (
                Status.ABORTED
            )
            status = await status_of(stub, group)
            assert (status.locking_job, status.waiter_queue_depth) == ("second", 0)
            assert status.fencing_token == held.fencing_token + 2
        finally:
            for task in (first, second):
                task.cancel()
            await asyncio.gather(first, second, return_exceptions=True)
            await watch.aclose()


async def next_queued(watch: AsyncGenerator[pb.WatchEvent, None], job: str) -> None:
    """Read `watch` until it tells that `job` is queued."""
    async with asyncio.timeout(5):
        async for event in watch:
            if event.kind == pb.WatchEventKind.QUEUED and event.job_id == job:
                return
    raise AssertionError(f"the watch ended before {job} was queued")


async def _drain(watch: AsyncIterator[pb.WatchEvent]) -> list[pb.WatchEvent]:
    """The rest of a watch's events, until it ends (cleanly or with its connection)."""
    events = []
    try:
        async for event in watch:
            events.append(event)
    except StreamTerminatedError:
        pass
    return events


async def test_sigterm_stops_cleanly_and_keeps_the_queue(
    serve: Callable[..., Awaitable[Server]], journal: str
) -> None:
    group, port = "gpus", free_port()
    server = await serve(port, journal)
    async with connect(port) as stub:
        held = await stub.acquire(acquire("holder", group))
        waiter = asyncio.ensure_future(stub.acquire(acquire("waiter", group)))
        await wait_queued(stub, group, ["waiter"])
        watch = stub.watch(pb.WatchRequest(group_id=group), timeout=30)
        assert (await anext(watch)).kind == pb.WatchEventKind.CURRENT
        watch_ended = asyncio.ensure_future(_drain(watch))

        stopping = time.monotonic()
        code = await asyncio.to_thread(server.stop, signal.SIGTERM, 10)
        assert code == 0
        assert time.monotonic() - stopping < 5
        # The blocked Acquire is told to retry rather than cut off.
        assert await grpc_status(asyncio.wait_for(waiter, 5)) == Status.UNAVAILABLE
        # An open watch does not hold the shutdown up, and is ended.
        assert await asyncio.wait_for(watch_ended, 5) == []

    server = await serve(port, journal)
    async with connect(port) as stub:
        status = await status_of(stub, group)
        assert (status.locking_job, list(status.waiting_jobs), status.fencing_token) == (
            "holder",
            ["waiter"],
            held.fencing_token,
        )
    code = await asyncio.to_thread(server.stop, signal.SIGTERM, 10)
    assert code == 0


async def _cli(*args: str, timeout: float = 30.0) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *TIMESLICE,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=Path(__file__).parent,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, out.decode()


async def test_cli_status_acquire_and_yield(
    serve: Callable[..., Awaitable[Server]], journal: str
) -> None:
    group, port = "gpus", free_port()
    await serve(port, journal)
    target = f"127.0.0.1:{port}"

    code, out = await _cli("status", "--target", target)
    assert (code, out.strip().splitlines()) == (
        0,
        [f"orchestrator {target}: active, the only writer of its journal (table epoch 1)",
         "no groups yet"],
    )  # fmt: skip

    code, out = await _cli("acquire", group, "cli-job", "--target", target)
    assert code == 0, out
    assert "cli-job holds gpus (token 1" in out

    async with connect(port) as stub:
        status = await status_of(stub, group)
        assert (status.locking_job, status.fencing_token) == ("cli-job", 1)

        code, out = await _cli("status", group, "--target", target)
        assert code == 0, out
        assert "holder=cli-job" in out and "token=1" in out

        code, out = await _cli(
            "acquire", group, "other-job", "--target", target, "--timeout", "0.5"
        )
        assert code == 1, out
        assert "DEADLINE_EXCEEDED" in out
        assert (await status_of(stub, group)).waiter_queue_depth == 0

        code, out = await _cli("yield", group, "cli-job", "--target", target)
        assert code == 0, out
        assert "cli-job released gpus (0 waiting)" in out
        status = await status_of(stub, group)
        assert (status.locking_job, status.active_job) == ("", "cli-job")

        code, out = await _cli("yield", group, "cli-job", "--target", target)
        assert code == 1, out
        assert "PERMISSION_DENIED" in out  # as the v1alpha1 server answers it

    code, out = await _cli("status", "--target", target)
    assert code == 0, out
    assert "holder=-" in out and "active=cli-job" in out


async def test_a_config_file_sets_the_groups_nodes_and_options_win_over_it(
    serve: Callable[..., Awaitable[Server]], tmp_path: Path
) -> None:
    port = free_port()
    config = tmp_path / "orchestrator.toml"
    config.write_text('port = 1\ndb = "memory"\n[group_nodes]\nrollout = ["gpu-1", "gpu-2"]\n')
    await serve(port, "memory", "--config", str(config))  # --port wins over the file's
    async with connect(port) as stub:
        assert (await stub.list_groups(pb.ListGroupsRequest())).group_ids == ["rollout"]
        status = await status_of(stub, "rollout")
        assert list(status.nodes) == ["gpu-1", "gpu-2"]
