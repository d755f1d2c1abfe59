"""The fuzzer's client: requests sent on raw grpclib streams, with a pass-through
codec, so that any bytes and any framing reach the server; each call ends as an
`Outcome` within its deadline and a margin, whatever the server does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Final

import grpclib.client
import h2.exceptions
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from grpclib.metadata import decode_grpc_message

from tests.integration.orchestrator_wire import PassThroughCodec

from .generate import Request

# Outcomes a caller sees without a status from the server.
CLIENT_DEADLINE: Final = "CLIENT_DEADLINE"  # the caller's own deadline ran out first
READ_WINDOW: Final = "READ_WINDOW"  # a stream still open when the caller stopped reading
STREAM_RESET: Final = "STREAM_RESET"  # the server reset the stream
CONNECTION_LOST: Final = "CONNECTION_LOST"
HANG: Final = "HANG"  # the call outlived its deadline by HANG_MARGIN
CLIENT_ERROR: Final = "CLIENT_ERROR"  # the fuzzer's client failed: a finding too

# How far past its deadline a call may end before it counts as hung: the servers
# share this process's event loop with every worker, on slow shared cores.
HANG_MARGIN: Final = 3.0


@dataclass
class Outcome:
    """How a call ended, and what it was answered."""

    code: str  # a gRPC status by name, or one of the outcomes above
    message: str | None = None
    replies: list[bytes] = field(default_factory=list)
    elapsed: float = 0.0


class Caller:
    """Sends requests on raw streams of its own two channels (one per server)."""

    def __init__(self, addresses: dict[str, str]) -> None:
        self.channels = {
            server: grpclib.client.Channel(*host_port(address), codec=PassThroughCodec())
            for server, address in addresses.items()
        }

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()

    async def call(self, request: Request) -> Outcome:
        """Send `request`; read its replies to their end (or for its window)."""
        return await self._guarded(request, self._read, request)

    async def converse(self, request: Request, answer: Callable[[bytes], bytes]) -> Outcome:
        """Send `request.data`, then answer each reply with `answer(reply)` for
        `request.window` seconds; then end the stream and read it to its end."""
        return await self._guarded(request, self._answer, answer)

    async def _guarded(self, request: Request, exchange: Callable[..., Any], arg: Any) -> Outcome:
        started = time.monotonic()
        outcome = Outcome(HANG)
        try:
            async with asyncio.timeout(request.timeout + HANG_MARGIN):
                # A task of its own: grpclib cancels the task awaiting a call whose
                # connection closes, and that cancellation would stay with a worker.
                outcome = await asyncio.ensure_future(self._exchange(request, exchange, arg))
        except TimeoutError:
            pass  # only the guard raises it here (the exchange maps its own): it hung
        outcome.elapsed = time.monotonic() - started
        return outcome

    async def _exchange(self, request: Request, exchange: Callable[..., Any], arg: Any) -> Outcome:
        outcome = Outcome("OK")
        channel = self.channels[request.route.server]
        stream: Any = None
        try:
            async with channel.request(
                request.route.path, Cardinality.STREAM_STREAM, bytes, bytes,
                timeout=request.timeout,
            ) as stream:  # fmt: skip
                await stream.send_request()
                await exchange(stream, request, outcome, arg)
        except GRPCError as exc:
            outcome.code, outcome.message = exc.status.name, exc.message
        except TimeoutError:
            outcome.code = CLIENT_DEADLINE
        except (StreamTerminatedError, h2.exceptions.StreamClosedError):
            outcome.code = STREAM_RESET
        except (ConnectionError, OSError, ProtocolError):
            outcome.code = CONNECTION_LOST
        except Exception as exc:  # what the client never expects, whoever caused it
            outcome.code, outcome.message = CLIENT_ERROR, f"{type(exc).__name__}: {exc}"
            return outcome
        if outcome.code not in (CLIENT_DEADLINE, READ_WINDOW):
            _status_sent(stream, outcome)
        return outcome

    @staticmethod
    async def _read(stream: Any, request: Request, outcome: Outcome, _: Any) -> None:
        sending = asyncio.ensure_future(_send(stream, request))
        try:
            if request.window:
                try:
                    async with asyncio.timeout(request.window):
                        while (reply := await stream.recv_message()) is not None:
                            outcome.replies.append(reply)
                except TimeoutError:
                    outcome.code = READ_WINDOW
                    await _cancel(stream)
                    return
            else:
                while (reply := await stream.recv_message()) is not None:
                    outcome.replies.append(reply)
            stream._end_done = True  # ended on the wire by _send, or never to be
            await stream.recv_trailing_metadata()
            if not request.end:
                await _cancel(stream)
        finally:
            sending.cancel()
            await asyncio.gather(sending, return_exceptions=True)

    @staticmethod
    async def _answer(
        stream: Any, request: Request, outcome: Outcome, answer: Callable[[bytes], bytes]
    ) -> None:
        raw = stream._stream
        await raw.send_data(request.data)
        ended = False
        with suppress(TimeoutError):
            async with asyncio.timeout(request.window):
                while (reply := await stream.recv_message()) is not None:
                    outcome.replies.append(reply)
                    await raw.send_data(answer(reply))
                ended = True  # the server ended the stream first
        stream._end_done = stream._send_message_done = True
        if not ended:
            await raw.end()
            while (reply := await stream.recv_message()) is not None:
                outcome.replies.append(reply)
        await stream.recv_trailing_metadata()


async def _cancel(stream: Any) -> None:
    """Reset the stream, unless the server has closed it meanwhile."""
    with suppress(h2.exceptions.StreamClosedError, ProtocolError):
        await stream.cancel()


def _status_sent(stream: Any, outcome: Outcome) -> None:
    """The status the server sent, where grpclib's client reports another: it
    answers a headers-only reply without a content-type (grpclib's server sends one
    for an unknown method) as UNKNOWN, whatever its grpc-status says."""
    raw = getattr(stream, "_stream", None)
    for headers in (getattr(raw, "trailers", None), getattr(raw, "headers", None)):
        sent = dict(headers or ())
        if "grpc-status" in sent:
            outcome.code = Status(int(sent["grpc-status"])).name
            message = sent.get("grpc-message")
            outcome.message = decode_grpc_message(message) if message is not None else None
            return


async def _send(stream: Any, request: Request) -> None:
    raw = stream._stream  # grpclib's own send_message would frame it again
    data, step = request.data, request.chunk or len(request.data) or 1
    for at in range(0, len(data), step):
        last = at + step >= len(data)
        await raw.send_data(data[at : at + step], end_stream=request.end and last)
    if not data and request.end:
        await raw.end()
    stream._send_message_done = True


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)
