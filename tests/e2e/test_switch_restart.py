"""`timeslice serve orchestrator` killed with SIGKILL at each step of a switch, then
restarted on its journal: the switch completes, never with two live contexts on
the node, and no waiter is lost (see `switch_scenario` for the steps)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from orchestrator_process import Server
from switch_scenario import GROUP, STEPS, failpoint_env, killed_mid_switch

from tests.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


@pytest.mark.parametrize("step", STEPS)
async def test_a_switch_survives_sigkill_of_the_orchestrator_at_each_step(
    step: str, serve: Callable[..., Awaitable[Server]], tmp_path: Path
) -> None:
    port = free_port()
    journal = f"sqlite:///{tmp_path / 'journal.db'}"
    options = ("--group-nodes", f"{GROUP}=n1", "--recovery-grace", "20")
    server = await serve(port, journal, *options, env=failpoint_env(step))

    async def restart() -> None:
        await serve(port, journal, *options)

    await killed_mid_switch(step, tmp_path, f"127.0.0.1:{port}", server.process, restart)
