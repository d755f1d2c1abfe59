"""The operator's commands against a real in-process Orchestrator and Agent:
`--version`, `status --json`, `agent status`, `inspect` and `watch` (as a program:
it reads a few events, then gets Ctrl-C), and one error line when the server is
away."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from timeslice import (
    Agent,
    AsyncSnapshotAgentClient,
    AsyncTimeSliceOrchestratorClient,
    Orchestrator,
)
from timeslice import cli_client
from timeslice.cli import app
from timeslice.cli_ops import _follow
from timeslice.client import named_backend
from timeslice.client.types import WatchEvent, WatchEventKind

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
VERSION = importlib.metadata.version("timeslice")

GROUP_KEYS = {
    "group", "state", "since", "holder", "active", "loaded", "queue", "queue_depth",
    "fencing_token", "epoch", "nodes", "quarantined",
}  # fmt: skip
EVENT_KEYS = {
    "kind", "group", "job", "time", "fencing_token", "reason", "context_restored",
    "switch_bytes", "status",
}  # fmt: skip


@pytest.fixture(autouse=True)
def no_credentials_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("TIMESLICE_"):
            monkeypatch.delenv(name)


@pytest.fixture
def short_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unreachable server is reported after 0.3 s instead of 5."""
    monkeypatch.setattr(cli_client, "CLI_RECONNECT_SEC", 0.3)


def invoke(*args: str) -> tuple[int, str, str]:
    """`timeslice ARGS` through typer's runner: exit status, stdout, stderr."""
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


async def invoke_async(*args: str) -> tuple[int, str, str]:
    # The command runs its own event loop: off this one, which serves it.
    return await asyncio.to_thread(invoke, *args)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[tuple[Orchestrator, Agent]]:
    """An orchestrator, and an agent of node-a that joins group g."""
    async with Orchestrator() as orch, Agent(
        node_name="node-a", backends=("noop",), orchestrator=orch.address, groups=("g",)
    ) as agent:  # fmt: skip
        await until(lambda: "node-a" in orch.table.agents)
        yield orch, agent


async def until(check: Any, seconds: float = 5.0) -> None:
    async with asyncio.timeout(seconds):
        while not check():
            await asyncio.sleep(0.02)


# --- --version and status --json ------------------------------------------------------


def test_version_is_the_packages_and_exits_0() -> None:
    code, out, _ = invoke("--version")
    assert code == 0
    assert out == f"timeslice {VERSION}\n"


async def test_status_says_where_the_orchestrator_stands_and_json_has_the_documented_keys(
    cluster: tuple[Orchestrator, Agent],
) -> None:
    orch, _ = cluster
    async with AsyncTimeSliceOrchestratorClient(orch.address, lease_ttl_sec=None) as client:
        await client.acquire(job_id="a", group_id="g")
        waiting = asyncio.ensure_future(client.acquire(job_id="b", group_id="g"))
        await until(lambda: orch.table.groups["g"].queue)
        code, out, err = await invoke_async("status", "--json", "--target", orch.address)
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
    assert code == 0, err
    [line] = out.splitlines()  # one document
    document = json.loads(line)
    assert set(document) == {"orchestrators", "groups"}
    [standing] = document["orchestrators"]
    assert set(standing) == {
        "address", "role", "lease_epoch", "lease_seconds", "lease_left_seconds", "holder",
        "active_address", "table_epoch", "version", "error",
    }  # fmt: skip
    assert standing["role"] == "active" and standing["lease_epoch"] == 0  # no leader lease
    assert standing["table_epoch"] == orch.table.epoch and standing["holder"] is None
    assert standing["address"] == orch.address and standing["error"] is None
    [g] = document["groups"]
    assert set(g) == GROUP_KEYS | {"contexts"}
    assert (g["group"], g["state"], g["holder"], g["queue"]) == ("g", "LOCKED", "a", ["b"])
    assert g["nodes"] == ["node-a"] and g["quarantined"] == {}
    assert g["contexts"] == []  # the noop agent has no context of a yet
    # without --json the text is as it was
    code, out, _ = await invoke_async("status", "g", "--target", orch.address)
    first, second, *_ = out.splitlines()
    assert code == 0 and first == (
        f"orchestrator {orch.address}: active, the only writer of its journal"
        f" (table epoch {orch.table.epoch})"
    )
    assert second.startswith("g: LOCKED  holder=a  active=a")


# --- agent status ---------------------------------------------------------------------


