"""The `timeslice` command line. It parses options, builds the same classes a
program embeds, and runs them; nothing here decides anything on its own."""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING, Annotated

import anyio
import typer

from timeslice.cli_client import DEFAULT_TARGET, Target
from timeslice.cli_client import credentials_of as _credentials
from timeslice.cli_client import Signals as _Signals
from timeslice.cli_client import with_client as _with_client
from timeslice.cli_ops import JsonOutput, VersionOption, agent_app, inspect, watch
from timeslice.cli_credentials import (
    AgentTlsCa,
    AgentTlsCert,
    AgentTlsKey,
    AuthFile,
    ClientTlsCert,
    ClientTlsKey,
    Insecure,
    OrchestratorTlsCa,
    OrchestratorTlsCert,
    OrchestratorTlsKey,
    TlsCa,
    TlsCert,
    TlsClientCa,
    TlsKey,
    Token,
)
from timeslice.cli_env import EnvCommand, environment_note, given, source_name
from timeslice.cli_errors import CommandError, Scope, debugging, shown, user_errors
from timeslice.errors import TimeSliceError
from timeslice.logs import LOG_FORMATS, LOG_LEVELS, announce

if TYPE_CHECKING:
    from pathlib import Path

    from timeslice.client import AsyncTimeSliceOrchestratorClient

app = typer.Typer(
    help="Share accelerators between RL jobs, one holder at a time.",
    no_args_is_help=True,
    # a traceback's locals would show a journal URL's password
    pretty_exceptions_show_locals=False,
)
serve_app = typer.Typer(
    help="Run a timeslice server until Ctrl-C or SIGTERM.", no_args_is_help=True
)
app.add_typer(serve_app, name="serve")

LogLevel = Annotated[
    str, typer.Option(help="DEBUG, INFO, WARNING, ERROR or CRITICAL (in any case).")
]
LogFormat = Annotated[
    str,
    typer.Option(help="text (for a person) or json (one object per line, for a log pipeline)."),
]
MetricsPort = Annotated[
    int,
    typer.Option(help="Serve /metrics, /healthz and /readyz over HTTP on this port (0: off)."),
]
MetricsHost = Annotated[
    str | None, typer.Option(help="Address of the metrics port (default: --host).")
]
Http2 = Annotated[
    str | None,
    typer.Option(
        help="The HTTP/2 server it runs on: h2core (ours, the default) or grpclib (grpclib's)."
    ),
]


@app.callback()
def app_options(
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            envvar="TIMESLICE_DEBUG",
            help="On an error, print the traceback above its one-line message.",
        ),
    ] = False,
    version: VersionOption = False,
) -> None:
    """Share accelerators between RL jobs, one holder at a time."""
    debugging.set(debug)


def _setup_logging(ctx: typer.Context, level: str, log_format: str) -> None:
    if level.upper() not in LOG_LEVELS:
        raise typer.BadParameter(
            f"{source_name(ctx, 'log_level', '--log-level')}: unknown level {level!r};"
            f" use one of {', '.join(LOG_LEVELS)}"
        )
    if log_format.lower() not in LOG_FORMATS:
        raise typer.BadParameter(
            f"{source_name(ctx, 'log_format', '--log-format')}: unknown format"
            f" {log_format!r}; use one of {', '.join(LOG_FORMATS)}"
        )
    from timeslice.logs import setup_logging

    setup_logging(level.upper(), log_format.lower())


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _parse_pairs(values: list[str], form: str, allow_empty: bool = False) -> dict[str, str]:
    """KEY=VALUE options (`form` says what is expected) as a dict."""
    pairs: dict[str, str] = {}
    for value in values:
        key, sep, item = value.partition("=")
        if not sep or not key or not (item or allow_empty):
            raise typer.BadParameter(f"expected {form}, got {value!r}")
        pairs[key] = item
    return pairs


def _parse_nodes(values: list[str]) -> dict[str, tuple[str, ...]]:
    pairs = _parse_pairs(values, "GROUP=HOST:PORT[,HOST:PORT...]")
    return {
        group: tuple(a.strip() for a in v.split(",") if a.strip()) for group, v in pairs.items()
    }


