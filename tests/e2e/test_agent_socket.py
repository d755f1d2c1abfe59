"""The agent's Unix socket, with a second process under another user: the kernel's
peer credentials say who each caller is, and a workload of another uid can
neither take a job's workload channel nor name processes it does not own.

The other user's process is a child forked from the test and switched to an
unused uid (it needs no account, nor read access to the test's interpreter):
so the test needs root. It is skipped otherwise, except under CI=true, where
it fails instead. Then `timeslice serve agent --socket`: the socket's mode, a
stale socket file replaced, a live one refused, the file removed at exit.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpclib.client
import pytest
from grpclib.const import Cardinality
from grpclib.exceptions import GRPCError

from tests.fakes.fake_cuda import FakeCuda, FakeNvml
from tests.optional import need_root
from tests.waiting import until
from timeslice.agent.server import Agent
from timeslice.api.gen.grpc.health import v1 as health
from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
from timeslice.backends import BackendContext
from timeslice.backends.cuda import CudaBackend
from timeslice.client.workload import register_workload

pytestmark = pytest.mark.timeout(60)

SERVICE = "/snapshot_agent.v1alpha1.SnapshotAgentService"
OTHER_UID = 48213  # no account needed: the kernel only compares numbers
PR_SET_DUMPABLE = 4


# What needs root here (the tests are skipped without it, but fail under CI=true).
NEEDS_ROOT = "a second user's process needs root to make (setuid in a forked child)"


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A folder every user can reach (pytest's tmp_path is its owner's only)."""
    folder = Path(tempfile.mkdtemp(prefix="ts-sock-"))
    folder.chmod(0o755)
    yield folder
    for child in folder.iterdir():
        child.unlink()
    folder.rmdir()