async def test_agent_status_shows_jobs_memory_and_version(
    cluster: tuple[Orchestrator, Agent],
) -> None:
    _, agent = cluster
    async with AsyncSnapshotAgentClient(agent.address) as client:
        await client.snapshot_and_wait("job-1", "g", backend_config=named_backend("noop"))
    code, out, err = await invoke_async("agent", "status", "--json", "--target", agent.address)
    assert code == 0, err
    document = json.loads(out)
    assert set(document) == {"target", "node", "version", "jobs", "accelerators"}
    assert (document["node"], document["version"]) == ("node-a", VERSION)
    [job] = document["jobs"]
    assert set(job) == {
        "job", "group", "state", "backend", "liveness", "fault", "operation", "store"
    }  # fmt: skip
    assert (job["job"], job["group"], job["state"], job["backend"]) == (
        "job-1", "g", "SAVED", "noop"
    )  # fmt: skip
    assert job["liveness"] == "UNSPECIFIED" and job["fault"] is None
    assert job["store"] is None  # a noop job's context is kept by no workload store
    assert isinstance(document["accelerators"], list)

    code, out, _ = await invoke_async("agent", "status", "-t", agent.address)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"agent node-a at {agent.address} ({VERSION})"
    assert lines[1].startswith("  job g/job-1: SAVED  backend=noop")


# --- inspect --------------------------------------------------------------------------


async def test_inspect_finds_nothing_wrong_in_a_sound_cluster(
    cluster: tuple[Orchestrator, Agent],
) -> None:
    orch, agent = cluster
    await orch.set_group_nodes("h", (agent.address,))  # named by its address: the same agent
    code, out, err = await invoke_async("inspect", "--json", "--target", orch.address)
    assert code == 0, err
    document = json.loads(out)
    assert set(document) == {"target", "orchestrator_version", "agents", "problems", "ok"}
    assert document["ok"] is True and document["problems"] == []
    assert document["orchestrator_version"] == VERSION
    assert document["agents"] == [
        {
            "node": "node-a",
            "address": agent.address,
            "in_session": True,
            "groups": ["g", "h"],
            "reachable": True,
            "version": VERSION,
            "error": None,
        }
    ]
    code, out, _ = await invoke_async("inspect", "--target", orch.address)
    assert code == 0
    assert out.splitlines()[-1] == "no problems found"


async def test_inspect_names_a_node_without_agent_and_an_agent_that_does_not_answer(
    cluster: tuple[Orchestrator, Agent],
) -> None:
    orch, _ = cluster
    async with Agent(
        node_name="node-b", backends=("noop",), orchestrator=orch.address, groups=("g",)
    ) as gone:
        await until(lambda: "node-b" in orch.table.agents)
        gone_address = gone.address
    await orch.set_group_nodes("h", ("node-a", "ghost"))
    code, out, err = await invoke_async("inspect", "--json", "--target", orch.address)
    assert code == 1, err
    document = json.loads(out)
    assert document["ok"] is False
    kinds = {(p["kind"], p["node"], tuple(p["groups"])) for p in document["problems"]}
    assert kinds == {("no_agent", "ghost", ("h",)), ("unreachable", "node-b", ("g",))}
    agents = {a["node"]: a for a in document["agents"]}
    assert agents["node-b"]["address"] == gone_address and not agents["node-b"]["reachable"]
    assert agents["node-b"]["error"] and not agents["node-b"]["in_session"]
    assert agents["ghost"]["address"] is None
    assert agents["node-a"]["groups"] == ["g", "h"] and agents["node-a"]["reachable"]

    code, out, _ = await invoke_async("inspect", "--target", orch.address)
    assert code == 1
    wrong = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert len(wrong) == 2, out
    assert any(
        "node ghost of group(s) h has no agent: run `timeslice serve agent" in w for w in wrong
    )
    assert any(f"node-b (group(s) g) at {gone_address} does not answer" in w for w in wrong)
    assert out.splitlines()[-1] == "2 problem(s) found"


async def test_inspect_reports_an_agent_of_another_version(
    cluster: tuple[Orchestrator, Agent], monkeypatch: pytest.MonkeyPatch
) -> None:
    orch, _ = cluster
    import timeslice.orchestrator.service

    monkeypatch.setattr(timeslice.orchestrator.service, "package_version", lambda: "9.9.9")
    code, out, err = await invoke_async("inspect", "--target", orch.address)
    assert code == 1, err
    [problem] = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert problem == (
        f"problem: the agent of node node-a runs {VERSION}, the orchestrator 9.9.9:"
        " run the same timeslice version on both"
    )


# --- unreachable servers --------------------------------------------------------------


@pytest.mark.parametrize("command", ["status", "inspect", "watch"])
def test_an_unreachable_orchestrator_is_one_line_and_exit_1(
    command: str, free_port: int, short_retry: None
) -> None:
    target = f"127.0.0.1:{free_port}"
    code, out, err = invoke(command, "--json", "--target", target)
    assert code == 1
    assert out == ""
    assert err.splitlines() == [
        f"error: cannot reach the orchestrator at {target}: connection refused (is it running?)"
    ]


