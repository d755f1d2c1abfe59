"""How an Orchestrator runs (`OrchestratorConfig`, validated on construction), and
the events that bring a journaled table's settings to it at each start."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from timeslice.api.connections import check_http2, connection_limits
from timeslice.errors import InvalidArgumentError
from timeslice.security.exposure import check_exposure
from timeslice.security.principals import AuthPolicy
from timeslice.security.tls import ClientTls, ServerTls, check_token
from timeslice.ids import check_id, check_metrics_port, check_node
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.journal import DEFAULT_RETENTION
from timeslice.orchestrator.leadership import DEFAULT_LEADER_LEASE, check_lease
from timeslice.orchestrator.model import GroupPolicy, HoldLimit, TableLimits
from timeslice.orchestrator.state import LockTable
from timeslice.targets import MAX_ACTIVE_TEXT, parse_targets


def check_advertised(address: str) -> None:
    """`address` must be one TCP target (HOST:PORT) short enough to hand to clients."""
    if len(address) > MAX_ACTIVE_TEXT:
        raise InvalidArgumentError(f"advertise: longer than {MAX_ACTIVE_TEXT} characters")
    targets = parse_targets(address)
    if len(targets) != 1 or targets[0].path is not None:
        raise InvalidArgumentError(f"advertise {address!r}: expected one HOST:PORT")


MiB = 1024 * 1024


@dataclass(frozen=True)
class OrchestratorConfig:
    """How an Orchestrator runs. Validated on construction."""

    host: str = "127.0.0.1"
    port: int = 0
    # Journal: None keeps it in memory; "sqlite:///PATH" or a path; "postgresql://...".
    db: str | None = None
    # The longest any holder may keep a group (None: no limit), and per-group limits.
    hold_limit: float | None = None
    hold_limits: Mapping[str, float | None] = field(default_factory=dict)
    # At the hold limit, ask the holder to yield (a Watch event, a flag in its
    # KeepAlive answer) and revoke it only this many seconds later (0: at once).
    hold_grace: float = 0.0
    # How each group picks its next holder: "fifo", "lrs" (least recently served)
    # or "priority" (with aging: every `priority_aging` seconds waited adds one).
    policy: str = "fifo"
    policies: Mapping[str, str] = field(default_factory=dict)
    priority_aging: float = 60.0
    # The nodes each group spans: node names of agents that register themselves,
    # or agent addresses (HOST:PORT). A grant on such a group first switches the
    # contexts on all of them; GetGroupStatus reports what their agents say.
    group_nodes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # The longest a switch (every node's snapshots and restore) may take.
    switch_timeout: float = 120.0
    # The longest the snapshot of a holder that lost the group without yielding
    # (lease expired, hold limit, workload gone, force release) may take: its
    # process may be frozen and never answer, and the next job should not wait the
    # whole switch timeout for it. When it runs out that job is quarantined and the
    # switch goes on. Keep it above the longest snapshot a live holder takes.
    revoked_snapshot_timeout: float = 30.0
    # After a start, how long queued jobs and unclaimed grants wait for their client.
    recovery_grace: float = 30.0
    # A snapshot of the table every this many journaled events.
    snapshot_every: int = 1000
    # How long journaled events stay once a snapshot covers them (the replay and the
    # metrics read them), in seconds; then a later snapshot's write deletes them.
    # 0: at once. The journal's size is its traffic over this span.
    journal_retention: float = DEFAULT_RETENTION
    max_message_bytes: int = 4 * MiB
    # Who may call, and what each may do (`--auth FILE`, see
    # `timeslice.security.principals`); None: every caller may do everything.
    auth: AuthPolicy | None = None
    # TLS (`--tls-cert`, `--tls-key`, and `--tls-client-ca` for mTLS); None: plain.
    tls: ServerTls | None = None
    # Serve a non-loopback host without TLS and auth anyway (refused otherwise;
    # see `timeslice.security.exposure`), with a warning at every start.
    insecure: bool = False
    # The credentials the orchestrator calls its agents with (their TLS CA, a client
    # certificate for their mTLS, a bearer token); None and "": plain, anonymous.
    agent_tls: ClientTls | None = None
    agent_token: str = ""
    # How long close() waits for calls in flight.
    drain_timeout: float = 5.0
    # What peers may hold (README, "Limits"): connections at once; streams on each;
    # seconds from a connection's opening to its first request headers; seconds a
    # connection may stay with no stream open; seconds a unary call waits for its
    # request message. Over a limit a caller is answered RESOURCE_EXHAUSTED.
    max_connections: int = 1024
    max_streams_per_connection: int = 128
    header_timeout: float = 10.0
    idle_timeout: float = 300.0
    message_timeout: float = 10.0
    # Watch streams at once, and how many events one may fall behind before it is
    # ended (RESOURCE_EXHAUSTED).
    max_watchers: int = 1024
    watch_backlog: int = 10_000

    # Learn groups, their nodes and their jobs' pods from Kubernetes labels
    # (`--kubernetes`; see `timeslice.orchestrator.discovery`), through the
    # in-cluster service account or, when set, this kubeconfig file.
    kubernetes: bool = False
    kubeconfig: str | None = None

    # Groups the orchestrator knows at most (each stays known: its fencing token
    # must only grow), and jobs waiting for one group at most.
    max_groups: int = 10_000
    max_waiters_per_group: int = 10_000
    # Prometheus metrics and the HTTP probes (/metrics, /healthz, /readyz) on this
    # port (0: off), on `metrics_host` (None: the server's own host).
    metrics_port: int = 0
    metrics_host: str | None = None
    # On a PostgreSQL journal: the leader lease, in seconds. Orchestrators on one
    # database are candidates; the one holding the lease is active (renewing it
    # every third of it), the others wait as standbys and take over once it expires
    # (`timeslice.orchestrator.leadership`). Ignored on SQLite and in memory.
    leader_lease: float = DEFAULT_LEADER_LEASE
    # HOST:PORT clients reach this orchestrator at (`--advertise`): written into the
    # leader lease's row when it takes over, so that a standby names it in the
    # UNAVAILABLE it answers (`timeslice.targets.ACTIVE_KEY`). None: the address it
    # listens on, unless that is a wildcard (0.0.0.0, ::), which names nobody.
    advertise: str | None = None
    # The HTTP/2 server that carries the calls: "h2core" (ours, the default:
    # `timeslice.api.h2edge`, about half of grpclib's CPU per call), or "grpclib"
    # (grpclib's). Both hold to the same limits, TLS and authentication. The
    # orchestrator's own unary calls to the agents (SwitchGroup) take the client of
    # the same name (`timeslice.api.h2client`, or grpclib's).
    http2: str = "h2core"

    def table_limits(self) -> TableLimits:
        """What the lock table admits."""
        return TableLimits(
            max_groups=self.max_groups, max_waiters_per_group=self.max_waiters_per_group
        )

    def __post_init__(self) -> None:
        self.table_limits()  # checks them
        if not 0 <= self.port <= 65535:
            raise InvalidArgumentError(f"port {self.port} is out of range")
        check_metrics_port(self.metrics_port, self.metrics_host)
        check_lease(self.leader_lease)
        if self.advertise is not None:
            check_advertised(self.advertise)
        check_http2(self.http2)
        check_exposure(
            "the orchestrator",
            self.host,
            tls=self.tls is not None,
            auth=self.auth is not None,
            insecure=self.insecure,
        )
        if self.agent_token:
            check_token(self.agent_token, "agent_token")
        connection_limits(self)  # checks them
        if self.max_watchers < 1 or self.watch_backlog < 1:
            raise InvalidArgumentError("max_watchers and watch_backlog must be at least 1")
        limits = [self.hold_limit, *self.hold_limits.values()]
        if any(limit is not None and limit <= 0 for limit in limits):
            raise InvalidArgumentError("hold limits must be positive")
        if not self.hold_grace >= 0:
            raise InvalidArgumentError("hold_grace must not be negative")
        if self.recovery_grace <= 0 or self.snapshot_every < 1 or self.drain_timeout < 0:
            raise InvalidArgumentError("recovery_grace, snapshot_every must be positive")
        if not 0 <= self.journal_retention < math.inf:
            raise InvalidArgumentError("journal_retention must be a number of seconds, 0 or more")
        if self.max_message_bytes < 1024:
            raise InvalidArgumentError("max_message_bytes must be at least 1 KiB")
        for name in [self.policy, *self.policies.values()]:
            if name not in tuple(ev.Policy):
                raise InvalidArgumentError(
                    f"unknown policy {name!r}; expected one of {', '.join(tuple(ev.Policy))}"
                )
        if not self.priority_aging > 0:
            raise InvalidArgumentError("priority_aging must be positive")
        for group, nodes in self.group_nodes.items():
            check_id("group_id", group)
            for node in nodes:
                check_node(node)
        if not self.switch_timeout > 0:
            raise InvalidArgumentError("switch_timeout must be positive")
        if self.kubeconfig is not None and not self.kubernetes:
            raise InvalidArgumentError("a kubeconfig means something only with kubernetes")
        if not self.revoked_snapshot_timeout > 0:
            raise InvalidArgumentError("revoked_snapshot_timeout must be positive")


def settings_events(config: OrchestratorConfig, table: LockTable, now: float) -> list[ev.Event]:
    """The events that make `table`'s hold limits, policies and group nodes what
    `config` says (none for what the journal has already): nodes a config names
    are added to those agents joined, never taken away."""
    events: list[ev.Event] = []
    holds = {ev.EVERY_GROUP: config.hold_limit, **config.hold_limits}
    for group, limit in holds.items():
        if table.settings.hold_limits.get(group) != HoldLimit(
            max_hold=limit, grace=config.hold_grace
        ):
            events.append(
                ev.SetHoldLimit(now=now, group=group, max_hold=limit, grace=config.hold_grace)
            )
    policies = {ev.EVERY_GROUP: config.policy, **config.policies}
    for group, name in policies.items():
        wanted = GroupPolicy(kind=ev.Policy(name), aging=config.priority_aging)
        if table.settings.policies.get(group) != wanted:
            events.append(
                ev.SetPolicy(now=now, group=group, policy=wanted.kind, aging=wanted.aging)
            )
    for group, configured in config.group_nodes.items():
        known = table.nodes.get(group, ())
        if missing := [node for node in configured if node not in known]:
            events.append(ev.SetGroupNodes(now=now, group=group, nodes=(*known, *missing)))
    return events
