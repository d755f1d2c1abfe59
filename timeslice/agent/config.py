"""How an Agent runs: `AgentConfig`, validated on construction."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from timeslice.agent.local_socket import check_socket_path
from timeslice.api.connections import check_http2, connection_limits
from timeslice.backends.endpoints import normalize_prefixes
from timeslice.errors import InvalidArgumentError
from timeslice.security.exposure import check_exposure
from timeslice.security.principals import AuthPolicy
from timeslice.security.tls import ClientTls, ServerTls, check_token
from timeslice.ids import check_id, check_metrics_port, parse_target
from timeslice.targets import parse_targets

MiB = 1024 * 1024


@dataclass(frozen=True)
class AgentConfig:
    """How an Agent runs. Validated on construction."""

    host: str = "127.0.0.1"
    port: int = 0
    node_name: str = field(default_factory=socket.gethostname)
    # Where the job table is kept: None in memory; "sqlite:///PATH" or a path.
    db: str | None = None
    # The backends to serve (None: every installed one that loads).
    backends: tuple[str, ...] | None = None
    # Options per backend, handed to it as `BackendContext.options`.
    backend_options: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # An operation's deadline when its request gives none.
    operation_timeout: float = 300.0
    # How long finished operations can still be looked up.
    operation_retention: float = 600.0
    # Jobs the agent knows at most (RESOURCE_EXHAUSTED for a new one beyond).
    max_jobs: int = 4096
    max_message_bytes: int = 4 * MiB
    # Who may call, and what each may do (`--auth FILE`, see
    # `timeslice.security.principals`); None: every caller may do everything.
    auth: AuthPolicy | None = None
    # TLS (`--tls-cert`, `--tls-key`, and `--tls-client-ca` for mTLS); None: plain.
    tls: ServerTls | None = None
    # Serve a non-loopback host without TLS and auth anyway (refused otherwise;
    # see `timeslice.security.exposure`), with a warning at every start.
    insecure: bool = False
    # The credentials of the agent's session with the orchestrator (its TLS CA, a
    # client certificate for its mTLS, a bearer token); None and "": plain, anonymous.
    orchestrator_tls: ClientTls | None = None
    orchestrator_token: str = ""
    drain_timeout: float = 5.0
    # The orchestrator (HOST:PORT, or several comma-separated: the active is found)
    # to register with and report jobs to; None: none.
    orchestrator: str | None = None
    # The address the orchestrator reaches this agent at (default: where it listens).
    advertise: str | None = None
    # Groups this node joins when it registers (beyond the orchestrator's own config).
    groups: tuple[str, ...] = ()
    # What peers may hold (README, "Limits"), as for the orchestrator: connections at
    # once; streams on each; seconds from a connection's opening to its first
    # request headers; seconds with no stream open; seconds a unary call waits for
    # its request message.
    max_connections: int = 1024
    max_streams_per_connection: int = 128
    header_timeout: float = 10.0
    idle_timeout: float = 300.0
    message_timeout: float = 10.0
    # The HTTP/2 server that carries the calls, on TCP and on the Unix socket:
    # "h2core" (ours, `timeslice.api.h2edge`) or "grpclib" (grpclib's); see the
    # orchestrator's.
    http2: str = "h2core"
    # A Unix socket to serve on too (`--socket PATH`), for node-local jobs and
    # workloads, known there by their peer credentials; None: TCP only.
    socket: str | None = None
    # URL prefixes beyond loopback that the app_endpoint backend may call
    # (`--app-endpoint-allow`; see `timeslice.backends.endpoints`).
    app_endpoint_allow: tuple[str, ...] = ()
    # Where the node's cgroups are mounted (`--cgroup-root`): the cuda backend finds
    # a pod's processes there (see `timeslice.backends._cgroups`).
    cgroup_root: str = "/sys/fs/cgroup"
    # Prometheus metrics and the HTTP probes (/metrics, /healthz, /readyz) on this
    # port (0: off), on `metrics_host` (None: the agent's own host).
    metrics_port: int = 0
    metrics_host: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise InvalidArgumentError(f"port {self.port} is out of range")
        check_metrics_port(self.metrics_port, self.metrics_host)
        check_http2(self.http2)
        check_exposure(
            "the agent",
            self.host,
            tls=self.tls is not None,
            auth=self.auth is not None,
            insecure=self.insecure,
        )
        if self.orchestrator_token:
            check_token(self.orchestrator_token, "orchestrator_token")
        connection_limits(self)  # checks them
        if not self.node_name:
            raise InvalidArgumentError("node_name must not be empty")
        check_id("node_name", self.node_name)
        if self.orchestrator:
            parse_targets(self.orchestrator)  # one orchestrator or several, comma-separated
        if self.advertise:
            parse_target(self.advertise)
        for group in self.groups:
            check_id("group", group)
        if self.operation_timeout <= 0 or self.operation_retention <= 0:
            raise InvalidArgumentError("operation timeout and retention must be positive")
        if self.max_jobs < 1:
            raise InvalidArgumentError("max_jobs must be positive")
        if self.socket is not None:
            check_socket_path(self.socket)
        if not self.cgroup_root.startswith("/"):
            raise InvalidArgumentError("cgroup_root must be an absolute path")
        object.__setattr__(self, "app_endpoint_allow", normalize_prefixes(self.app_endpoint_allow))
