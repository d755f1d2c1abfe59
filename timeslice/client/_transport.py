"""What every timeslice client does on the wire: open a channel (TLS, and a
bearer token on every call), translate errors, retry a call while the server
cannot be reached."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import betterproto2
from betterproto2.grpclib.grpclib_client import ServiceStub
from grpclib.client import Channel
from grpclib.config import Configuration
from grpclib.events import SendRequest, listen
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.protocol import H2Protocol

from timeslice.api import hot
from timeslice.api.coalesce import Coalesced
from timeslice.api.h2client import H2Channel
from timeslice.api.status import from_grpc_error
from timeslice.api.wire import decode_strict
from timeslice.errors import (
    ConflictError,
    DeadlineExceededError,
    InternalError,
    PermissionDeniedError,
    TimeSliceError,
    UnavailableError,
)
from timeslice.ids import Target
from timeslice.security.tls import ClientTls, check_token, token_from_env

T = TypeVar("T")
M = TypeVar("M", bound=betterproto2.Message)

FIRST_BACKOFF_SEC = 0.05
MAX_BACKOFF_SEC = 1.0
FAILOVER_BACKOFF_SEC = 0.25


async def call_prepared(
    via: ServiceStub | H2Channel,
    route: str,
    request: bytes,
    reply_type: type[M],
    timeout: float | None,
) -> M:
    """One unary call whose request is encoded already (`timeslice.api.hot`), sent
    through `via`: an `H2Channel`, or a grpclib stub's channel. Its answer is read as
    strictly as a server reads a request, in one pass where it is flat
    (`decode_strict`): a malformed answer is an `InternalError` of its own, never
    half read. A grpclib call runs in a task of its own (`in_own_task`), an
    `H2Channel`'s in the caller's: so it can be tried with `own_task=False`."""
    if isinstance(via, H2Channel):
        data = await via.unary(route, request, timeout)
    else:
        # Both messages pass the stub as bytes, which its types do not say it takes.
        answer = await in_own_task(
            via._unary_unary(  # type: ignore[type-var]
                route,
                hot.Prepared(request),
                hot.Prepared,
                timeout=timeout,
            )
        )
        data = answer.data
    try:
        return decode_strict(reply_type, data)
    except ValueError as exc:
        raise InternalError(
            f"the answer to {route.rsplit('/', 1)[-1]} is malformed: {exc}"
        ) from None


def open_unary(
    target: Target,
    tls: ClientTls | None,
    token: str | None,
    pings: tuple[float, float] | None = None,
    server_hostname: str | None = None,
) -> H2Channel:
    """An `H2Channel` to `target` for unary calls, with the credentials `open_channel`
    gives a grpclib channel (TLS on TCP targets only, checking `server_hostname` if
    given, else the target's host; the bearer token on every call), and `pings`
    (see `timeslice.api.h2client`)."""
    context = tls_context(target, tls)
    metadata = [("authorization", f"Bearer {token}")] if token else []
    return H2Channel(
        target.host or "",
        target.port or 0,
        path=target.path,
        ssl=context,
        metadata=metadata,
        pings=pings,
        server_hostname=server_hostname,
    )


def tls_context(target: Target, tls: ClientTls | None) -> ssl.SSLContext | None:
    """The TLS context a connection to `target` takes: `tls`'s, on TCP targets only
    (a Unix socket is local, and its peer credentials say who calls)."""
    return tls.context() if tls is not None and target.path is None else None


def credentials(
    tls: ClientTls | None, token: str | None, from_env: bool = True
) -> tuple[ClientTls | None, str | None]:
    """A client's TLS and bearer token: those given, else (with `from_env`) those
    of TIMESLICE_TLS_CA/CERT/KEY and TIMESLICE_TOKEN. Checked here, so that a bad
    one fails when the client is made."""
    if tls is None and from_env:
        tls = ClientTls.from_env()
    if token is None and from_env:
        token = token_from_env()
    return tls, (check_token(token) if token else None)


def open_channel(
    target: Target,
    tls: ClientTls | None,
    token: str | None,
    config: Configuration | None = None,
) -> Channel:
    """A channel to `target`: over TLS when `tls` is given (TCP targets only: a Unix
    socket is local, and its peer credentials say who calls), with
    `authorization: Bearer <token>` on every call and stream when `token` is;
    `config`: grpclib's (pings, the TLS server name)."""
    context = tls_context(target, tls)
    channel = Channel(target.host, target.port, path=target.path, ssl=context, config=config)
    _coalesce_writes(channel)
    if token:
        value = f"Bearer {token}"

        async def add_token(event: SendRequest) -> None:
            event.metadata["authorization"] = value

        listen(channel, SendRequest, add_token)
    return channel


def _coalesce_writes(channel: Channel) -> None:
    """Make `channel`'s connections send what they write in one turn of the event
    loop in one write (see `timeslice.api.coalesce`)."""
    make = channel._protocol_factory

    def factory() -> H2Protocol:
        protocol = make()
        made = protocol.connection_made

        def connection_made(transport: Any) -> None:
            made(Coalesced(transport))

        setattr(protocol, "connection_made", connection_made)  # noqa: B010 (an instance's method)
        return protocol

    setattr(channel, "_protocol_factory", factory)  # noqa: B010


def close_channel(channel: Channel) -> None:
    """Close `channel`'s connection now. A TLS connection is dropped at once rather
    than shut down politely: that exchange needs the event loop for another round
    trip, and a blocking client's loop stops right after it closes, which would
    leave the socket open."""
    protocol = getattr(channel, "_protocol", None)
    connection = getattr(protocol, "connection", None)
    transport = getattr(connection, "_transport", None)
    # Asked before the close: an aborted TLS transport answers nothing more.
    tls = transport is not None and transport.get_extra_info("ssl_object") is not None
    channel.close()
    if tls and transport is not None:
        transport.abort()


@contextlib.contextmanager
def map_errors(
    what: str,
    conflict: type[ConflictError] = ConflictError,
    denied: type[TimeSliceError] = PermissionDeniedError,
) -> Iterator[None]:
    """Turns what grpclib and the socket layer raise into timeslice exceptions
    (`conflict` and `denied`: see `from_grpc_error`)."""
    try:
        yield
    except TimeSliceError:
        raise
    except GRPCError as error:
        raise from_grpc_error(error, conflict, denied) from error
    # TimeoutError is an OSError: it must be caught first.
    except TimeoutError as error:
        raise DeadlineExceededError(f"{what}: the call's deadline ran out") from error
    except StreamTerminatedError as error:
        raise UnavailableError(f"{what}: {error or 'the stream was reset'}") from error
    except ssl.SSLCertVerificationError as error:
        raise UnavailableError(
            f"{what}: the server's certificate is not trusted: {error.verify_message}"
        ) from error
    except OSError as error:
        raise UnavailableError(f"{what}: {error or type(error).__name__}") from error


async def in_own_task(call: Awaitable[T]) -> T:
    """Awaits a grpclib call in a task of its own, and returns what it returns.

    grpclib cancels the task that awaits a call when the call's connection
    closes or its deadline passes, and raises its own error there, but never
    takes the cancellation back: that task's `cancelling()` stays raised for
    the rest of its life, and the next `asyncio.timeout` or cancel check in it
    takes the job for cancelled. Here that task is this one's child, gone
    once the call ends. Cancelling the caller still ends the call: awaiting
    a task passes the cancellation on to it.
    """
    return await asyncio.ensure_future(call)


@contextlib.asynccontextmanager
async def own_tasks(items: AsyncIterator[T]) -> AsyncIterator[AsyncIterator[T]]:
    """The items of a grpclib stream, each read in a task of its own (see
    `in_own_task`); closes the stream at the end."""

    async def read() -> AsyncGenerator[T, None]:
        while True:
            try:
                item = await in_own_task(anext(items))
            except StopAsyncIteration:
                return
            yield item

    reader = read()
    try:
        yield reader
    finally:
        await reader.aclose()
        if isinstance(items, AsyncGenerator):
            await in_own_task(items.aclose())


def backoff_delays(cap: float = MAX_BACKOFF_SEC) -> Iterator[float]:
    """Pauses between retries: 50 ms, doubling, at most `cap` (1 s)."""
    delay = FIRST_BACKOFF_SEC
    while True:
        yield delay
        delay = min(delay * 2, cap)


def backoff_cap(candidates: int) -> float:
    """The longest pause between retries for a client of `candidates` orchestrators:
    with standbys, a takeover is under way while they refuse, and the new active is
    worth finding within a quarter of a second of it; one server alone is waited for
    as before. A refusal costs a standby next to nothing."""
    return FAILOVER_BACKOFF_SEC if candidates > 1 else MAX_BACKOFF_SEC


async def call_with_retry(
    attempt: Callable[[float | None], Awaitable[T]],
    *,
    what: str,
    budget_sec: float | None,
    reconnect_timeout_sec: float,
    conflict: type[ConflictError] = ConflictError,
    denied: type[TimeSliceError] = PermissionDeniedError,
    max_backoff_sec: float = MAX_BACKOFF_SEC,
    own_task: bool = True,
) -> T:
    """Runs `attempt(seconds_left)` again while the server cannot be reached.

    `seconds_left` is what remains of `budget_sec` (None: no limit). Gives up with
    `UnavailableError` after `reconnect_timeout_sec` of continuous failure, or with
    `DeadlineExceededError` when the budget runs out first. Every other error is
    raised at once. Each attempt must be safe to repeat. It runs in a task of its
    own (`in_own_task`), unless `own_task` is False: an attempt that puts its
    grpclib calls in tasks of their own (`call_prepared` does) saves the hop, a
    turn of the loop before the request leaves.
    """
    loop = asyncio.get_running_loop()
    deadline = None if budget_sec is None else loop.time() + budget_sec
    failing_since: float | None = None
    last_error: UnavailableError | None = None
    delays = backoff_delays(max_backoff_sec)
    while True:
        left = None if deadline is None else deadline - loop.time()
        if left is not None and left <= 0 and last_error is not None:
            raise DeadlineExceededError(
                f"{what}: the time limit ran out while the server was unreachable"
                f" ({last_error.message})"
            ) from last_error
        try:
            with map_errors(what, conflict, denied):
                return await (in_own_task(attempt(left)) if own_task else attempt(left))
        except UnavailableError as error:
            if isinstance(error.__cause__, ssl.SSLCertVerificationError):
                raise  # the same certificate is not trusted on the next try either
            last_error = error
            now = loop.time()
            if failing_since is None:
                failing_since = now
            if now - failing_since >= reconnect_timeout_sec:
                raise
            pause = min(next(delays), failing_since + reconnect_timeout_sec - now)
            if deadline is not None:
                pause = min(pause, max(0.0, deadline - now))
            await asyncio.sleep(pause)
