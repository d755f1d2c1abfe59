"""A unary call costs one socket write each way, on the real server and client."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from timeslice.client import AsyncTimeSliceOrchestratorClient
from timeslice.orchestrator.server import Orchestrator


@pytest.fixture
def tcp_sends(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Every send on a TCP socket of this process, by length."""
    sends: list[int] = []
    send = socket.socket.send

    def counted(self: socket.socket, data: Any, *args: Any) -> int:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            sends.append(len(data))
        return send(self, data, *args)

    monkeypatch.setattr(socket.socket, "send", counted)
    yield sends


async def test_each_unary_call_is_one_write_from_each_end(tcp_sends: list[int]) -> None:
    async with Orchestrator() as orch:
        async with AsyncTimeSliceOrchestratorClient(orch.address, "a", "g") as client:
            async with client.acquire():  # the group made
                pass
            for _ in range(3):  # connected, and past every first-call exchange
                await client.get_status()
            tcp_sends.clear()
            calls = 20
            for _ in range(calls):
                await client.get_status()
    # grpclib alone: HEADERS+DATA from the client, HEADERS, DATA, trailers and a
    # WINDOW_UPDATE from the server, each its own write.
    assert len(tcp_sends) == 2 * calls, tcp_sends