def _parse_limits(values: list[str]) -> dict[str, float | None]:
    limits: dict[str, float | None] = {}
    for group, seconds in _parse_pairs(values, "GROUP=SECONDS", allow_empty=True).items():
        try:
            limits[group] = float(seconds) if seconds not in ("", "none") else None
        except ValueError:
            raise typer.BadParameter(f"not a number of seconds: {seconds!r}") from None
    return limits


@serve_app.command("orchestrator", cls=EnvCommand)
def serve_orchestrator(
    ctx: typer.Context,
    config_file: Annotated[
        str | None,
        typer.Option(
            "--config",
            help="A TOML file of these settings (group_nodes, hold_limits, policies as"
            " tables); options given here win over it.",
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 50051,
    db: Annotated[
        str,
        typer.Option(
            help="Journal: a file path, sqlite:///REL/PATH (relative), sqlite:////ABS/PATH,"
            " postgresql://..., or 'memory'."
        ),
    ] = "sqlite:///timeslice-journal.db",
    hold_limit: Annotated[
        float | None, typer.Option(help="Longest any job may hold a group, in seconds.")
    ] = None,
    hold_grace: Annotated[
        float,
        typer.Option(help="At the hold limit, ask the holder to yield; revoke it this much later."),
    ] = 0.0,
    group_hold_limit: Annotated[
        list[str] | None,
        typer.Option(help="GROUP=SECONDS, a hold limit for one group; repeatable."),
    ] = None,
    recovery_grace: Annotated[
        float, typer.Option(help="After a restart, seconds that queued jobs have to come back.")
    ] = 30.0,
    policy: Annotated[
        str, typer.Option(help="How groups pick their next holder: fifo, lrs or priority.")
    ] = "fifo",
    group_policy: Annotated[
        list[str] | None, typer.Option(help="GROUP=POLICY for one group; repeatable.")
    ] = None,
    priority_aging: Annotated[
        float, typer.Option(help="Under the priority policy, seconds waited that add one.")
    ] = 60.0,
    group_nodes: Annotated[
        list[str] | None,
        typer.Option(
            help="GROUP=NODE[,NODE...]: a group's nodes, as node names of agents that"
            " register themselves or as agent addresses HOST:PORT; repeatable."
        ),
    ] = None,
    switch_timeout: Annotated[
        float, typer.Option(help="Longest a switch of contexts on a group's nodes may take, s.")
    ] = 120.0,
    revoked_snapshot_timeout: Annotated[
        float | None,
        typer.Option(
            help="Longest the snapshot of a holder revoked without yielding may take, s"
            " (default 30)."
        ),
    ] = None,
    journal_retention: Annotated[
        float | None,
        typer.Option(
            help="Seconds journaled events stay once a snapshot covers them; 0: none"
            " (default 86400)."
        ),
    ] = None,
    max_connections: Annotated[
        int | None, typer.Option(help="Connections at once (default 1024).")
    ] = None,
    max_watchers: Annotated[
        int | None, typer.Option(help="Watch streams at once (default 1024).")
    ] = None,
    max_groups: Annotated[
        int | None, typer.Option(help="Groups known at most (default 10000).")
    ] = None,
    max_waiters_per_group: Annotated[
        int | None, typer.Option(help="Jobs waiting for one group at most (default 10000).")
    ] = None,
    kubernetes: Annotated[
        bool,
        typer.Option(
            "--kubernetes",
            help="Learn groups and their nodes from node labels group.timeslice.io/GROUP=true,"
            " and jobs from pod labels timeslice.io/job-id and timeslice.io/group"
            " (needs timeslice[kubernetes]).",
        ),
    ] = False,
    kubeconfig: Annotated[
        str | None,
        typer.Option(
            help="With --kubernetes: reach the cluster through this kubeconfig file"
            " (default: the pod's in-cluster service account)."
        ),
    ] = None,
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    tls_client_ca: TlsClientCa = None,
    auth: AuthFile = None,
    insecure: Insecure = False,
    agent_tls_ca: AgentTlsCa = None,
    agent_tls_cert: AgentTlsCert = None,
    agent_tls_key: AgentTlsKey = None,
    log_level: LogLevel = "INFO",
    log_format: LogFormat = "text",
    metrics_port: MetricsPort = 0,
    metrics_host: MetricsHost = None,
    http2: Http2 = None,
    leader_lease: Annotated[
        float | None,
        typer.Option(
            help="On a PostgreSQL journal: seconds of the leader lease; a second"
            " orchestrator on the database waits as a standby and takes over once the"
            " active's lease runs out (default 5)."
        ),
    ] = None,
    advertise: Annotated[
        str | None,
        typer.Option(
            help="HOST:PORT clients reach this orchestrator at, which a standby names to"
            " the clients it refuses (default: --host and --port, unless a wildcard)."
        ),
    ] = None,
) -> None:
    """Serve the orchestrator (the lock service) on HOST:PORT.

    Without TLS and --auth it listens on loopback only (unless --insecure). It calls
    the agents with --agent-tls-* and the token of $TIMESLICE_AGENT_TOKEN."""
    from timeslice.api.serving import tune_gc_for_serving
    from timeslice.cli_credentials import ENV_AGENT_TOKEN, client_tls, env_token, serve_security
    from timeslice.config_file import read_orchestrator_config
    from timeslice.orchestrator.server import Orchestrator, OrchestratorConfig

    # option name -> (OrchestratorConfig field, value)
    options = {
        "host": ("host", host),
        "port": ("port", port),
        "db": ("db", db),
        "hold_limit": ("hold_limit", hold_limit),
        "hold_grace": ("hold_grace", hold_grace),
        "group_hold_limit": ("hold_limits", _parse_limits(group_hold_limit or [])),
        "recovery_grace": ("recovery_grace", recovery_grace),
        "group_nodes": ("group_nodes", _parse_nodes(group_nodes or [])),
        "policy": ("policy", policy),
        "group_policy": ("policies", _parse_pairs(group_policy or [], "GROUP=POLICY")),
        "priority_aging": ("priority_aging", priority_aging),
        "switch_timeout": ("switch_timeout", switch_timeout),
        "revoked_snapshot_timeout": ("revoked_snapshot_timeout", revoked_snapshot_timeout),
        "journal_retention": ("journal_retention", journal_retention),
        "max_connections": ("max_connections", max_connections),
        "max_watchers": ("max_watchers", max_watchers),
        "max_groups": ("max_groups", max_groups),
        "max_waiters_per_group": ("max_waiters_per_group", max_waiters_per_group),
        "kubernetes": ("kubernetes", kubernetes),
        "kubeconfig": ("kubeconfig", kubeconfig),
        "metrics_port": ("metrics_port", metrics_port),
        "metrics_host": ("metrics_host", metrics_host),
        "http2": ("http2", http2),
        "leader_lease": ("leader_lease", leader_lease),
        "advertise": ("advertise", advertise),
    }
    # Options whose default is the configuration's own: unset, they leave it be.
    config_defaults = {
        "revoked_snapshot_timeout",
        "journal_retention",
        "max_connections",
        "max_watchers",
        "max_groups",
        "max_waiters_per_group",
        "kubernetes",
        "kubeconfig",
        "metrics_port",
        "metrics_host",
        "http2",
        "leader_lease",
        "advertise",
    }
    with user_errors(Scope(urls=[db])):
        _setup_logging(ctx, log_level, log_format)
        # A bad certificate, key or auth file: one line, exit 1.
        security = serve_security(
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_client_ca=tls_client_ca,
            auth=auth,
            insecure=insecure,
        )
        if (dial := client_tls(agent_tls_ca, agent_tls_cert, agent_tls_key, "agent-")) is not None:
            security["agent_tls"] = dial
        if agent_token := env_token(ENV_AGENT_TOKEN):
            security["agent_token"] = agent_token
        try:
            values = read_orchestrator_config(config_file) if config_file else {}
            for name, (field_name, value) in options.items():
                # file < environment < command line
                if not given(ctx, name) and name in config_defaults:
                    continue
                if given(ctx, name) or field_name not in values:
                    values[field_name] = value
            if values.get("db") == "memory":
                values["db"] = None
            values.update(security)
            config = OrchestratorConfig(**values)
        except TimeSliceError as exc:
            raise typer.BadParameter(f"{exc}{environment_note(ctx)}") from None
    journal = shown(config.db) if config.db else "memory"

    tune_gc_for_serving()

    async def serve() -> BaseException | None:
        orch = Orchestrator(config)
        # A signal during the start (a standby waits there until it takes over)
        # ends it as cleanly as one after; one that comes as the start ends is
        # kept for the wait after it.
        with _Signals() as signals:
            starting = asyncio.ensure_future(orch.start())
            try:
                if await signals.wait_or(starting):
                    await asyncio.gather(starting, return_exceptions=True)
                    if starting.cancelled():
                        announce("shutting down before taking over", log_format)
                    else:
                        announce("shutting down", log_format)
                    return None
                starting.result()
                announce(
                    f"timeslice orchestrator serving on {orch.address} (journal: {journal})",
                    log_format,
                    address=orch.address,
                )
                await signals.wait_or(orch.wait_stopped())
                if orch.failure is None:
                    announce("shutting down", log_format)
                return orch.failure
            finally:
                await orch.close()

    listen = _address(config.host, config.port)
    with user_errors(Scope(listen=listen, urls=[config.db] if config.db else [])):
        failure = anyio.run(serve)
        if failure is not None:
            raise CommandError(f"the orchestrator stopped: {failure}") from failure


@serve_app.command("agent", cls=EnvCommand)
def serve_agent(
    ctx: typer.Context,
    host: Annotated[
        str, typer.Option(help="Address to listen on (it can touch other processes' memory).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 9001,
    node_name: Annotated[
        str | None,
        typer.Option(
            envvar="NODE_NAME",
            help="This node's name (default: $NODE_NAME, else the host name).",
        ),
    ] = None,
    db: Annotated[
        str,
        typer.Option(
            help="Job table: a file path, sqlite:///REL/PATH (relative), sqlite:////ABS/PATH,"
            " or 'memory'."
        ),
    ] = "sqlite:///timeslice-agent.db",
    backend: Annotated[
        list[str] | None, typer.Option(help="Serve only these backends; repeatable (default: all).")
    ] = None,
    operation_timeout: Annotated[
        float, typer.Option(help="Deadline of an operation whose request sets none, seconds.")
    ] = 300.0,
    orchestrator: Annotated[
        str | None,
        typer.Option(
            help="HOST:PORT of the orchestrator to register with and report to, or several"
            " separated by commas (active and standbys: the active is found)."
        ),
    ] = None,
    advertise: Annotated[
        str | None,
        typer.Option(help="HOST:PORT the orchestrator reaches this agent at (default: listen)."),
    ] = None,
    group: Annotated[
        list[str] | None,
        typer.Option(help="A group this node joins when it registers; repeatable."),
    ] = None,
    socket_path: Annotated[
        str | None,
        typer.Option(
            "--socket",
            help="Also serve on this Unix socket (mode 0666), where node-local jobs and"
            " workloads are known by their peer credentials.",
        ),
    ] = None,
    app_endpoint_allow: Annotated[
        list[str] | None,
        typer.Option(
            help="A URL prefix beyond loopback (scheme://host:port, a path after it or"
            " not) that the app_endpoint backend may call; repeatable."
        ),
    ] = None,
    cgroup_root: Annotated[
        str,
        typer.Option(
            help="Where the node's cgroups are mounted: the cuda backend finds the"
            " processes of a target that names a pod there."
        ),
    ] = "/sys/fs/cgroup",
    tls_cert: TlsCert = None,
    tls_key: TlsKey = None,
    tls_client_ca: TlsClientCa = None,
    auth: AuthFile = None,
    insecure: Insecure = False,
    orchestrator_tls_ca: OrchestratorTlsCa = None,
    orchestrator_tls_cert: OrchestratorTlsCert = None,
    orchestrator_tls_key: OrchestratorTlsKey = None,
    log_level: LogLevel = "INFO",
    log_format: LogFormat = "text",
    metrics_port: MetricsPort = 0,
    metrics_host: MetricsHost = None,
    http2: Http2 = None,
) -> None:
    """Serve the node agent (snapshot and restore of jobs' accelerator contexts).

    Without TLS and --auth it listens on loopback only (unless --insecure). Its
    session with --orchestrator uses --orchestrator-tls-* and the token of
    $TIMESLICE_ORCHESTRATOR_TOKEN."""
    from timeslice.agent.server import Agent, AgentConfig
    from timeslice.cli_credentials import (
        ENV_ORCHESTRATOR_TOKEN,
        client_tls,
        env_token,
        serve_security,
    )

    with user_errors(Scope(urls=[db])):
        _setup_logging(ctx, log_level, log_format)
        # A bad certificate, key or auth file: one line, exit 1.
        security = serve_security(
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_client_ca=tls_client_ca,
            auth=auth,
            insecure=insecure,
        )
        dial = client_tls(
            orchestrator_tls_ca, orchestrator_tls_cert, orchestrator_tls_key, "orchestrator-"
        )
        if dial is not None:
            security["orchestrator_tls"] = dial
        if orchestrator_token := env_token(ENV_ORCHESTRATOR_TOKEN):
            security["orchestrator_token"] = orchestrator_token
        try:
            config = AgentConfig(
                **security,
                host=host,
                port=port,
                db=None if db == "memory" else db,
                backends=tuple(backend) if backend else None,
                operation_timeout=operation_timeout,
                node_name=node_name or socket.gethostname(),
                orchestrator=orchestrator,
                advertise=advertise,
                groups=tuple(group or ()),
                socket=socket_path,
                app_endpoint_allow=tuple(app_endpoint_allow or ()),
                cgroup_root=cgroup_root,
                metrics_port=metrics_port,
                metrics_host=metrics_host,
                http2=http2 or AgentConfig.http2,
            )
        except TimeSliceError as exc:
            raise typer.BadParameter(f"{exc}{environment_note(ctx)}") from None

    async def serve() -> None:
        # Caught from before the start, so that a signal during it stops it cleanly too.
        with _Signals() as signals:
            async with Agent(config) as agent:
                backends = ", ".join(sorted(agent.backends)) or "none"
                also = f" and {agent.socket_address}" if agent.socket_address else ""
                announce(
                    f"timeslice agent {config.node_name} serving on {agent.address}{also} "
                    f"(backends: {backends}; job table: {shown(db)})",
                    log_format,
                    address=agent.address,
                    node=config.node_name,
                )
                await signals.wait_or(asyncio.Event().wait())
                announce("shutting down", log_format)

    with user_errors(Scope(listen=_address(host, port), urls=[db])):
        anyio.run(serve)


@app.command()
def status(
    group: Annotated[str | None, typer.Argument(help="One group; all groups when omitted.")] = None,
    json_output: JsonOutput = False,
    target: Target = DEFAULT_TARGET,
    tls_ca: TlsCa = None,
    tls_cert: ClientTlsCert = None,
    tls_key: ClientTlsKey = None,
    token: Token = None,
) -> None:
    """Print each group's holder, queue and fencing token."""

    async def show(client: AsyncTimeSliceOrchestratorClient) -> None:
        from timeslice.cli_views import dumps, leadership_line, status_json

        standings = await client.each_leadership()
        groups = [group] if group else await client.list_groups()
        if json_output:
            answers = [await client.get_status(name) for name in groups]
            typer.echo(dumps(status_json(answers, standings)))
            return
        for address, standing in standings:
            typer.echo(leadership_line(address, standing))
        if not groups:
            typer.echo("no groups yet")
        for name in groups:
            answer = await client.get_status(name)
            g = answer.group
            queue = ", ".join(g.waiting_jobs) or "-"
            typer.echo(
                f"{g.group_id}: {g.group_state.value}  holder={g.locking_job or '-'}  "
                f"active={g.active_job or '-'}  loaded={g.loaded_job or '-'}  "
                f"queue[{g.waiter_queue_depth}]={queue}  token={g.fencing_token}"
            )
            if g.nodes:
                seen = ", ".join(
                    f"{s.agent}/{s.job_id}={s.job_state.value}" for s in answer.agent_job_states
                )
                typer.echo(f"  nodes: {', '.join(g.nodes)}  contexts: {seen or '-'}")
            for job, why in g.quarantined_jobs.items():
                typer.echo(f"  quarantined: {job} ({why}); `timeslice reset-job {name} {job}`")

    _with_client(target, show, _credentials(tls_ca, tls_cert, tls_key, token))


@app.command()
def acquire(
    group: str,
    job: str,
    target: Target = DEFAULT_TARGET,
    timeout: Annotated[float | None, typer.Option(help="Give up after this many seconds.")] = None,
    tls_ca: TlsCa = None,
    tls_cert: ClientTlsCert = None,
    tls_key: ClientTlsKey = None,
    token: Token = None,
) -> None:
    """Wait until JOB holds GROUP, then exit holding it (no lease: it holds until
    `timeslice yield`)."""

    async def take(client: AsyncTimeSliceOrchestratorClient) -> None:
        result = await client.acquire(job_id=job, group_id=group, timeout_sec=timeout)
        typer.echo(
            f"{job} holds {group} (token {result.fencing_token}, waited {result.waited_ms} ms)"
        )

    _with_client(target, take, _credentials(tls_ca, tls_cert, tls_key, token))


@app.command("yield")
def yield_(
    group: str,
    job: str,
    target: Target = DEFAULT_TARGET,
    tls_ca: TlsCa = None,
    tls_cert: ClientTlsCert = None,
    tls_key: ClientTlsKey = None,
    token: Token = None,
) -> None:
    """Release GROUP, held by JOB."""

    async def give_back(client: AsyncTimeSliceOrchestratorClient) -> None:
        result = await client.release(job_id=job, group_id=group)
        typer.echo(f"{job} released {group} ({result.pending_waiters} waiting)")

    _with_client(target, give_back, _credentials(tls_ca, tls_cert, tls_key, token))


@app.command("force-release")
def force_release(
    group: str,
    job: Annotated[str, typer.Option(help="Only if this job holds the group.")] = "",
    reason: Annotated[str, typer.Option(help="Recorded in the journal.")] = "",
    target: Target = DEFAULT_TARGET,
    tls_ca: TlsCa = None,
    tls_cert: ClientTlsCert = None,
    tls_key: ClientTlsKey = None,
    token: Token = None,
) -> None:
    """Operator action: take GROUP away from its holder; the next waiter is granted."""

    async def take_away(client: AsyncTimeSliceOrchestratorClient) -> None:
        result = await client.force_release(group_id=group, job_id=job, reason=reason)
        after = f"; {result.next_job_id} holds it now" if result.next_job_id else ""
        typer.echo(f"took {group} from {result.released_job_id}{after}")

    _with_client(target, take_away, _credentials(tls_ca, tls_cert, tls_key, token))


@app.command("reset-job")
def reset_job(
    group: str,
    job: str,
    target: Target = DEFAULT_TARGET,
    tls_ca: TlsCa = None,
    tls_cert: ClientTlsCert = None,
    tls_key: ClientTlsKey = None,
    token: Token = None,
) -> None:
    """Operator action: lift JOB's quarantine on GROUP (after a snapshot or restore of
    its context failed), on the orchestrator and on the group's agents."""

    async def reset(client: AsyncTimeSliceOrchestratorClient) -> None:
        was = await client.reset_job(job_id=job, group_id=group)
        typer.echo(
            f"{job} may hold {group} again" if was else f"{job} was not quarantined on {group}"
        )

    _with_client(target, reset, _credentials(tls_ca, tls_cert, tls_key, token))


@app.command("group-nodes")
def group_nodes(
    group: str,
    nodes: Annotated[list[str], typer.Argument(help="Node names or agent addresses HOST:PORT.")],
    target: Target = DEFAULT_TARGET,
    tls_ca: TlsCa = None,
    tls_cert: ClientTlsCert = None,
    tls_key: ClientTlsKey = None,
    token: Token = None,
) -> None:
    """Name the nodes GROUP spans (its grants switch the contexts on all of them)."""

    async def set_nodes(client: AsyncTimeSliceOrchestratorClient) -> None:
        await client.set_group_nodes(nodes, group_id=group)
        typer.echo(f"{group} spans {', '.join(nodes)}")

    _with_client(target, set_nodes, _credentials(tls_ca, tls_cert, tls_key, token))


@app.command()
def bench(
    quick: Annotated[bool, typer.Option(help="A short smoke run (about a minute).")] = False,
    only: Annotated[
        list[str] | None,
        typer.Option(help="Run only this benchmark (repeatable): handoff, switch, cycles, ..."),
    ] = None,
    out: Annotated[
        str | None,
        typer.Option(help="Where latest.json/.md/.log go (default: benchmarks/results)."),
    ] = None,
) -> None:
    """Run the benchmark suite of a source checkout (`python -m benchmarks`): every
    figure beside a baseline measured in the same run; prints the table."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / "suite.py").is_file():
        typer.echo(
            f"error: no benchmarks/ next to the timeslice package ({root}): the suite runs"
            " from a source checkout",
            err=True,
        )
        raise typer.Exit(2)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from benchmarks.suite import main as run_suite

    argv = [*(["--quick"] if quick else []), *(f"--only={name}" for name in only or [])]
    argv += [f"--out={out}"] if out else []
    with user_errors():
        code = run_suite(argv)
    raise typer.Exit(code)


# The demo's options that apply to one workload only.
DEMO_OPTIONS = {"hostmem": ("step_seconds", "mib", "profile"), "torch": ("reward_seconds",)}


@app.command()
def demo(
    ctx: typer.Context,
    workload: Annotated[
        str,
        typer.Option(
            help="What the jobs are: hostmem (simulated RL jobs, contexts of host-memory"
            " arrays) or torch (real PyTorch training jobs, each checked bit for bit against"
            " its solo run; needs the torch extra)."
        ),
    ] = "hostmem",
    jobs: Annotated[
        int, typer.Option(min=1, max=16, help="How many RL jobs share the accelerator.")
    ] = 2,
    steps: Annotated[int, typer.Option(min=1, help="Steps per job.")] = 8,
    step_seconds: Annotated[
        float, typer.Option(min=0.05, help="hostmem: length of one step (all its phases), s.")
    ] = 1.5,
    mib: Annotated[int, typer.Option(min=1, help="hostmem: each job's context, MiB.")] = 16,
    profile: Annotated[
        str,
        typer.Option(help="hostmem: phases of a step, from a recorded run: verl-sync, verl-async."),
    ] = "verl-async",
    reward_seconds: Annotated[
        float,
        typer.Option(min=0.0, max=600.0, help="torch: the reward service's latency per step, s."),
    ] = 0.8,
    directory: Annotated[
        str | None, typer.Option(help="Keep the journals here (default: a new temporary folder).")
    ] = None,
) -> None:
    """Run RL jobs back to back, then time-sliced on one accelerator, through an embedded
    orchestrator and agent; print what sharing bought. With `--workload torch`, exit 1
    unless every job ends time-sliced with the bits it ended with alone."""
    from pathlib import Path

    with user_errors():
        if workload not in DEMO_OPTIONS:
            raise typer.BadParameter(f"unknown workload {workload!r}; known: hostmem, torch")
        foreign = [
            name
            for other, names in DEMO_OPTIONS.items()
            if other != workload
            for name in names
            if getattr(ctx.get_parameter_source(name), "name", "") == "COMMANDLINE"
        ]
        if foreign:
            option = "--" + foreign[0].replace("_", "-")
            raise typer.BadParameter(f"{option} does not apply to --workload {workload}")
        where = Path(directory) if directory else None
        if workload == "torch":
            _demo_torch(jobs, steps, reward_seconds, where)
            return
        from timeslice.demo import DemoConfig, run_demo

        try:
            config = DemoConfig(jobs, steps, step_seconds, mib, profile)
        except TimeSliceError as exc:
            raise typer.BadParameter(str(exc)) from None
        if where is not None:
            where.mkdir(parents=True, exist_ok=True)
        anyio.run(run_demo, config, where)


def _demo_torch(jobs: int, steps: int, reward_seconds: float, where: Path | None) -> None:
    try:
        from timeslice.demo_torch import TorchDemoConfig, run_demo
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "torch":
            raise
        raise CommandError("the torch demo needs PyTorch: pip install 'timeslice[torch]'") from None
    try:
        config = TorchDemoConfig(jobs=jobs, steps=steps, reward_s=reward_seconds)
    except TimeSliceError as exc:
        raise typer.BadParameter(str(exc)) from None
    if where is not None:
        where.mkdir(parents=True, exist_ok=True)
    result = anyio.run(run_demo, config, where)
    if not result.identical:
        raise CommandError(
            "a job's parameters or loss curve differ time-sliced from its solo run (see the table)"
        )


@app.command()
def replay(
    journals: Annotated[
        list[str] | None,
        typer.Argument(
            help="Journals to replay, one run each: a file path, sqlite:///REL/PATH (relative),"
            " sqlite:////ABS/PATH or postgresql://... (default: timeslice-journal.db in the"
            " working directory, unless --runs is given).",
            metavar="JOURNAL",
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        str | None,
        typer.Option("--output", "-o", help="Write the replay page (one HTML file) here."),
    ] = None,
    runs: Annotated[
        str | None,
        typer.Option(
            help="Also replay the recorded runs of this JSON file (verl-replay-runs schema)."
        ),
    ] = None,
    export: Annotated[
        str | None,
        typer.Option(help="Write every run as lock events of that schema to this JSON file."),
    ] = None,
    trace: Annotated[
        str | None,
        typer.Option(
            help="Write every run as a Chrome/Perfetto trace (Trace Event Format JSON) to this"
            " file: open it in ui.perfetto.dev (Open trace file) or chrome://tracing."
        ),
    ] = None,
    title: Annotated[str, typer.Option(help="The page's title.")] = "timeslice replay",
) -> None:
    """Replay recorded runs switch by switch: a self-contained HTML page with a timeline
    per group and job, play/pause/speed/scrub, and the parts of each switch."""
    import json
    from pathlib import Path

    from timeslice.replay import ReplayError, ScheduleError, load_runs, read_journal, render_page
    from timeslice.replay.verl import export_document

    urls = list(journals or ([] if runs else ["sqlite:///timeslice-journal.db"]))
    with user_errors(Scope(urls=urls)):
        if output is None and export is None and trace is None:
            raise typer.BadParameter(
                "give --output FILE.html, --export FILE.json or --trace FILE.json (or several)"
            )
        try:
            timelines = [anyio.run(read_journal, url).timeline() for url in urls]
            if runs:
                timelines += load_runs(Path(runs))
        except (ReplayError, ScheduleError) as exc:
            raise CommandError(str(exc)) from exc
        except OSError as exc:
            raise CommandError(f"cannot read {runs}: {exc.strerror or exc}") from exc
        for tl in timelines:
            for note in tl.notes:
                typer.echo(f"note: {tl.label}: {note}", err=True)
        written = []
        try:
            if output is not None:
                Path(output).write_text(render_page(timelines, title), encoding="utf-8")
                written.append(output)
            if export is not None:
                text = json.dumps(export_document(timelines), indent=1, allow_nan=False)
                Path(export).write_text(text + "\n", encoding="utf-8")
                written.append(export)
            if trace is not None:
                from timeslice.replay.trace import trace_document

                text = json.dumps(trace_document(timelines), allow_nan=False)
                Path(trace).write_text(text + "\n", encoding="utf-8")
                written.append(trace)
        except OSError as exc:
            raise CommandError(f"cannot write {exc.filename}: {exc.strerror or exc}") from exc
    switches = sum(len(tl.switches) for tl in timelines)
    typer.echo(f"wrote {' and '.join(written)}: {len(timelines)} run(s), {switches} switch(es)")


auth_app = typer.Typer(
    help="Credentials for a server's auth file (--auth FILE).", no_args_is_help=True
)
app.add_typer(auth_app, name="auth")


@auth_app.command("add-token")
def auth_add_token(
    name: Annotated[str, typer.Argument(help="The principal's name, as logs will show it.")],
    role: Annotated[str, typer.Option(help="job, agent, operator or viewer.")],
    job: Annotated[
        list[str] | None,
        typer.Option(help="A job id (pattern: trainer-a-*) it may act as; repeatable. job role."),
    ] = None,
    group: Annotated[
        list[str] | None,
        typer.Option(help="A group (pattern) it may touch or see; repeatable. job, viewer roles."),
    ] = None,
    node: Annotated[
        list[str] | None,
        typer.Option(help="A node name (pattern) it may register as; repeatable. agent role."),
    ] = None,
    uid: Annotated[
        list[int] | None,
        typer.Option(help="A user its processes run as on the nodes; repeatable. job role."),
    ] = None,
) -> None:
    """Make a new bearer token for NAME: its [[principal]] entry goes to stdout (append
    it to the auth file, which keeps only the token's SHA-256), the token to stderr,
    shown this once (the principal's TIMESLICE_TOKEN, or a client's --token)."""
    from timeslice.errors import InvalidArgumentError
    from timeslice.security.tokens import new_token, principal_entry

    with user_errors():
        token = new_token()
        try:
            entry, _ = principal_entry(
                name,
                role,
                token,
                jobs=job or (),
                groups=group or (),
                nodes=node or (),
                uids=uid or (),
            )
        except InvalidArgumentError as exc:
            raise typer.BadParameter(str(exc)) from None
        typer.echo(entry, nl=False)
        typer.echo(f"token for {name} (shown only now): {token}", err=True)


# the operator's commands (cli_ops.py)
app.command()(watch)
app.command()(inspect)
app.add_typer(agent_app, name="agent")


def main() -> None:
    app(prog_name="timeslice")
