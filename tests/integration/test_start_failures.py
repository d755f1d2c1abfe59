"""A server whose start fails raises what made it fail, not an error of its
cleanup, and leaves nothing behind: the port is free for the next try."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator

import pytest

from timeslice import Agent, Orchestrator

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


async def test_an_orchestrator_on_a_busy_port_raises_the_bind_error(busy_port: int) -> None:
    orch = Orchestrator(port=busy_port)
    with pytest.raises(OSError) as caught:
        await orch.start()
    assert caught.value.errno == errno.EADDRINUSE
    await orch.close()  # closing what never started is fine too


async def test_an_agent_on_a_busy_port_raises_the_bind_error(busy_port: int) -> None:
    agent = Agent(node_name="n1", port=busy_port, db=None, backends=("noop",))
    with pytest.raises(OSError) as caught:
        await agent.start()
    assert caught.value.errno == errno.EADDRINUSE
    await agent.close()