def test_an_unreachable_agent_is_one_line_and_exit_1(free_port: int, short_retry: None) -> None:
    target = f"127.0.0.1:{free_port}"
    code, _, err = invoke("agent", "status", "--target", target)
    assert code == 1
    assert err.splitlines() == [
        f"error: cannot reach the agent at {target}: connection refused (is it running?)"
    ]


# --- watch ----------------------------------------------------------------------------


@pytest.fixture
def watcher() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)  # and close its pipes


async def test_watch_prints_json_lines_live_and_ends_cleanly_on_ctrl_c(
    watcher: list[subprocess.Popen[str]],
) -> None:
    async with Orchestrator() as orch:
        async with AsyncTimeSliceOrchestratorClient(orch.address, lease_ttl_sec=None) as client:
            await client.acquire(job_id="a", group_id="g")
            env = {k: v for k, v in os.environ.items() if not k.startswith("TIMESLICE_")}
            env["PYTHONPATH"] = str(ROOT)
            process = subprocess.Popen(
                [sys.executable, "-m", "timeslice", "watch", "g", "--json", "-t", orch.address],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            watcher.append(process)
            assert process.stdout is not None

            async def line() -> dict[str, Any]:
                text = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), 20)
                assert text, process.stderr.read() if process.stderr else ""
                document: dict[str, Any] = json.loads(text)
                return document

            current = await line()
            assert set(current) == EVENT_KEYS and set(current["status"]) == GROUP_KEYS
            assert (current["kind"], current["group"], current["status"]["holder"]) == (
                "CURRENT", "g", "a"
            )  # fmt: skip
            await client.release(job_id="a", group_id="g")
            await client.acquire(job_id="b", group_id="g")
            seen = [await line(), await line()]
            assert [(e["kind"], e["job"]) for e in seen] == [("YIELDED", "a"), ("GRANTED", "b")]
            assert seen[1]["fencing_token"] > current["fencing_token"]
        process.send_signal(signal.SIGINT)
        code = await asyncio.to_thread(process.wait, 10)
        assert code == 0, process.stderr.read() if process.stderr else ""


async def test_a_watch_carries_on_across_a_restart_of_the_orchestrator(
    free_port: int, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_client, "CLI_RECONNECT_SEC", 10.0)
    seen: list[WatchEvent] = []
    first = Orchestrator(port=free_port, db=sqlite_url)
    await first.start()
    try:
        async with AsyncTimeSliceOrchestratorClient(
            first.address, lease_ttl_sec=None, reconnect_timeout_sec=0
        ) as client:
            await client.acquire(job_id="a", group_id="g")
            following = asyncio.ensure_future(_follow(client, "g", seen.append))
            await until(lambda: len(seen) == 1)
            await first.close()
            async with Orchestrator(port=free_port, db=sqlite_url, recovery_grace=0.1) as second:
                await until(lambda: len(seen) == 2)  # the new stream's current state
                async with AsyncTimeSliceOrchestratorClient(second.address) as other:
                    await other.acquire(job_id="b", group_id="x")
                await client.release(job_id="a", group_id="g")
                await until(lambda: len(seen) == 3)
            following.cancel()
    finally:
        await first.close()
    assert [e.kind for e in seen] == [
        WatchEventKind.CURRENT, WatchEventKind.CURRENT, WatchEventKind.YIELDED
    ]  # fmt: skip


# --- credentials ----------------------------------------------------------------------


async def test_the_commands_call_with_the_token_given_or_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from timeslice.security.principals import read_auth_file
    from timeslice.security.tokens import new_token, principal_entry

    token = new_token()
    entry, _ = principal_entry("ops", "operator", token)
    (tmp_path / "auth.toml").write_text(entry)
    policy = read_auth_file(tmp_path / "auth.toml")
    async with Orchestrator(auth=policy) as orch, Agent(
        node_name="node-a", backends=("noop",), auth=policy
    ) as agent:  # fmt: skip
        for command in (["inspect"], ["status", "--json"]):
            code, _, err = await invoke_async(*command, "-t", orch.address)
            assert code == 1 and "UNAUTHENTICATED" in err, err
            code, _, err = await invoke_async(*command, "-t", orch.address, "--token", token)
            assert code == 0, err
        code, _, err = await invoke_async("agent", "status", "-t", agent.address)
        assert code == 1 and "UNAUTHENTICATED" in err, err
        monkeypatch.setenv("TIMESLICE_TOKEN", token)
        code, out, err = await invoke_async("agent", "status", "--json", "-t", agent.address)
        assert code == 0, err
        assert json.loads(out)["node"] == "node-a"
