"""register_workload against a fake agent on 127.0.0.1: what it registers, how it
answers commands, how it reconnects, and each kind of workload it drives."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from grpclib.const import Status
from grpclib.client import Channel
from grpclib.exceptions import GRPCError

from tests.waiting import until
from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
from timeslice.api.serving import GrpcServer
from timeslice.client.adapters import is_vllm_engine
from timeslice.client.workload import (
    Backoff,
    WorkloadRegistration,
    register_workload,
    register_workload_in_thread,
)
from timeslice.errors import InvalidArgumentError, UnavailableError
from timeslice.workloads import HostMemoryWorkload

WAIT = 5.0


class AgentStream:
    """One workload's stream as the fake agent sees it."""

    def __init__(self, register: pb.RegisterWorkload) -> None:
        self.register = register
        self.outgoing: asyncio.Queue[pb.AgentCommand | GRPCError | None] = asyncio.Queue()
        self.results: asyncio.Queue[pb.CommandResult] = asyncio.Queue()
        self.ended = asyncio.Event()  # the workload ended its side
        self.ended_cleanly = False  # by ending its stream, not by a reset
        self._ids = 0

    async def read(self, messages: AsyncIterator[pb.WorkloadMessage]) -> None:
        try:
            async for message in messages:
                assert message.result is not None, "only the first message registers"
                self.results.put_nowait(message.result)
            self.ended_cleanly = True
        finally:
            self.ended.set()
            self.outgoing.put_nowait(None)  # as an agent does: end the stream in turn

    def send(self, **command: Any) -> str:
        self._ids += 1
        command_id = f"c{self._ids}"
        self.outgoing.put_nowait(pb.AgentCommand(command_id=command_id, **command))
        return command_id

    async def run(self, **command: Any) -> pb.CommandResult:
        command_id = self.send(**command)
        result = await asyncio.wait_for(self.results.get(), WAIT)
        assert result.command_id == command_id
        return result

    async def snapshot(
        self, mode: pb.SuspendMode = pb.SuspendMode.OFFLOAD, tags: tuple[str, ...] = ()
    ) -> pb.CommandResult:
        return await self.run(snapshot=pb.SnapshotCommand(mode=mode, tags=list(tags)))

    async def restore(self, tags: tuple[str, ...] = ()) -> pb.CommandResult:
        return await self.run(restore=pb.RestoreCommand(tags=list(tags)))

    def drop(self, error: GRPCError | None = None) -> None:
        """End the stream from the agent's side, cleanly or with an error status."""
        self.outgoing.put_nowait(error)


class FakeAgent(pb.SnapshotAgentServiceBase):
    """Records each registration; the test drives each stream."""

    def __init__(self) -> None:
        self.streams: asyncio.Queue[AgentStream] = asyncio.Queue()
        self.refuse: GRPCError | None = None

    async def workload_channel(
        self, messages: AsyncIterator[pb.WorkloadMessage]
    ) -> AsyncIterator[pb.AgentCommand]:
        first = await anext(messages)
        assert first.register is not None, "the first message registers"
        if self.refuse is not None:
            raise self.refuse
        stream = AgentStream(first.register)
        self.streams.put_nowait(stream)
        reader = asyncio.create_task(stream.read(messages))
        try:
            while (item := await stream.outgoing.get()) is not None:
                if isinstance(item, GRPCError):
                    raise item
                yield item
        finally:
            reader.cancel()

    async def next_stream(self) -> AgentStream:
        return await asyncio.wait_for(self.streams.get(), WAIT)


class AgentServer:
    """The fake agent on a real server; `stop` closes its connections, as a crash would."""

    def __init__(self) -> None:
        self.fake = FakeAgent()
        self.server: GrpcServer | None = None
        self.port = 0

    async def start(self) -> str:
        self.server = GrpcServer([self.fake])
        address = await self.server.serve("127.0.0.1", self.port)
        self.port = int(address.rsplit(":", 1)[1])
        return address

    async def stop(self) -> None:
        assert self.server is not None
        await asyncio.wait_for(self.server.stop(), WAIT)


