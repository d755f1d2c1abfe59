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
            sent = list(tcp_sends)  # the calls' writes, not the closes' after them
    # grpclib alone: HEADERS+DATA from the client, HEADERS, DATA, trailers and a
    # WINDOW_UPDATE from the server, each its own write.
    assert len(sent) == 2 * calls, sent


@pytest.mark.parametrize("http2", ["h2core", "grpclib"])
async def test_each_call_of_a_cycle_is_one_write_from_each_end(
    tcp_sends: list[int], http2: str
) -> None:
    """Acquire and Yield, on our own client (and on grpclib's, coalesced)."""
    async with Orchestrator() as orch:
        async with AsyncTimeSliceOrchestratorClient(
            orch.address, "a", "g", lease_ttl_sec=None, http2=http2
        ) as client:
            for _ in range(3):  # connected, and past every first-call exchange
                await client.acquire()
                await client.release()
            tcp_sends.clear()
            cycles = 10
            for _ in range(cycles):
                await client.acquire()
                await client.release()
            sent = list(tcp_sends)
    assert len(sent) == 2 * 2 * cycles, sent
