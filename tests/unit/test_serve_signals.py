"""A server stops on SIGINT or SIGTERM whenever it comes: a signal is caught from
the moment `timeslice serve` starts until it ends, so that one which arrives while
the orchestrator finishes its start (or between two waits) is neither lost nor
left to the default action."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest
from typer.testing import CliRunner

import timeslice.orchestrator.server as orchestrator_server
from timeslice.cli import app
from timeslice.cli_client import Signals

pytestmark = pytest.mark.timeout(30)


async def test_a_signal_before_the_wait_is_kept_for_it() -> None:
    with Signals() as signals:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0.05)  # the loop handles it before anyone waits
        never = asyncio.ensure_future(asyncio.Event().wait())
        assert await asyncio.wait_for(signals.wait_or(never), 5) is True
        await asyncio.sleep(0)
        assert never.cancelled()
        # and every later wait sees it too
        assert await asyncio.wait_for(signals.wait_or(asyncio.Event().wait()), 5) is True


async def test_without_a_signal_the_wait_ends_with_what_it_waits_for() -> None:
    with Signals() as signals:
        done = asyncio.ensure_future(asyncio.sleep(0.01, "value"))
        assert await signals.wait_or(done) is False
        assert done.result() == "value"
    # the handlers are gone again: the default SIGINT handler is back
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


class SignalledWhileStarting:
    """An orchestrator whose start ends in the same instant as a SIGTERM comes in."""

    instances: list[SignalledWhileStarting] = []

    def __init__(self, config: Any) -> None:
        self.address = "127.0.0.1:1"
        self.failure = None
        self.closed = False
        self._stopped = asyncio.Event()
        self.instances.append(self)

    async def start(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def close(self) -> None:
        self.closed = True


def test_a_sigterm_as_the_start_ends_stops_the_orchestrator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(orchestrator_server, "Orchestrator", SignalledWhileStarting)
    for _ in range(5):
        result = CliRunner().invoke(app, ["serve", "orchestrator", "--port", "0", "--db", "memory"])
        assert result.exit_code == 0, result.output
        assert "shutting down" in result.output
    assert len(SignalledWhileStarting.instances) == 5
    assert all(orch.closed for orch in SignalledWhileStarting.instances)
