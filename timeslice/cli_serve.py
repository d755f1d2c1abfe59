"""`timeslice serve orchestrator|agent`: the servers' options, read into the same
configuration classes a program builds, and the servers run until a signal. Nothing
here decides anything on its own."""

from __future__ import annotations

import asyncio
import socket
from typing import Annotated

import anyio
import typer

from timeslice.cli_client import Signals as _Signals
from timeslice.cli_credentials import (
    AgentTlsCa,
    AgentTlsCert,
    AgentTlsKey,
    AuthFile,
    Insecure,
    OrchestratorTlsCa,
    OrchestratorTlsCert,
    OrchestratorTlsKey,
    TlsCert,
    TlsClientCa,
    TlsKey,
)
from timeslice.cli_env import EnvCommand, environment_note, given, source_name
from timeslice.cli_errors import CommandError, Scope, shown, user_errors
from timeslice.errors import TimeSliceError
from timeslice.logs import LOG_FORMATS, LOG_LEVELS, announce

serve_app = typer.Typer(
    help="Run a timeslice server until Ctrl-C or SIGTERM.", no_args_is_help=True
)

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
