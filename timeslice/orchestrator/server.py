"""The Orchestrator: the lock table behind a gRPC server, with its journal.

The public class composes the parts, each in a module of its own:
- `engine.JournalEngine`: handle an event, journal it, act on its effects, timers;
- `calls.WaitingCalls`: the Acquire calls waiting for their answers;
- `watches.WatchHub`: what watchers are told;
- `handoff.HandoffDriver`: the switches on a group's nodes;
- `agents.AgentDirectory`: the agents in session, and what they report;
- `membership.Membership`: agents joining groups, and holders whose workload is gone;
- `kubernetes.KubernetesDiscovery`: groups, nodes and jobs from Kubernetes labels;
- `service.OrchestratorService`: the gRPC servicer, over this class's methods.
This module is the lifecycle (start, close) and the methods the servicer and
embedding programs call; `_act` says what each effect makes the shell do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from timeslice.api.connections import connection_limits
from timeslice.api.health import HealthService
from timeslice.security.callers import Authenticator
from timeslice.api.h2edge import EdgeServer, edge_server
from timeslice.api.serving import CallGate, GrpcServer, until_set
from timeslice.errors import (
    ConflictError,
    InvalidArgumentError,
    JournalClaimLostError,
    NotFoundError,
    TimeSliceError,
    UnavailableError,
)
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.agents import AgentDirectory
from timeslice.orchestrator.calls import Call, WaitingCalls, left_queue_error, rollback
from timeslice.orchestrator.config import OrchestratorConfig, settings_events
from timeslice.orchestrator.decisions import DecisionLog
from timeslice.orchestrator.engine import JournalEngine, fold
from timeslice.orchestrator.events import Effect, Event, Reason
from timeslice.orchestrator.handoff import HandoffDriver
from timeslice.orchestrator.journal import Journal, SqlJournal, open_journal
from timeslice.orchestrator.kubernetes import KubernetesDiscovery
from timeslice.orchestrator.leadership import Leadership, LeaseRow, Role
from timeslice.orchestrator.membership import Membership
from timeslice.orchestrator.model import Group
from timeslice.orchestrator.service import OrchestratorService
from timeslice.orchestrator.state import LockTable
from timeslice.orchestrator.watches import Notice as Notice  # for watchers to import here
from timeslice.orchestrator.watches import Render, WatchHub
from timeslice.orchestrator.watches import Watch as Watch  # for watchers to import here
from timeslice.targets import active_from_metadata, is_wildcard

if TYPE_CHECKING:  # imported when metrics are on: prometheus-client is slow to load
    from timeslice.metrics.http import MetricsServer
    from timeslice.metrics.orchestrator import OrchestratorMetrics

__all__ = ["Notice", "Orchestrator", "OrchestratorConfig", "Watch"]

#: The name the health service answers for, besides "" (the whole server).
SERVICE_NAME = "timeslice_orchestrator.v1alpha1.TimeSliceOrchestratorService"

log = logging.getLogger(__name__)


class Orchestrator:
    """Grants each group's accelerators to one job at a time, durably.

    `async with Orchestrator(db="sqlite:///journal.db") as orch:` serves on
    `orch.address` until the block ends. Port 0 (the default) picks a free port.
    """

    def __init__(self, config: OrchestratorConfig | None = None, **options: Any) -> None:
        if config is not None and options:
            raise TypeError("pass either a config or options, not both")
        self.config = config or OrchestratorConfig(**options)
        self.engine: JournalEngine | None = None
        self._journal: Journal | None = None
        self._server: GrpcServer | EdgeServer | None = None
        self._address: str | None = None
        self._state = "new"  # new -> serving -> closed
        self.calls = WaitingCalls()
        self.watches = WatchHub(self.config.max_watchers, self.config.watch_backlog)
        self.gate = CallGate(
            "the orchestrator",
            self.config.max_message_bytes,
            self.config.message_timeout,
            Authenticator(self.config.auth, "the orchestrator"),
        )
        self.agents = AgentDirectory(
            tls=self.config.agent_tls, token=self.config.agent_token, http2=self.config.http2
        )
        self.handoff = HandoffDriver(
            self, self.agents, self.config.switch_timeout, self.config.revoked_snapshot_timeout
        )
        self.membership = Membership(self, self.agents, lambda: self._state == "serving")
        self._closing = asyncio.Event()
        self._stopped = asyncio.Event()
        self._closer: asyncio.Task[None] | None = None
        self._start_failure: BaseException | None = None
        self.discovery: KubernetesDiscovery | None = None
        #: The metrics (with `metrics_port` set, once started), and their port.
        self.metrics: OrchestratorMetrics | None = None
        self._metrics_server: MetricsServer | None = None
        # Listening as a standby: every call but the health service's is refused.
        self._standby = False

    @property
    def table(self) -> LockTable:
        """The lock table (read it; only `apply` changes it)."""
        if self.engine is None:
            raise RuntimeError("the orchestrator is not started")
        return self.engine.table

    @property
    def epoch(self) -> int:
        """The lock table's epoch, raised at every start and takeover and sent with
        every command to the agents (0: the journal is not folded yet)."""
        return self.engine.table.epoch if self.engine is not None else 0

    @property
    def serving(self) -> bool:
        """Whether it may grant now: started, its journal open, not closing."""
        return self._state == "serving" and self.failure is None and self._lease_held()

    @property
    def metrics_address(self) -> str | None:
        """ "HOST:PORT" of the metrics and probe port (None: off or not started)."""
        return self._metrics_server.address if self._metrics_server is not None else None

    @property
    def failure(self) -> BaseException | None:
        """Why the orchestrator stopped on its own (a journal write failed), if it did."""
        return self.engine.failure if self.engine is not None else self._start_failure

    # --- lifecycle --------------------------------------------------------------------

    @property
    def address(self) -> str:
        """ "HOST:PORT" the server listens on (known once started)."""
        if self._address is None:
            raise RuntimeError("the orchestrator is not started")
        return self._address

    async def start(self) -> None:
        """Open the journal, rebuild the table, and start serving. Idempotent; cleans
        up after itself if it fails half way.

        On a PostgreSQL journal another orchestrator may hold the leader lease: this
        one then listens as a standby (NOT_SERVING on health, every other call
        UNAVAILABLE) and returns only once it has taken the lease over and folded
        the journal, as a restart does."""
        if self._state != "new":
            return
        try:
            self._journal = open_journal(
                self.config.db,
                retention=self.config.journal_retention,
                on_claim_lost=self._claim_lost,
                leader_lease=self.config.leader_lease,
                on_standby=self._waiting_as_standby,
                advertise=self.advertised,
            )
            if isinstance(self._journal, SqlJournal) and self._journal.shared:
                self._standby = True
                await self._listen()
                self.gate.open = True  # the health service answers; the rest is refused
            await self._journal.open()
            self.engine = await self._restore(self._journal)
            await self._begin_epoch()
            if self._server is None:
                await self._listen()
            self._watch_metrics()
            if self.failure is not None:  # the journal's claim was lost meanwhile
                raise self.failure
            await self._discover()
        except BaseException:
            # The cleanup must not replace the error that made the start fail.
            try:
                await self._shutdown()
            except Exception:
                log.exception("cleaning up after a failed start failed")
            raise
        self._state = "serving"
        self._standby = False
        self.gate.open = True

    def _waiting_as_standby(self, row: LeaseRow | None) -> None:
        holder = f"{row.holder} (epoch {row.epoch})" if row is not None else "another orchestrator"
        log.info(
            "standby on %s: %s holds the leader lease; taking over when it expires",
            self._address,
            holder,
        )

    def advertised(self) -> str:
        """Where clients reach this orchestrator ("": unknown): `advertise`, or the
        address it listens on unless that is a wildcard."""
        if self.config.advertise is not None:
            return self.config.advertise
        if self._address is None or is_wildcard(self.config.host):
            return ""
        return self._address

    def active_address(self) -> str | None:
        """A standby's view of where the active serves (the lease row as it last read
        it), for the clients it refuses; None when it is not a standby or does not know."""
        lease = self._journal.lease if isinstance(self._journal, SqlJournal) else None
        if not self._standby or lease is None:
            return None
        row = lease.row
        if row is None or not row.address or row.address == self.advertised():
            return None
        if row.expires_at < row.now:
            return None  # its holder stopped renewing: this one takes over next
        return row.address if active_from_metadata([row.address]) is not None else None

    def refusal(self) -> str | None:
        """Why calls are refused now, if they are: a standby refuses them all, and so
        does an active whose leader lease may have run out (it steps down)."""
        if self._standby:
            return (
                "this orchestrator is a standby: another one holds its journal's"
                " leader lease; retry against the active"
            )
        if self._state == "serving" and not self._lease_held():
            return (
                "this orchestrator's leader lease ran out before it was renewed:"
                " it steps down; retry against the active"
            )
        return None

    def leadership(self) -> Leadership:
        """This orchestrator's standing on its journal: active (the only writer, when
        the journal has no leader lease), standby, or stepped down (stopping)."""
        lease = self._journal.lease if isinstance(self._journal, SqlJournal) else None
        if lease is None:  # the only writer (a standby needs a lease)
            return Leadership(role=Role.ACTIVE if self.serving else Role.STEPPED_DOWN)
        if self._standby:  # a lease just taken over, the journal not folded yet: not serving
            return dataclasses.replace(lease.leadership(), role=Role.STANDBY)
        return lease.leadership()

    def _lease_held(self) -> bool:
        """False once an active's leader lease may have run out (it steps down then)."""
        lease = self._journal.lease if isinstance(self._journal, SqlJournal) else None
        return lease is None or lease.check_held()

    async def close(self) -> None:
        """Stop serving: refuse new calls, let those in flight finish (blocked
        Acquires are told to retry: their places in the queues are kept), flush the
        journal, then stop listening. Idempotent."""
        if self._state == "closed":
            return
        self._set_closed()
        self.calls.fail_all(UnavailableError("the orchestrator is shutting down; retry"))
        self.watches.close()
        await self.gate.close(self.config.drain_timeout)
        await self._shutdown()

    def _set_closed(self) -> None:
        self._state = "closed"
        self._closing.set()
        if self.engine is not None:
            self.engine.closing()

    async def _shutdown(self) -> None:
        self._set_closed()
        if self.discovery is not None:
            await self.discovery.close()
        await self.handoff.close()
        if self.engine is not None:
            await self.engine.stop()
        self.watches.close()
        if self._server is not None:
            await self._server.stop()
        await self.agents.close()
        if self._journal is not None:
            await self._journal.close()
        if self._metrics_server is not None:
            await self._metrics_server.stop()
        self._stopped.set()

    async def wait_stopped(self) -> None:
        """Return once the orchestrator has stopped: closed, or failed (see `failure`)."""
        await self._stopped.wait()

    async def __aenter__(self) -> Orchestrator:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _restore(self, journal: Journal) -> JournalEngine:
        loaded = await journal.load()
        table = fold(loaded)
        table.limits = self.config.table_limits()
        if len(loaded.tail) >= self.config.snapshot_every:
            await journal.save_snapshot(loaded.last_seq, table.to_dict())
        log.info(
            "journal: snapshot at %d, %d event(s) replayed, %d group(s)",
            loaded.snapshot_seq,
            len(loaded.tail),
            len(table.groups),
        )
        engine = JournalEngine(
            table, journal, self._act, self._engine_failed, self.config.snapshot_every
        )
        engine.observers.append(
            DecisionLog(lambda group: engine.table.nodes.get(group, ())).observe
        )
        return engine

    async def _begin_epoch(self) -> None:
        now = time.time()
        for event in settings_events(self.config, self.table, now):
            self.apply(event)
        await self.apply(ev.Recover(now=now, grace=self.config.recovery_grace))
        # Switches the journal says were under way: the agents know how far each
        # got; running it again finishes it.
        for g in self.table.groups.values():
            if g.holder is not None and g.holder.switching:
                h = g.holder
                self.handoff.start(
                    ev.SwitchStarted(group=g.name, job=h.job, token=h.token, previous="")
                )

    async def _listen(self) -> None:
        health = HealthService(self.gate, self._closing, self._health)
        servicers = [OrchestratorService(self), health]
        self._server = edge_server(
            self.config.http2, servicers, connection_limits(self.config), "the orchestrator"
        )
        self._address = await self._server.serve_configured(self.config)
        await self._serve_metrics()

    def _groups(self) -> list[Group]:
        return list(self.engine.table.groups.values()) if self.engine is not None else []

    def _health(self, service: str) -> bool:
        if service not in ("", SERVICE_NAME):
            raise NotFoundError(f"unknown service {service!r}")
        return self.serving

    async def _serve_metrics(self) -> None:
        """Metrics and the HTTP probes on `metrics_port` (when set), fed by the engine
        once there is one (`_watch_metrics`): a standby's /readyz answers 503."""
        if not self.config.metrics_port:
            return
        from timeslice.metrics.http import MetricsServer
        from timeslice.metrics.orchestrator import OrchestratorMetrics

        self.metrics = OrchestratorMetrics(
            lambda: ((g.name, len(g.queue)) for g in self._groups()),
            lambda: len(self.agents.addresses),
            self.leadership,
        )
        host = self.config.metrics_host or self.config.host
        server = MetricsServer(
            host, self.config.metrics_port, self.metrics.registry, lambda: self.serving
        )
        await server.start()
        self._metrics_server = server
        log.info("metrics on http://%s/metrics", server.address)

    def _watch_metrics(self) -> None:
        """Feed the metrics (when on) from the engine: the holders now, then every event."""
        if self.metrics is None or self.engine is None:
            return
        engine, now = self.engine, time.time()
        self.metrics.seed(
            (g.name, h.token, h.job, now)
            for g in engine.table.groups.values()
            if (h := g.holder) is not None and not h.switching
        )
        engine.observers.append(self.metrics.observe)
        engine.committed = self.metrics.committed

    async def _discover(self) -> None:
        """Follow Kubernetes labels, if configured (its client is imported only then)."""
        if not self.config.kubernetes:
            return
        self.discovery = KubernetesDiscovery(self, kubeconfig=self.config.kubeconfig)
        await self.discovery.start()

    def _engine_failed(self, error: TimeSliceError) -> None:
        """The journal failed: every call in the air fails, and the orchestrator closes."""
        self.calls.fail_all(error)
        if self._closer is None:
            self._closer = asyncio.get_running_loop().create_task(self.close())

    def _claim_lost(self, error: JournalClaimLostError) -> None:
        """Another orchestrator may write the journal now: stop granting at once, as
        after a failed write. During a start, the start fails instead."""
        if self.engine is None or self._state == "new":
            self._start_failure = error
            if self.engine is not None:
                self.engine.failure = error
        else:
            self.engine.claim_lost(error)

    # --- effects ----------------------------------------------------------------------

    def apply(self, event: Event) -> asyncio.Future[list[Effect]]:
        """Handle `event` now; the future resolves once it is durable and acted on.
        Raises (leaving everything unchanged) if the table refuses the event."""
        if self.engine is None:
            raise UnavailableError("the orchestrator is not started")
        return self.engine.apply(event)

    def _act(self, effects: list[Effect]) -> None:
        """Carry out effects whose event is durable."""
        for effect in effects:
            match effect:
                case ev.Granted():
                    if not self.calls.deliver(effect) and effect.call_id and effect.must_deliver:
                        # The call that asked is gone: roll the grant back.
                        revoke = ev.Revoke(
                            now=time.time(),
                            group=effect.group,
                            token=effect.token,
                            reason=Reason.NOT_DELIVERED,
                            call_id=effect.call_id,
                        )
                        self.apply(revoke)
                    self.membership.check_holder(effect.group)
                case ev.LeftQueue():
                    self.calls.fail(effect.call_id, left_queue_error(effect))
                case ev.Revoked(call_id=call_id) if call_id:
                    # A grant whose switch failed: its Acquire is still waiting.
                    self.calls.fail(call_id, ConflictError(f"{effect.group}: {effect.why}"))
                case ev.SwitchStarted():
                    self.handoff.start(effect)
                case ev.Superseded():
                    took = (
                        f"a newer Acquire of {effect.job} on {effect.group} took this one's place"
                    )
                    self.calls.fail(effect.call_id, ConflictError(took))
                case ev.Yielded(again=True):
                    continue  # a retry's answer: nothing happened to tell watchers
                case (
                    ev.Queued()
                    | ev.Yielded()
                    | ev.Revoked()
                    | ev.LeaseRenewed()
                    | ev.YieldRequested()
                    | ev.Quarantined()
                    | ev.JobReset()
                ):
                    pass  # answered by their calls, or only told to watchers
                case _:
                    raise TypeError(f"not an effect: {effect!r}")
            self.watches.publish(effect)

    # --- agents -----------------------------------------------------------------------

    def group_agents(self, group: str) -> list[tuple[str, str | None]]:
        """(node, address or None) for every node of `group`."""
        return self.membership.group_agents(group)

    async def until_closed(self, items: AsyncIterator[_T]) -> AsyncIterator[_T]:
        """`items`, until they end or the orchestrator starts closing."""
        async for item in until_set(items, self._closing):
            yield item

    # --- what the service calls -------------------------------------------------------

    async def set_group_nodes(self, group: str, nodes: tuple[str, ...]) -> None:
        """Name the nodes `group` spans (empty: none)."""
        await self.apply(ev.SetGroupNodes(now=time.time(), group=group, nodes=nodes))

    async def register_job(
        self, group: str, job: str, node: str, backend: dict[str, Any] | None, by: str = ""
    ) -> None:
        """Record the backend `job`'s contexts need on `group` (on `node` only, when
        set), registered by principal `by` ("" none)."""
        event = ev.SetJobBackend(
            now=time.time(), group=group, job=job, node=node, backend=backend, by=by
        )
        await self.apply(event)

    async def reset_job(self, group: str, job: str) -> bool:
        """Lift `job`'s quarantine on `group`, and clear its fault on the group's agents.
        True if the orchestrator had it quarantined."""
        effects = await self.apply(ev.ResetJob(now=time.time(), group=group, job=job))
        agents = [a for _, a in self.group_agents(group) if a]
        await self.agents.reset(group, job, agents, epoch=self.table.epoch)
        return bool(effects)

    async def acquire(
        self,
        group: str,
        job: str,
        *,
        request_id: str = "",
        lease_ttl: float | None = None,
        wait_timeout: float | None = None,
        priority: int = 0,
    ) -> ev.Granted:
        """Wait until `job` holds `group`."""
        [grant] = await self.acquire_groups(
            [group],
            job,
            request_id=request_id,
            lease_ttl=lease_ttl,
            wait_timeout=wait_timeout,
            priority=priority,
        )
        return grant

    async def acquire_groups(
        self,
        groups: Sequence[str],
        job: str,
        *,
        request_id: str = "",
        lease_ttl: float | None = None,
        wait_timeout: float | None = None,
        priority: int = 0,
        principal: str = "",
    ) -> list[ev.Granted]:
        """Wait until `job` holds every one of `groups`, granted all at once; return
        the grants in the order of `groups`. `principal`: who asks (the grants are
        bound to it; "" for a caller without a name)."""
        if wait_timeout is not None and wait_timeout < 0:
            raise InvalidArgumentError("wait timeout must not be negative")
        if not groups:
            raise InvalidArgumentError("name at least one group")
        now = time.time()
        call = self.calls.open(self.table.epoch, job, tuple(dict.fromkeys(groups)))
        first, *more = call.groups
        event = ev.Acquire(
            now=now,
            group=first,
            job=job,
            call_id=call.call_id,
            request_id=request_id,
            lease_ttl=lease_ttl,
            wait_deadline=now + wait_timeout if wait_timeout is not None else None,
            priority=priority,
            more_groups=tuple(more),
            principal=principal,
            # The lease ids of these grants: unguessable from the tokens anyone sees.
            lease_secret=secrets.token_urlsafe(16),
        )
        try:
            # Not shielded: a cancelled call cancels the engine's future of its event,
            # which the engine leaves alone (the event is written and acted on all the same).
            await self.apply(event)
            return await call.future
        except asyncio.CancelledError:
            self._abandon(call)
            raise
        except TimeSliceError:
            if len(call.groups) > 1:
                self._abandon(call)  # what was granted of it goes back
            raise
        finally:
            self.calls.close(call)

    def _abandon(self, call: Call) -> None:
        """The caller went away (or a bundle failed part way): take it out of the
        queues, and roll back what it was granted."""
        self.calls.close(call)
        if call.future.done() and not call.future.cancelled():
            call.future.exception()  # nobody will read it now (a shutdown's, say)
        if self._state == "closed" or self.failure is not None:
            return  # its place is kept: the client retries against the next start
        for event in rollback(call, self.table, time.time()):
            self.apply(event)

    async def yield_(
        self,
        group: str,
        job: str,
        *,
        request_id: str = "",
        token: int | None = None,
        principal: str = "",
    ) -> ev.Yielded:
        """Release `group`, held by `job` (for `principal`, when named: the one that
        acquired it)."""
        event = ev.Yield(
            now=time.time(),
            group=group,
            job=job,
            request_id=request_id,
            token=token,
            principal=principal,
        )
        return _first(await self.apply(event), ev.Yielded)

    async def keep_alive(
        self, group: str, job: str, lease_id: str, *, principal: str = ""
    ) -> ev.LeaseRenewed:
        """Renew the holder's lease (for `principal`, when named: the one that
        acquired it)."""
        event = ev.KeepAlive(
            now=time.time(), group=group, job=job, lease_id=lease_id, principal=principal
        )
        return _first(await self.apply(event), ev.LeaseRenewed)

    async def force_release(self, group: str, job: str = "", reason: str = "") -> list[Effect]:
        """Take `group` away from its holder (operator action)."""
        event = ev.ForceRelease(now=time.time(), group=group, job=job, reason=reason)
        return await self.apply(event)

    def group(self, name: str) -> Group:
        """The group named `name`, read-only. A group with nodes that nobody has asked
        for yet is known too (idle)."""
        group = self.table.groups.get(name)
        if group is None and name in self.table.nodes:
            return Group(name=name, state_since=0.0)
        if group is None:
            raise NotFoundError(f"unknown group {name!r}")
        return group

    def group_names(self) -> list[str]:
        """Every group: asked for, or with nodes."""
        return sorted({*self.table.groups, *self.table.nodes})

    def watch(self, group: str = "", render: Render | None = None) -> Watch[Any]:
        """What happens to `group` ("" for all), from this call on until close: `Notice`s,
        or what `render` makes of each. Over `max_watchers` it raises
        ResourceExhaustedError; a watch that falls `watch_backlog` behind is ended."""
        return self.watches.watch(group, render) if render else self.watches.watch(group)


_T = TypeVar("_T")


def _first(effects: list[Effect], kind: type[_T]) -> _T:
    for effect in effects:
        if isinstance(effect, kind):
            return effect
    raise TypeError(f"no {kind.__name__} among {effects!r}")
