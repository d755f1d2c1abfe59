"""How a client command reaches a server: the target options, the credentials it
calls with, the retry window, one line for an unreachable server, and the wait
for Ctrl-C. Every command that calls the orchestrator or an agent runs through
here, so that they all read the same options and fail the same way."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated

import anyio
import typer

from timeslice.cli_credentials import ClientCredentials
from timeslice.cli_errors import Scope, user_errors
from timeslice.errors import TimeSliceError

if TYPE_CHECKING:
    from timeslice.client import AsyncSnapshotAgentClient, AsyncTimeSliceOrchestratorClient

DEFAULT_TARGET = "127.0.0.1:50051"
Target = Annotated[
    str,
    typer.Option(
        "--target",
        "-t",
        help="Orchestrator address HOST:PORT, or several separated by commas (the"
        " active one is found).",
    ),
]
# The agent documents no default Unix socket (`serve agent --socket` is optional),
# so its default TCP port on this machine.
DEFAULT_AGENT_TARGET = "127.0.0.1:9001"
AgentTarget = Annotated[
    str, typer.Option("--target", "-t", help="Agent address HOST:PORT or unix:PATH.")
]

# How long a command retries a server it cannot reach before it says so: a
# person at a terminal wants the answer soon (a program's client waits 30 s).
CLI_RECONNECT_SEC = 5.0


def with_client(
    target: str,
    action: Callable[[AsyncTimeSliceOrchestratorClient], Awaitable[None]],
    credentials: Callable[[], ClientCredentials] = ClientCredentials,
) -> None:
    """Run `action` with a client of the orchestrator at `target`; report errors plainly.
    Operator commands hold no lease: a lock they take stays until `timeslice yield`."""
    from timeslice.client import AsyncTimeSliceOrchestratorClient

    async def run(given: ClientCredentials) -> None:
        async with AsyncTimeSliceOrchestratorClient(
            target,
            lease_ttl_sec=None,
            reconnect_timeout_sec=CLI_RECONNECT_SEC,
            tls=given.tls,
            token=given.token,
        ) as client:
            await action(client)

    _run(target, Scope(target=target), run, credentials)


def with_agent(
    target: str,
    action: Callable[[AsyncSnapshotAgentClient], Awaitable[None]],
    credentials: Callable[[], ClientCredentials] = ClientCredentials,
) -> None:
    """Run `action` with a client of the agent at `target`; report errors plainly."""
    from timeslice.client import AsyncSnapshotAgentClient

    async def run(given: ClientCredentials) -> None:
        async with AsyncSnapshotAgentClient(
            target, reconnect_timeout_sec=CLI_RECONNECT_SEC, tls=given.tls, token=given.token
        ) as client:
            await action(client)

    _run(target, Scope(target=target, server="the agent"), run, credentials)


def _run(
    target: str,
    scope: Scope,
    run: Callable[[ClientCredentials], Awaitable[None]],
    credentials: Callable[[], ClientCredentials],
) -> None:
    from timeslice.targets import parse_targets

    with user_errors(scope):
        try:
            parse_targets(target)
        except TimeSliceError as exc:
            raise typer.BadParameter(f"--target: {exc}") from None
        anyio.run(run, credentials())


def credentials_of(
    ca: str | None, cert: str | None, key: str | None, token: str | None
) -> Callable[[], ClientCredentials]:
    """A client command's credentials, read when the command runs (a bad file is
    then reported as the command's error)."""
    from timeslice.cli_credentials import client_credentials

    return lambda: client_credentials(ca, cert, key, token)


class Signals:
    """SIGINT and SIGTERM, caught from `with` to its end: a signal sets `received`
    and stays set, so that one which comes between two waits (while a server's start
    ends, say) is kept for the next wait instead of being lost or left to the
    default action."""

    def __init__(self) -> None:
        self.received = asyncio.Event()

    def __enter__(self) -> Signals:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.received.set)
        return self

    def __exit__(self, *exc: object) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)

    async def wait_or(self, stopped: Awaitable[object]) -> bool:
        """Wait for a signal (one received before counts) or until `stopped`
        completes, whichever is first; `stopped` is cancelled if it has not
        completed. True if a signal was received."""
        waits = [asyncio.ensure_future(self.received.wait()), asyncio.ensure_future(stopped)]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return self.received.is_set()


async def until_signal_or(stopped: Awaitable[object]) -> None:
    """Wait for SIGINT or SIGTERM, or until `stopped` completes."""
    with Signals() as signals:
        await signals.wait_or(stopped)