@pytest.fixture
async def agent() -> AsyncIterator[AgentServer]:
    server = AgentServer()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def hostmem(tmp_path: Path) -> HostMemoryWorkload:
    workload = HostMemoryWorkload(tmp_path)
    workload.add("w", np.arange(1000, dtype=np.float32), tags=["weights"])
    workload.add("kv", np.ones((10, 10)), tags=["kv_cache"])
    return workload


def address(agent: AgentServer) -> str:
    return f"127.0.0.1:{agent.port}"


class Recorder:
    """Callbacks that record their calls and the thread they ran on."""

    def __init__(self, result: Any = None, error: Exception | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.threads: set[str] = set()
        self.result = result
        self.error = error

    def on_snapshot(self, mode: str, tags: list[str]) -> Any:
        self.threads.add(threading.current_thread().name)
        self.calls.append(("snapshot", mode, tags))
        if self.error is not None:
            raise self.error
        return self.result

    def on_restore(self, tags: list[str]) -> Any:
        self.threads.add(threading.current_thread().name)
        self.calls.append(("restore", tags))
        return self.result


# --- registration and commands ---------------------------------------------------------


async def test_registers_the_workload_with_its_capabilities(
    agent: AgentServer, hostmem: HostMemoryWorkload
) -> None:
    async with await register_workload(address(agent), "job-a", "g1", workload=hostmem) as reg:
        stream = await agent.fake.next_stream()
        assert reg.connected and reg.registrations == 1
    register = stream.register
    assert (register.job_id, register.group) == ("job-a", "g1")
    assert register.state == pb.JobState.RUNNING
    assert register.capabilities is not None
    assert register.capabilities.supported_modes == [pb.SuspendMode.OFFLOAD, pb.SuspendMode.DISCARD]
    assert register.capabilities.default_mode == pb.SuspendMode.OFFLOAD
    assert register.capabilities.tags == ["kv_cache", "weights"]


async def test_explicit_capabilities_override_the_workloads(
    agent: AgentServer, hostmem: HostMemoryWorkload
) -> None:
    async with WorkloadRegistration(
        address(agent),
        "job-a",
        workload=hostmem,
        supported_modes=["discard"],
        default_mode="discard",
        tags=["weights"],
    ):
        register = (await agent.fake.next_stream()).register
    assert register.capabilities is not None
    assert register.capabilities.supported_modes == [pb.SuspendMode.DISCARD]
    assert register.capabilities.default_mode == pb.SuspendMode.DISCARD
    assert register.capabilities.tags == ["weights"]
    assert register.group == ""


async def test_snapshot_and_restore_commands_report_what_moved(
    agent: AgentServer, hostmem: HostMemoryWorkload
) -> None:
    expected = {name: hostmem[name].copy() for name in hostmem.names}
    async with await register_workload(address(agent), "job-a", workload=hostmem) as reg:
        stream = await agent.fake.next_stream()

        result = await stream.snapshot(tags=("weights",))
        assert result.ok and result.error == ""
        assert result.storage_bytes == result.device_bytes == 4000
        assert hostmem.saved == {"w"} and reg.state == "SAVED"

        result = await stream.snapshot()
        assert result.ok and result.storage_bytes == result.device_bytes == 800

        result = await stream.restore()
        assert result.ok and result.storage_bytes == result.device_bytes == 4800
        assert reg.state == "RUNNING" and reg.commands == 3
    for name, array in expected.items():
        np.testing.assert_array_equal(hostmem[name], array)


async def test_a_failed_command_is_answered_with_its_error(agent: AgentServer) -> None:
    recorder = Recorder(error=RuntimeError("out of host memory"))
    async with await register_workload(
        address(agent), "job-a", on_snapshot=recorder.on_snapshot, on_restore=recorder.on_restore
    ):
        stream = await agent.fake.next_stream()
        result = await stream.snapshot(pb.SuspendMode.DISCARD, ("kv_cache",))
        assert not result.ok
        assert result.error == "RuntimeError: out of host memory"
        assert result.storage_bytes is None and result.device_bytes is None
        assert (await stream.restore(("weights",))).ok  # the stream goes on
    assert recorder.calls == [("snapshot", "discard", ["kv_cache"]), ("restore", ["weights"])]


async def test_a_long_error_is_cut_to_what_the_agent_takes(agent: AgentServer) -> None:
    recorder = Recorder(error=RuntimeError("x" * 100_000))
    async with await register_workload(
        address(agent), "job-a", on_snapshot=recorder.on_snapshot, on_restore=recorder.on_restore
    ):
        stream = await agent.fake.next_stream()
        result = await stream.snapshot(pb.SuspendMode.OFFLOAD)
        assert not result.ok and result.error.startswith("RuntimeError: xxx")
        assert len(result.error.encode()) <= 1024


async def test_modes_are_checked_against_the_capabilities(agent: AgentServer) -> None:
    recorder = Recorder()
    async with await register_workload(
        address(agent),
        "job-a",
        on_snapshot=recorder.on_snapshot,
        on_restore=recorder.on_restore,
        supported_modes=["offload", "discard"],
        default_mode="discard",
    ):
        stream = await agent.fake.next_stream()
        assert (await stream.snapshot(pb.SuspendMode.UNSPECIFIED)).ok
    async with await register_workload(
        address(agent),
        "job-b",
        on_snapshot=recorder.on_snapshot,
        on_restore=recorder.on_restore,
        supported_modes=["offload"],
    ):
        stream = await agent.fake.next_stream()
        result = await stream.snapshot(pb.SuspendMode.DISCARD)
        assert not result.ok and "does not support mode 'discard'" in result.error
        result = await stream.run()  # neither snapshot nor restore
        assert not result.ok and "neither a snapshot nor a restore" in result.error
    assert recorder.calls == [("snapshot", "discard", [])]


async def test_callback_results_of_every_shape(agent: AgentServer) -> None:
    for value, storage, device in (((10, 20), 10, 20), ((None, 5), None, 5), (None, None, None)):
        recorder = Recorder(result=value)
        async with await register_workload(
            address(agent), "j", on_snapshot=recorder.on_snapshot, on_restore=recorder.on_restore
        ):
            result = await (await agent.fake.next_stream()).snapshot()
        assert result.ok and (result.storage_bytes, result.device_bytes) == (storage, device)

    recorder = Recorder(result="lots")
    async with await register_workload(
        address(agent), "j", on_snapshot=recorder.on_snapshot, on_restore=recorder.on_restore
    ):
        result = await (await agent.fake.next_stream()).snapshot()
    assert not result.ok and "expected None or (storage_bytes, device_bytes)" in result.error


async def test_async_callbacks_run_on_the_event_loop(agent: AgentServer) -> None:
    calls: list[tuple[str, list[str]]] = []
    loop = asyncio.get_running_loop()

    async def on_snapshot(mode: str, tags: list[str]) -> tuple[int, int]:
        assert asyncio.get_running_loop() is loop
        await asyncio.sleep(0.01)
        calls.append((mode, tags))
        return 1, 2

    async def on_restore(tags: list[str]) -> tuple[int, int]:
        calls.append(("restore", tags))
        return 3, 4

    async with await register_workload(
        address(agent), "j", on_snapshot=on_snapshot, on_restore=on_restore
    ):
        stream = await agent.fake.next_stream()
        snap = await stream.snapshot()
        rest = await stream.restore(("a", "b"))
    assert (snap.storage_bytes, snap.device_bytes, rest.storage_bytes, rest.device_bytes) == (
        1,
        2,
        3,
        4,
    )
    assert calls == [("offload", []), ("restore", ["a", "b"])]


async def test_blocking_callbacks_run_off_the_event_loop(agent: AgentServer) -> None:
    recorder = Recorder()
    async with await register_workload(
        address(agent), "j", on_snapshot=recorder.on_snapshot, on_restore=recorder.on_restore
    ):
        stream = await agent.fake.next_stream()
        await stream.snapshot()
        await stream.restore()
    assert threading.current_thread().name not in recorder.threads
    assert len(recorder.threads) == 1  # one worker thread of the registration's own


# --- reconnection and closing ----------------------------------------------------------


@pytest.mark.parametrize(
    "error", [None, GRPCError(Status.UNAVAILABLE, "agent going away")], ids=["ended", "status"]
)
async def test_reregisters_as_saved_after_the_agent_drops_the_stream(
    agent: AgentServer, hostmem: HostMemoryWorkload, error: GRPCError | None
) -> None:
    async with await register_workload(address(agent), "job-a", "g", workload=hostmem) as reg:
        stream = await agent.fake.next_stream()
        assert (await stream.snapshot(tags=("kv_cache",))).ok
        stream.drop(error)

        again = await agent.fake.next_stream()
        assert again.register.state == pb.JobState.SAVED
        assert (again.register.job_id, again.register.group) == ("job-a", "g")
        assert reg.registrations == 2
        assert (await again.restore()).ok
        again.drop()

        third = await agent.fake.next_stream()
        assert third.register.state == pb.JobState.RUNNING


async def test_callbacks_reregister_with_the_state_of_the_last_command(
    agent: AgentServer,
) -> None:
    recorder = Recorder()
    async with await register_workload(
        address(agent), "j", on_snapshot=recorder.on_snapshot, on_restore=recorder.on_restore
    ):
        stream = await agent.fake.next_stream()
        await stream.snapshot()
        stream.drop()
        assert (await agent.fake.next_stream()).register.state == pb.JobState.SAVED


async def test_reconnects_to_an_agent_that_restarts(
    agent: AgentServer, hostmem: HostMemoryWorkload
) -> None:
    async with await register_workload(address(agent), "job-a", workload=hostmem) as reg:
        stream = await agent.fake.next_stream()
        assert (await stream.snapshot()).ok
        await agent.stop()
        await until(lambda: not reg.connected, "the registration sees the agent go")
        assert not reg.connected
        await agent.start()  # same port
        again = await agent.fake.next_stream()
        assert again.register.state == pb.JobState.SAVED
        assert (await again.restore()).ok
        assert reg.connected


async def test_registers_once_the_agent_comes_up(free_port: int) -> None:
    recorder = Recorder()
    server = AgentServer()
    server.port = free_port
    starting = asyncio.create_task(
        register_workload(
            f"127.0.0.1:{free_port}",
            "j",
            on_snapshot=recorder.on_snapshot,
            on_restore=recorder.on_restore,
            connect_timeout_sec=WAIT,
        )
    )
    await asyncio.sleep(0.3)
    assert not starting.done()
    await server.start()
    try:
        registration = await asyncio.wait_for(starting, WAIT)
        assert registration.connected
        await registration.close()
    finally:
        await server.stop()


async def test_gives_up_when_the_agent_cannot_be_reached(free_port: int) -> None:
    recorder = Recorder()
    with pytest.raises(UnavailableError, match="could not register job 'j'"):
        await register_workload(
            f"127.0.0.1:{free_port}",
            "j",
            on_snapshot=recorder.on_snapshot,
            on_restore=recorder.on_restore,
            connect_timeout_sec=0.3,
        )


async def test_a_refused_registration_ends_without_retrying(agent: AgentServer) -> None:
    agent.fake.refuse = GRPCError(Status.INVALID_ARGUMENT, "group 'g/x' is not a valid id")
    recorder = Recorder()
    registration = await register_workload(
        address(agent), "j", on_snapshot=recorder.on_snapshot, on_restore=recorder.on_restore
    )
    with pytest.raises(InvalidArgumentError, match="not a valid id"):
        await asyncio.wait_for(registration.wait_closed(), WAIT)
    assert registration.closed and registration.registrations == 1
    assert isinstance(registration.error, InvalidArgumentError)
    await registration.close()


async def test_close_ends_the_stream_and_stops_reconnecting(
    agent: AgentServer, hostmem: HostMemoryWorkload
) -> None:
    registration = await register_workload(address(agent), "j", workload=hostmem)
    stream = await agent.fake.next_stream()
    await registration.close()
    await asyncio.wait_for(stream.ended.wait(), WAIT)
    assert stream.ended_cleanly
    assert registration.closed and not registration.connected
    await registration.close()  # idempotent
    await asyncio.sleep(0.2)
    assert agent.fake.streams.empty()


async def test_close_finishes_a_command_in_progress(agent: AgentServer) -> None:
    entered, release = threading.Event(), threading.Event()
    finished: list[str] = []

    def on_snapshot(mode: str, tags: list[str]) -> tuple[int, int]:
        entered.set()
        release.wait(WAIT)
        finished.append(mode)
        return 7, 8

    registration = await register_workload(
        address(agent), "j", on_snapshot=on_snapshot, on_restore=lambda tags: None
    )
    stream = await agent.fake.next_stream()
    stream.send(snapshot=pb.SnapshotCommand(mode=pb.SuspendMode.OFFLOAD))
    assert await asyncio.to_thread(entered.wait, WAIT)
    closing = asyncio.create_task(registration.close())
    await asyncio.sleep(0.1)
    assert not closing.done()  # still waiting for the snapshot
    release.set()
    await asyncio.wait_for(closing, WAIT)
    assert finished == ["offload"]
    result = await asyncio.wait_for(stream.results.get(), WAIT)
    assert result.ok and (result.storage_bytes, result.device_bytes) == (7, 8)
    assert registration.state == "SAVED"


# --- a job in its own process ----------------------------------------------------------

WORKER = Path(__file__).parents[1] / "workloads" / "hostmem_worker.py"


class Worker:
    """tests/workloads/hostmem_worker.py in a subprocess, one JSON line per command."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, *args: str) -> tuple[Worker, dict[str, Any]]:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        worker = cls(process)
        return worker, await worker.read()

    async def read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), 30)
        assert line, "the worker ended"
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def ask(self, command: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{command}\n".encode())
        await self.process.stdin.drain()
        return await self.read()

    async def quit(self) -> int:
        assert await self.ask("quit") == {"bye": True}
        return await asyncio.wait_for(self.process.wait(), WAIT)


async def test_a_worker_process_frees_its_memory_and_gets_every_byte_back(
    agent: AgentServer,
) -> None:
    size = 64 * 1024 * 1024
    worker, ready = await Worker.start(
        "--agent", address(agent), "--job", "w1", "--group", "g", "--mib", "64", "--seed", "3"
    )
    try:
        assert ready["ready"] and ready["bytes"] == size
        assert ready["arrays"]["lora"] == ["lora"]
        stream = await agent.fake.next_stream()
        assert (stream.register.job_id, stream.register.group) == ("w1", "g")
        assert (await worker.ask("verify"))["ok"]

        before = (await worker.ask("rss"))["rss_bytes"]
        result = await stream.snapshot()
        assert result.ok and result.storage_bytes == result.device_bytes == size
        after = (await worker.ask("rss"))["rss_bytes"]
        assert before - after >= 0.9 * size
        assert (await worker.ask("verify")) == {"ok": False, "saved": sorted(ready["arrays"])}

        result = await stream.restore()
        assert result.ok and result.storage_bytes == size
        assert await worker.ask("verify") == {"ok": True, "mismatched": []}
        assert (await worker.ask("state"))["state"] == "RUNNING"
        assert await worker.quit() == 0
    finally:
        if worker.process.returncode is None:
            worker.process.kill()
            await worker.process.wait()


# --- the thread variant ----------------------------------------------------------------


async def test_the_thread_variant_serves_a_blocking_programme(
    agent: AgentServer, hostmem: HostMemoryWorkload
) -> None:
    target = address(agent)
    handle = await asyncio.to_thread(register_workload_in_thread, target, "job-t", "g", hostmem)
    try:
        stream = await agent.fake.next_stream()
        assert stream.register.job_id == "job-t" and handle.connected
        assert (await stream.snapshot()).ok
        assert handle.state == "SAVED" and hostmem.state == "SAVED"
        assert (await stream.restore()).ok
        assert handle.state == "RUNNING"
    finally:
        await asyncio.to_thread(handle.close)
    await asyncio.wait_for(stream.ended.wait(), WAIT)
    assert not handle.connected and handle.error is None
    await asyncio.to_thread(handle.close)  # idempotent


def test_the_thread_variant_raises_when_it_cannot_register(free_port: int) -> None:
    before = threading.active_count()
    with pytest.raises(UnavailableError):
        register_workload_in_thread(
            f"127.0.0.1:{free_port}",
            "j",
            on_snapshot=lambda mode, tags: None,
            on_restore=lambda tags: None,
            connect_timeout_sec=0.2,
        )
    assert threading.active_count() == before


# --- adapters --------------------------------------------------------------------------


class LLM:
    """Stands for vllm.LLM: blocking sleep/wake_up."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def sleep(self, level: int = 1) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(("wake_up", tags))


LLM.__module__ = "vllm.entrypoints.llm"


class AsyncLLM:
    """Stands for vLLM's AsyncLLM: coroutine sleep/wake_up."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def sleep(self, level: int = 1) -> None:
        self.calls.append(("sleep", level))

    async def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(("wake_up", tags))


AsyncLLM.__module__ = "vllm.v1.engine.async_llm"


class MyEngine(AsyncLLM):
    """A user's subclass of a vLLM engine."""


@pytest.mark.parametrize("engine_class", [LLM, AsyncLLM, MyEngine])
async def test_a_vllm_engine_sleeps_and_wakes_up(
    agent: AgentServer, engine_class: type[LLM] | type[AsyncLLM]
) -> None:
    engine = engine_class()
    assert is_vllm_engine(engine)
    async with await register_workload(address(agent), "j", workload=engine):
        stream = await agent.fake.next_stream()
        caps = stream.register.capabilities
        assert caps is not None and caps.tags == ["weights", "kv_cache"]
        assert caps.default_mode == pb.SuspendMode.OFFLOAD
        results = [
            await stream.snapshot(pb.SuspendMode.OFFLOAD, ("weights",)),
            await stream.restore(("weights",)),
            await stream.snapshot(pb.SuspendMode.DISCARD),
            await stream.restore(),
        ]
    assert all(r.ok and r.storage_bytes is None for r in results)
    assert engine.calls == [("sleep", 1), ("wake_up", ["weights"]), ("sleep", 2), ("wake_up", None)]


def test_a_look_alike_outside_vllm_is_not_taken_for_an_engine() -> None:
    class LLM:  # same name, not vLLM's
        def sleep(self, level: int = 1) -> None: ...

        def wake_up(self, tags: list[str] | None = None) -> None: ...

    assert not is_vllm_engine(LLM())
    with pytest.raises(InvalidArgumentError, match="cannot drive a .*LLM"):
        WorkloadRegistration("127.0.0.1:1", "j", workload=LLM())


def test_a_vllm_engine_without_sleep_mode_is_refused() -> None:
    class OldLLM:
        pass

    OldLLM.__name__ = "LLM"
    OldLLM.__module__ = "vllm.entrypoints.llm"
    with pytest.raises(InvalidArgumentError, match="enable_sleep_mode"):
        WorkloadRegistration("127.0.0.1:1", "j", workload=OldLLM())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "nothing to drive"),
        (
            {"workload": object(), "on_snapshot": print, "on_restore": print},
            "not both",
        ),
        ({"on_snapshot": print}, "on_restore is missing"),
        ({"on_restore": print}, "on_snapshot is missing"),
        ({"workload": object()}, "cannot drive a builtins.object"),
        ({"on_snapshot": 3, "on_restore": print}, "must be callable"),
        ({"on_snapshot": print, "on_restore": print, "default_mode": "sleep"}, "suspend mode"),
        (
            {
                "on_snapshot": print,
                "on_restore": print,
                "supported_modes": ["offload"],
                "default_mode": "discard",
            },
            "not among the supported modes",
        ),
        ({"on_snapshot": print, "on_restore": print, "tags": "weights"}, "not a string"),
    ],
)
def test_arguments_it_cannot_use_are_refused_at_once(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        WorkloadRegistration("127.0.0.1:1", "j", **kwargs)


def test_a_job_id_and_a_target_are_required() -> None:
    with pytest.raises(InvalidArgumentError, match="job_id"):
        WorkloadRegistration("127.0.0.1:1", "", on_snapshot=print, on_restore=print)
    with pytest.raises(InvalidArgumentError, match="host:port"):
        WorkloadRegistration("nowhere", "j", on_snapshot=print, on_restore=print)


def test_backoff_doubles_with_jitter_up_to_five_seconds() -> None:
    backoff = Backoff(rng=random.Random(7))
    pauses = [backoff.next() for _ in range(12)]
    steps = [min(0.05 * 2**i, 5.0) for i in range(12)]
    assert all(step / 2 <= pause <= step for pause, step in zip(pauses, steps, strict=True))
    assert max(pauses) <= 5.0 and pauses[-1] >= 2.5
    backoff.reset()
    assert backoff.next() <= 0.05


# --- against the real Agent ------------------------------------------------------------


async def wait_for_job(stub: pb.SnapshotAgentServiceStub, job: str, state: pb.JobState) -> None:
    async with asyncio.timeout(WAIT):
        while True:
            statuses = (await stub.status(timeout=WAIT)).job_statuses
            if any(s.job_id == job and s.state == state for s in statuses):
                return
            await asyncio.sleep(0.02)


async def run_operation(
    stub: pb.SnapshotAgentServiceStub, kind: str, job: str, group: str
) -> pb.GetOperationResponse:
    config = pb.BackendConfig(app_channel=pb.AppChannelConfig())
    if kind == "snapshot":
        started = await stub.snapshot(
            pb.SnapshotRequest(job_id=job, group=group, backend_config=config), timeout=WAIT
        )
        operation_id = started.operation_id
    else:
        restored = await stub.restore(
            pb.RestoreRequest(job_id=job, group=group, backend_config=config), timeout=WAIT
        )
        operation_id = restored.operation_id
    return await stub.get_operation(
        pb.GetOperationRequest(operation_id=operation_id, wait_ms=int(WAIT * 1000)),
        timeout=2 * WAIT,
    )


@contextlib.asynccontextmanager
async def agent_stub(address: str) -> AsyncIterator[pb.SnapshotAgentServiceStub]:
    host, port = address.rsplit(":", 1)
    async with Channel(host, int(port)) as channel:
        yield pb.SnapshotAgentServiceStub(channel)


async def test_the_agent_snapshots_and_restores_a_registered_workload(
    hostmem: HostMemoryWorkload,
) -> None:
    from timeslice.agent.server import Agent

    expected = {name: hostmem[name].copy() for name in hostmem.names}
    async with (
        Agent(node_name="n1", backends=("app_channel",)) as agent,
        await register_workload(agent.address, "job-a", "g", workload=hostmem),
        agent_stub(agent.address) as stub,
    ):
        await wait_for_job(stub, "job-a", pb.JobState.RUNNING)

        snapshot = await run_operation(stub, "snapshot", "job-a", "g")
        assert snapshot.status == pb.OperationStatus.COMPLETE, snapshot.error
        assert snapshot.storage_bytes == snapshot.snapshot_device_bytes == hostmem.nbytes
        assert hostmem.saved == set(hostmem.names)
        await wait_for_job(stub, "job-a", pb.JobState.SAVED)

        restore = await run_operation(stub, "restore", "job-a", "g")
        assert restore.status == pb.OperationStatus.COMPLETE, restore.error
        assert restore.storage_bytes == hostmem.nbytes
        await wait_for_job(stub, "job-a", pb.JobState.RUNNING)
    for name, array in expected.items():
        np.testing.assert_array_equal(hostmem[name], array)


async def test_a_workload_reregisters_as_saved_with_a_restarted_agent(
    hostmem: HostMemoryWorkload, tmp_path: Path
) -> None:
    from timeslice.agent.server import Agent

    options: dict[str, Any] = {
        "node_name": "n1",
        "backends": ("app_channel",),
        "db": f"sqlite:///{tmp_path / 'agent.db'}",
    }
    async with Agent(**options) as first:
        registration = await register_workload(first.address, "job-a", "g", workload=hostmem)
        async with agent_stub(first.address) as stub:
            await wait_for_job(stub, "job-a", pb.JobState.RUNNING)
            snapshot = await run_operation(stub, "snapshot", "job-a", "g")
            assert snapshot.status == pb.OperationStatus.COMPLETE, snapshot.error
    async with registration, Agent(**options, port=int(first.address.rsplit(":", 1)[1])) as agent:
        async with agent_stub(agent.address) as stub:
            await wait_for_job(stub, "job-a", pb.JobState.SAVED)
            assert registration.registrations == 2
            restore = await run_operation(stub, "restore", "job-a", "g")
            assert restore.status == pb.OperationStatus.COMPLETE, restore.error
            assert hostmem.state == "RUNNING"
