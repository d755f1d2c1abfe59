"""The operator's commands: `timeslice --version`, `watch`, `inspect` and
`agent status`, and the `--json` flag they share with `status`.

Each command parses its options, calls the orchestrator or an agent through
`cli_client` (the same targets, credentials, retry window and one-line errors as
every client command), and prints what `cli_views` makes of the answer. Heavy
modules are imported inside the commands, so that `timeslice --help` stays fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from timeslice import cli_client
from timeslice.cli_client import (
    DEFAULT_AGENT_TARGET,
    DEFAULT_TARGET,
    AgentTarget,
    Target,
    credentials_of,
    until_signal_or,
    with_agent,
    with_client,
)
from timeslice.cli_credentials import ClientTlsCert, ClientTlsKey, TlsCa, Token

if TYPE_CHECKING:
    from timeslice.client import AsyncSnapshotAgentClient, AsyncTimeSliceOrchestratorClient
    from timeslice.client.types import WatchEvent

JsonOutput = Annotated[
    bool,
    typer.Option(
        "--json", help="Print one JSON document (keys: README, Watching and checking a cluster)."
    ),
]
JsonLines = Annotated[
    bool, typer.Option("--json", help="Print each event as one line of JSON instead of text.")
]
# After a watch's stream breaks, how long to wait before each new try.
_WATCH_RETRY_SEC = 0.25


def show_version(value: bool) -> None:
    """The eager `--version` option: print the package's version and exit 0."""
    if value:
        from timeslice.versions import package_version

        typer.echo(f"timeslice {package_version()}")
        raise typer.Exit()


VersionOption = Annotated[
    bool,
    typer.Option(
        "--version",
        callback=show_version,
        is_eager=True,
        help="Print the installed timeslice version and exit.",
    ),
]


def watch(
    group: Annotated[str | None, typer.Argument(help="One group; all groups when omitted.")] = None,
    json_lines: JsonLines = False,
    target: Target = DEFAULT_TARGET,
    tls_ca: TlsCa = None,
    tls_cert: ClientTlsCert = None,
    tls_key: ClientTlsKey = None,
    token: Token = None,
) -> None:
    """Print the orchestrator's events live, one line each, until Ctrl-C.

    Each group's current state comes first. A lost connection is tried again for 5 s.
    """
    from timeslice.cli_views import dumps, event_json, event_line

    def emit(event: WatchEvent) -> None:
        typer.echo(dumps(event_json(event)) if json_lines else event_line(event))

    async def follow(client: AsyncTimeSliceOrchestratorClient) -> None:
        task = asyncio.ensure_future(_follow(client, group or "", emit))
        await until_signal_or(task)
        if task.done() and not task.cancelled():
            task.result()  # the stream's error, reported as the command's
        with contextlib.suppress(asyncio.CancelledError):
            await task

    with_client(target, follow, credentials_of(tls_ca, tls_cert, tls_key, token))


async def _follow(
    client: AsyncTimeSliceOrchestratorClient, group: str, emit: Callable[[WatchEvent], None]
) -> None:
    """Emit every event of the watch; open it again while the orchestrator is away
    for less than `cli_client.CLI_RECONNECT_SEC`, then raise what the last try raised."""
    from timeslice.errors import UnavailableError

    away_since: float | None = None
    while True:
        try:
            async for event in client.watch(group):
                away_since = None
                emit(event)
            raise UnavailableError("the orchestrator ended the watch")
        except UnavailableError:
            now = time.monotonic()
            away_since = now if away_since is None else away_since
            if now - away_since >= cli_client.CLI_RECONNECT_SEC:
                raise
        await asyncio.sleep(_WATCH_RETRY_SEC)


def inspect(
    json_output: JsonOutput = False,
    target: Target = DEFAULT_TARGET,
    tls_ca: TlsCa = None,
    tls_cert: ClientTlsCert = None,
    tls_key: ClientTlsKey = None,
    token: Token = None,
) -> None:
    """Check the agents the orchestrator knows: reachable, same version, one per node.

    Prints the agents, then one line per problem with what to do; exit status 1
    when anything is wrong.
    """
    from timeslice.cli_views import dumps, inspect_json, inspect_lines, problems

    wrong_found: list[bool] = []

    async def check(client: AsyncTimeSliceOrchestratorClient) -> None:
        found = await client.list_agents()
        wrong = problems(found, target)
        if json_output:
            typer.echo(dumps(inspect_json(target, found, wrong)))
        else:
            for line in inspect_lines(target, found, wrong):
                typer.echo(line)
        wrong_found.append(bool(wrong))

    with_client(target, check, credentials_of(tls_ca, tls_cert, tls_key, token))
    if any(wrong_found):
        raise typer.Exit(1)


agent_app = typer.Typer(help="Ask a node's agent directly.", no_args_is_help=True)

# The agent's own TLS and token options: the same flags as every client command.
AgentCa = Annotated[
    str | None,
    typer.Option(
        "--tls-ca",
        help="Connect to the agent over TLS, trusting this CA (PEM).",
        rich_help_panel="Credentials",
    ),
]
AgentCert = Annotated[
    str | None,
    typer.Option(
        "--tls-cert",
        help="The client certificate to show the agent (its mTLS).",
        rich_help_panel="Credentials",
    ),
]
AgentKey = Annotated[
    str | None,
    typer.Option("--tls-key", help="The private key of --tls-cert.", rich_help_panel="Credentials"),
]


@agent_app.command("status")
def agent_status(
    json_output: JsonOutput = False,
    target: AgentTarget = DEFAULT_AGENT_TARGET,
    tls_ca: AgentCa = None,
    tls_cert: AgentCert = None,
    tls_key: AgentKey = None,
    token: Token = None,
) -> None:
    """Print an agent's node, version, jobs and accelerators' memory.

    Each job with its state, backend, liveness, fault and, for a registered
    workload, where it keeps an offloaded context (store).
    """
    from timeslice.cli_views import agent_status_json, agent_status_lines, dumps

    async def show(client: AsyncSnapshotAgentClient) -> None:
        answer = await client.status()
        if json_output:
            typer.echo(dumps(agent_status_json(target, answer)))
        else:
            for line in agent_status_lines(target, answer):
                typer.echo(line)

    with_agent(target, show, credentials_of(tls_ca, tls_cert, tls_key, token))
