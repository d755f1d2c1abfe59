"""`timeslice serve agent --orchestrator ... --group ...`: the agent process registers
itself with the orchestrator and joins the group; it leaves when stopped."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

import pytest

from timeslice import Orchestrator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


async def test_an_agent_process_registers_and_joins_its_group(free_port: int) -> None:
    async with Orchestrator() as orch:
        agent = subprocess.Popen(
            [sys.executable, "-m", "timeslice", "serve", "agent", "--port", str(free_port),
             "--db", "memory", "--backend", "noop", "--node-name", "gpu-7",
             "--orchestrator", orch.address, "--group", "rollout"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            for _ in range(300):
                if orch.agents.addresses.get("gpu-7"):
                    break
                await asyncio.sleep(0.05)
            assert orch.agents.addresses.get("gpu-7") == f"127.0.0.1:{free_port}"
            assert orch.table.agents == {"gpu-7": f"127.0.0.1:{free_port}"}  # journaled
            assert orch.table.nodes == {"rollout": ("gpu-7",)}
            assert orch.group_agents("rollout") == [("gpu-7", f"127.0.0.1:{free_port}")]
            agent.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(agent.wait, 20) == 0
            for _ in range(100):
                if "gpu-7" not in orch.agents.addresses:
                    break
                await asyncio.sleep(0.05)
            assert "gpu-7" not in orch.agents.addresses  # its session ended with it
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
