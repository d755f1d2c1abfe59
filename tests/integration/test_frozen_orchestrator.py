"""A client whose orchestrator stops answering while its TCP connection stays open
(a frozen process, a partition: here a proxy that stops forwarding) gives up on it
within its ping interval plus its ping timeout, and reaches its other candidate;
over TLS too (whose polite close would wait for the frozen peer). A standby that
names the frozen one as the active is not followed back to it for as long as a
standby may name a frozen active (its leader lease and a third, when it says it)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from tests.certs import Certs
from tests.faults.proxy import Proxy
from tests.waiting import until
from timeslice.agent.server import Agent
from timeslice.api.h2serve import Call, H2Server, Route
from timeslice.api.serving import listening_socket
from timeslice.client._connector import SHUN_SEC
from timeslice.client.orchestrator import AsyncTimeSliceOrchestratorClient
from timeslice.errors import Code
from timeslice.orchestrator.server import Orchestrator
from timeslice.security.tls import ServerTls
from timeslice.targets import ACTIVE_KEY, LEASE_KEY

pytestmark = pytest.mark.timeout(30)

PING_EVERY, PING_TIMEOUT = 0.2, 0.4


class FreezingProxy:
    """Forwards TCP to `upstream` until `freeze()`; then forwards nothing more in
    either direction, but keeps every connection open."""

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.rpartition(":")
        self._upstream = (host, int(port))
        self._frozen = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None
        self.address = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.address = "127.0.0.1:%d" % self._server.sockets[0].getsockname()[1]

    def freeze(self) -> None:
        self._frozen.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        self._writers += [writer, up_writer]
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.ensure_future(self._pump(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        while not self._frozen.is_set():
            data = await source.read(65536)
            if not data or self._frozen.is_set():
                break
            sink.write(data)
        await asyncio.Event().wait()  # frozen or ended: hold the connection open

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for writer in self._writers:
            writer.transport.abort()


@pytest.fixture(params=["plain", "tls"])
async def two(
    request: pytest.FixtureRequest, certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Orchestrator, Orchestrator, FreezingProxy]]:
    tls = None
    if request.param == "tls":
        tls = ServerTls(cert=certs.server.cert, key=certs.server.key)
        monkeypatch.setenv("TIMESLICE_TLS_CA", certs.ca)  # the clients' CA
    async with Orchestrator(tls=tls) as first, Orchestrator(tls=tls) as second:
        proxy = FreezingProxy(first.address)
        await proxy.start()
        try:
            yield first, second, proxy
        finally:
            await proxy.close()


async def test_a_client_leaves_a_frozen_orchestrator_within_its_ping_timeout(
    two: tuple[Orchestrator, Orchestrator, FreezingProxy],
) -> None:
    first, second, proxy = two
    await first.acquire("g", "x")  # the group is taken there: y waits
    client = AsyncTimeSliceOrchestratorClient(
        f"{proxy.address},{second.address}",
        "y",
        "g",
        lease_ttl_sec=None,
        ping_every_sec=PING_EVERY,
        ping_timeout_sec=PING_TIMEOUT,
    )
    try:
        waiting = asyncio.ensure_future(client.acquire(timeout_sec=15))
        await asyncio.sleep(0.3)
        assert list(first.table.groups["g"].queue) == ["y"]
        frozen = time.monotonic()
        proxy.freeze()
        granted = await asyncio.wait_for(waiting, 10)
        took = time.monotonic() - frozen
        assert second.table.groups["g"].holder is not None
        assert second.table.groups["g"].holder.job == "y"
        assert granted.fencing_token == second.table.groups["g"].holder.token
        # Within one ping interval, the ping's timeout and a retry's pause.
        assert took < PING_EVERY + PING_TIMEOUT + 0.5, took
    finally:
        with contextlib.suppress(Exception):
            await client.close()


async def test_pings_can_be_turned_off(
    two: tuple[Orchestrator, Orchestrator, FreezingProxy],
) -> None:
    first, second, proxy = two
    await first.acquire("g", "x")
    client = AsyncTimeSliceOrchestratorClient(
        f"{proxy.address},{second.address}", "y", "g", lease_ttl_sec=None, ping_every_sec=None
    )
    try:
        waiting = asyncio.ensure_future(client.acquire(timeout_sec=15))
        await asyncio.sleep(0.3)
        proxy.freeze()
        await asyncio.sleep(PING_EVERY + PING_TIMEOUT + 0.5)
        assert not waiting.done()  # nothing notices: the connection looks open
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
    finally:
        await client.close()


@dataclass
class FrozenBehindStandby:
    """F: an orchestrator behind a proxy (cut: frozen; healed: answering again); S: a
    standby at `standby` that refuses `route`, naming F as the active (with its lease
    of 300 ms when `says_lease`), and notes when in `refusals`."""

    proxy: Proxy
    front: str  # F's address
    standby: str
    refusals: list[float]


@contextlib.asynccontextmanager
async def frozen_behind_standby(
    active: Orchestrator, route: str, *, says_lease: bool = True
) -> AsyncIterator[FrozenBehindStandby]:
    host, _, port = active.address.rpartition(":")
    proxy = Proxy(host, int(port))
    await proxy.start()
    front = f"127.0.0.1:{proxy.port}"
    refusals: list[float] = []

    async def refuse(call: Call) -> None:
        refusals.append(time.monotonic())
        trailers = [(ACTIVE_KEY, front)] + ([(LEASE_KEY, "300")] if says_lease else [])
        call.finish(Code.UNAVAILABLE, "this orchestrator is a standby", trailers)

    server = H2Server({route: Route(refuse)})
    sock = listening_socket("127.0.0.1", 0)
    await server.start(sock)
    try:
        yield FrozenBehindStandby(
            proxy=proxy,
            front=front,
            standby=f"127.0.0.1:{sock.getsockname()[1]}",
            refusals=refusals,
        )
    finally:
        await server.stop()
        await proxy.close()


@pytest.mark.parametrize("says_lease", [True, False], ids=["lease said", "no lease said"])
@pytest.mark.parametrize("http2", ["h2core", "grpclib"])
async def test_a_candidate_left_frozen_is_followed_again_once_a_standby_may_name_it_anew(
    http2: str, says_lease: bool
) -> None:
    """The client gives up on frozen F, and S sends it back there: not at once (a
    standby names a frozen active until its lease runs out), but, once S has said its
    lease (300 ms), no longer after than a standby may name it; without that word, for
    `SHUN_SEC` as before."""
    acquire = "/timeslice_orchestrator.v1alpha1.TimeSliceOrchestratorService/Acquire"
    async with (
        Orchestrator() as active,
        frozen_behind_standby(active, acquire, says_lease=says_lease) as f,
    ):
        client = AsyncTimeSliceOrchestratorClient(
            f"{f.front},{f.standby}",
            "x",
            "g",
            lease_ttl_sec=None,
            reconnect_timeout_sec=15,
            http2=http2,
            ping_every_sec=0.1,
            ping_timeout_sec=0.3,
        )
        try:
            f.proxy.cut()  # F frozen: its connections open, nothing passes
            granted = asyncio.ensure_future(client.acquire(timeout_sec=12))
            await until(lambda: bool(f.refusals), "the client gives up on F", timeout=5)
            f.proxy.heal()  # F answers again (as if restarted and elected anew)
            if says_lease:
                await asyncio.wait_for(granted, 1.5)  # 0.4 s passed over, and backoff
                assert time.monotonic() - f.refusals[0] < 1.5
            else:
                await asyncio.sleep(1.5)
                assert not granted.done()  # S's word is not followed back to F yet
                await asyncio.wait_for(granted, SHUN_SEC + 2)
                assert time.monotonic() - f.refusals[0] > SHUN_SEC - 0.5
            assert active.table.groups["g"].holder is not None
        finally:
            await client.close()


async def test_an_agent_left_a_frozen_orchestrator_goes_back_once_a_standby_may_name_it_anew() -> (
    None
):
    """The same for an agent's session, which a standby refuses while a report is on
    its way: the refusal's trailers (the active, the lease) still reach its connector."""
    session = "/timeslice_orchestrator.v1alpha1.TimeSliceOrchestratorService/AgentSession"
    async with Orchestrator() as active, frozen_behind_standby(active, session) as f:
        f.proxy.cut()
        async with Agent(node_name="n1", backends=("noop",), orchestrator=f"{f.front},{f.standby}"):
            await until(lambda: bool(f.refusals), "the agent gives up on F", timeout=5)
            f.proxy.heal()
            await until(lambda: active.agents.in_session("n1"), "back to F", timeout=8)
            took = time.monotonic() - f.refusals[0]
            assert took < 1.5, f"the agent came back {took:.2f} s after the first refusal"