def run_as(uid: int, work: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Fork, become `uid` in the child, run `work()` there on an event loop of its
    own, and return what it returned (JSON through a pipe)."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12 warns of forking a process with threads: the child here only
        # makes a few calls on a new event loop of its own, then exits.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns
        code, answer = 1, '{"error": "the child failed"}'
        try:
            # Never outlive the parent's wait: killed by the alarm, it closes the pipe.
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(int(timeout))
            os.close(read_end)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            # A process that changed its uid is not dumpable: its /proc files would
            # stay root's, and no process of its own would look like its own.
            ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
            answer, code = json.dumps({"ok": work()}), 0
        except BaseException as exc:
            answer = json.dumps({"error": f"{type(exc).__name__}: {exc}"})
        finally:
            try:
                os.write(write_end, answer.encode())  # a few hundred bytes: one write
            finally:
                os._exit(code)
    os.close(write_end)
    deadline = time.monotonic() + timeout
    with os.fdopen(read_end) as pipe:
        text = pipe.read()
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        assert time.monotonic() < deadline, "the other user's process hangs"
        time.sleep(0.01)
    answer = json.loads(text)
    assert "error" not in answer, answer["error"]
    return answer["ok"]


def other_users_calls(path: str, root_pid: int) -> dict[str, Any]:
    """What a process of another user tries on the agent's socket: each call's status
    and message (or "OK")."""

    async def main() -> dict[str, Any]:
        channel = grpclib.client.Channel(path=path)
        stub = pb.SnapshotAgentServiceStub(channel, timeout=10)
        results: dict[str, Any] = {"uid": os.getuid()}

        async def attempt(name: str, call: Any) -> None:
            try:
                await call
                results[name] = "OK"
            except GRPCError as exc:
                results[name] = [exc.status.name, exc.message]

        def cuda(*pids: int) -> pb.BackendConfig:
            target = pb.ProcessTarget(pids=list(pids))
            return pb.BackendConfig(cuda=pb.CudaBackendConfig(explicit_target=target))

        async def register(job: str) -> None:
            async with channel.request(
                f"{SERVICE}/WorkloadChannel", Cardinality.STREAM_STREAM,
                pb.WorkloadMessage, pb.AgentCommand, timeout=10,
            ) as stream:  # fmt: skip
                message = pb.RegisterWorkload(job_id=job, group="g")
                await stream.send_message(pb.WorkloadMessage(register=message))
                await stream.recv_message()

        try:
            await attempt("register", register("a"))
            await attempt("register_cuda_job", register("r"))
            await attempt(
                "snapshot_cuda_job", stub.restore(pb.RestoreRequest(job_id="r", group="g"))
            )
            await attempt("root_pid", stub.snapshot(pb.SnapshotRequest(job_id="c", group="g", backend_config=cuda(root_pid))))  # fmt: skip
            await attempt("own_pid", stub.snapshot(pb.SnapshotRequest(job_id="d", group="g", backend_config=cuda(os.getpid()))))  # fmt: skip
            await attempt("snapshot_a", stub.snapshot(pb.SnapshotRequest(job_id="a", group="g")))
            await attempt("switch", stub.switch_group(pb.SwitchGroupRequest(group="g", next_job_id="a", fencing_token=3, timeout_ms=1000)))  # fmt: skip
            status = await stub.status()
            results["status_jobs"] = sorted(j.job_id for j in status.job_statuses)
        finally:
            channel.close()
        return results

    return asyncio.run(main())


@pytest.fixture
async def agent(socket_dir: Path) -> AsyncIterator[Agent]:
    async with Agent(node_name="n1", db=None, backends=("noop", "app_channel"),
                     socket=str(socket_dir / "agent.sock")) as running:  # fmt: skip
        yield running
        running.table.validate()


async def test_a_workload_of_another_uid_cannot_take_a_channel_or_name_pids_it_does_not_own(
    agent: Agent,
) -> None:
    need_root(NEEDS_ROOT)
    assert agent.socket_address is not None
    path = agent.socket_address.removeprefix("unix:")
    commands: list[str] = []
    registration = await register_workload(
        agent.socket_address, "a", "g",
        on_snapshot=lambda mode, tags: commands.append("snapshot"),
        on_restore=lambda tags: commands.append("restore"),
    )  # fmt: skip
    sleeper = subprocess.Popen(["sleep", "30"])  # a process of this (root) user
    try:
        # Job r: the sleeper's (root's) process, checkpointed by a stand-in driver.
        cuda = FakeCuda()
        cuda.add_process(sleeper.pid, device_bytes=1 << 20)
        context = BackendContext(agent.config.node_name, agent.channels)
        agent.backends["cuda"] = CudaBackend(context, cuda.module(), FakeNvml(cuda).module())
        op_id = await agent.start_operation("snapshot", "g", "r", backend="cuda",
                                            config={"pids": [sleeper.pid]})  # fmt: skip
        assert (await agent.operation(op_id, 10)).status.name == "COMPLETE"

        await until(lambda: agent.channels.get("g", "a") is not None, "the workload registered")
        first = agent.channels.get("g", "a")
        assert first is not None and first.owner == f"uid {os.getuid()}"
        assert f"pid {os.getpid()}" in first.peer  # the kernel's word, not the caller's

        results = await asyncio.to_thread(run_as, OTHER_UID, lambda: other_users_calls(path, sleeper.pid))  # fmt: skip

        assert results["uid"] == OTHER_UID
        assert results["register"][0] == "PERMISSION_DENIED", results
        assert results["root_pid"][0] == "PERMISSION_DENIED", results
        assert f"pid {sleeper.pid}" in results["root_pid"][1]
        # Its own process passes that check (the stand-in driver does not know it).
        assert results["own_pid"][0] == "NOT_FOUND", results
        assert "not a CUDA process" in results["own_pid"][1]
        # Root's cuda job is not the other user's to register a channel for or restore.
        assert results["register_cuda_job"][0] == "PERMISSION_DENIED", results
        assert results["snapshot_cuda_job"][0] == "PERMISSION_DENIED", results
        assert f"pid {sleeper.pid}" in results["snapshot_cuda_job"][1]
        assert results["snapshot_a"][0] == "PERMISSION_DENIED", results
        assert results["switch"][0] == "PERMISSION_DENIED", results
        assert results["status_jobs"] == ["a", "r"]
        # Nothing changed: the first channel is still the job's, and serves it.
        assert agent.channels.get("g", "a") is first and not first.closed
        assert registration.registrations == 1
        assert {job for _, job in agent.table.jobs} == {"a", "r"}
        assert agent.table.jobs[("g", "r")].state.value == "SAVED"
        op_id = await agent.start_operation("snapshot", "g", "a")
        assert (await agent.operation(op_id, 10)).status.name == "COMPLETE"
        assert commands == ["snapshot"]
    finally:
        sleeper.kill()
        sleeper.wait()
        await registration.close()


# --- timeslice serve agent --socket ---------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def serving(path: Path, process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert process.poll() is None, process.stdout.read().decode() if process.stdout else ""
        if path.exists():
            channel = grpclib.client.Channel(path=str(path))
            try:
                answer = await health.HealthStub(channel, timeout=1).check(
                    health.HealthCheckRequest()
                )
                if answer.status == health.HealthCheckResponseServingStatus.SERVING:
                    return
            except (OSError, GRPCError, TimeoutError):
                pass
            finally:
                channel.close()
        assert time.monotonic() < deadline, "the agent never served on its socket"
        await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_serve_agent_socket(socket_dir: Path) -> None:
    path = socket_dir / "agent.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # a socket file nothing listens on: an agent that died left it
    command = [sys.executable, "-m", "timeslice", "serve", "agent", "--port", str(free_port()),
               "--db", "memory", "--backend", "noop", "--socket", str(path)]  # fmt: skip
    agent = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        await serving(path, agent)
        assert stat.S_IMODE(path.stat().st_mode) == 0o666
        # A second agent on the same socket: refused, with one line; the first serves on.
        command[command.index("--port") + 1] = str(free_port())
        second = subprocess.run(command, capture_output=True, text=True, timeout=30)
        assert second.returncode != 0
        assert "listens on" in second.stderr and "Traceback" not in second.stderr
        await serving(path, agent)
        agent.terminate()
        assert agent.wait(15) == 0
        assert not path.exists()  # removed at exit
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        assert agent.stdout is not None
        agent.stdout.close()
