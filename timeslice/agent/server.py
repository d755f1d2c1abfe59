"""The Agent: one per node. It moves jobs' accelerator contexts to host memory and
back through its backends, and keeps the job table that says where each is.

The public class composes the parts, each in a module of its own:
- `engine.AgentEngine`: handle an event, save the table, act on its effects;
- `channels.WorkloadChannels`: the workloads registered over their channels;
- `switching.switch_group`: one node's part of a switch, as the table plans it;
- `link.OrchestratorLink`: the session with the orchestrator;
- `service.AgentService`: the gRPC servicers, over this class's methods.
This module is the lifecycle (start, close) and what the servicers call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from timeslice.agent import state as st
from timeslice.agent.channels import WorkloadChannel, WorkloadChannels
from timeslice.agent.config import AgentConfig
from timeslice.agent.engine import AgentEngine
from timeslice.agent.link import OrchestratorLink
from timeslice.agent.local_socket import BoundSocket, bind_unix, remove_socket
from timeslice.agent.pipeline import Pace
from timeslice.agent.service import AgentService, HealthService
from timeslice.agent.state import Job, JobState, JobTable, Operation
from timeslice.agent.store import StateStore
from timeslice.api.bounds import MAX_FENCING_TOKEN, MAX_ORCHESTRATOR_EPOCH
from timeslice.api.connections import connection_limits
from timeslice.security.callers import Authenticator
from timeslice.api.h2edge import EdgeServer, edge_server
from timeslice.api.serving import CallGate, GrpcServer
from timeslice.backends import (
    AcceleratorMemory,
    Backend,
    BackendContext,
    JobRef,
    known_backends,
    load_backend,
    pipelined,
)
from timeslice.backends._processes import pid_exists
from timeslice.errors import ConflictError, InvalidArgumentError, TimeSliceError
from timeslice.fencing import proves
from timeslice.ids import check_id
from timeslice.kinds import Liveness, OpKind

if TYPE_CHECKING:  # imported when metrics are on: prometheus-client is slow to load
    from timeslice.metrics.agent import AgentMetrics
    from timeslice.metrics.http import MetricsServer

__all__ = ["Agent", "AgentConfig"]

log = logging.getLogger(__name__)


class Agent:
    """Snapshots and restores jobs' accelerator contexts on this node.

    `async with Agent(node_name="n1", db="sqlite:///agent.db") as agent:` serves
    on `agent.address` until the block ends.
    """

    def __init__(self, config: AgentConfig | None = None, **options: Any) -> None:
        if config is not None and options:
            raise TypeError("pass either a config or options, not both")
        self.config = config or AgentConfig(**options)
        self.channels = WorkloadChannels(self.config.node_name)
        self.backends: dict[str, Backend] = {}
        self.unavailable: dict[str, str] = {}  # backend name -> why it cannot serve
        self._store = StateStore(self.config.db)
        self.engine = AgentEngine(
            self._new_table(),
            self._store,
            self._backend,
            self.config.operation_retention,
            self.config.node_name,
        )
        self._server: EdgeServer | GrpcServer | None = None
        self._unix_server: EdgeServer | GrpcServer | None = None
        self._unix: BoundSocket | None = None
        self._address: str | None = None
        self._state = "new"
        self.gate = CallGate(
            "the agent",
            self.config.max_message_bytes,
            self.config.message_timeout,
            Authenticator(self.config.auth, "the agent"),
        )
        #: Set when the agent starts closing (health watchers are told).
        self.stopping = asyncio.Event()
        self._switch_locks: dict[str, asyncio.Lock] = {}
        # Workloads that registered over a channel since this agent started.
        self._connected: set[tuple[str, str]] = set()
        self._link: OrchestratorLink | None = None
        # Per group, the newest fencing token the orchestrator said it issued.
        self._issued_tokens: dict[str, int] = {}
        #: The metrics (with `metrics_port` set, once started), and their port.
        self.metrics: AgentMetrics | None = None
        self._metrics_server: MetricsServer | None = None

    def _new_table(self, saved: dict[str, Any] | None = None) -> JobTable:
        retention, max_jobs = self.config.operation_retention, self.config.max_jobs
        if saved is None:
            return JobTable(op_retention=retention, max_jobs=max_jobs)
        return JobTable.from_dict(saved, op_retention=retention, max_jobs=max_jobs)

    @property
    def table(self) -> JobTable:
        """The job table (read it; only the engine changes it)."""
        return self.engine.table

    def watch_changes(self, listener: Callable[[], None] | None) -> None:
        """Have `listener` called after every saved change of the job table (None:
        nobody), in the save's own callback: it must be cheap."""
        self.engine.changed = listener

    # --- lifecycle --------------------------------------------------------------------

    @property
    def address(self) -> str:
        """ "HOST:PORT" the server listens on (known once started)."""
        if self._address is None:
            raise RuntimeError("the agent is not started")
        return self._address

    @property
    def serving(self) -> bool:
        return self._state == "serving"

    async def start(self) -> None:
        """Load the job table, the backends, reconcile, and serve. Idempotent; cleans
        up after itself if it fails half way."""
        if self._state != "new":
            return
        try:
            await self._store.open()
            if (saved := await self._store.load()) is not None:
                self.engine.table = self._new_table(saved)
            await self._load_backends()
            self._state = "serving"
            self.engine.serving = True
            await self.engine.apply(st.Recover(now=time.time()))
            await self._listen()
            await self._listen_unix()
            await self._serve_metrics()
            self.gate.open = True
            if self.config.orchestrator is not None:
                self._link = OrchestratorLink(
                    self,
                    self.config.orchestrator,
                    tls=self.config.orchestrator_tls,
                    token=self.config.orchestrator_token,
                )
                self._link.start()
        except BaseException:
            # The cleanup must not replace the error that made the start fail.
            try:
                await self._shutdown()
            except Exception:
                log.exception("cleaning up after a failed start failed")
            raise

    async def close(self) -> None:
        """Stop serving: refuse new calls, close workload channels, let calls in flight
        finish, fail operations still running, save, stop listening. Idempotent."""
        if self._state == "closed":
            return
        self._state = "closing"
        self.engine.serving = False
        self.stopping.set()
        self.channels.close_all("the agent is shutting down")
        self.engine.wake_waiters()
        await self.gate.close(self.config.drain_timeout)
        await self._shutdown()

    async def _shutdown(self) -> None:
        if self._link is not None:
            await self._link.close()
        await self.engine.stop()
        self._state = "closed"
        if self._server is not None:
            await self._server.stop()
        await self._stop_unix()
        for backend in self.backends.values():
            try:
                await backend.close()
            except Exception:
                log.exception("closing backend %s failed", backend.name)
        await self._store.close()
        if self._metrics_server is not None:
            await self._metrics_server.stop()

    async def __aenter__(self) -> Agent:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _load_backends(self) -> None:
        installed = known_backends()
        names = self.config.backends or tuple(sorted(installed))
        if unknown := sorted(set(names) - set(installed)):
            raise InvalidArgumentError(
                f"unknown backend(s) {', '.join(unknown)}; installed: {', '.join(sorted(installed))}"
            )
        for name in names:
            options = self.config.backend_options.get(name, {})
            context = BackendContext(
                self.config.node_name,
                self.channels,
                options,
                self.config.app_endpoint_allow,
                cgroup_root=self.config.cgroup_root,
            )
            try:
                self.backends[name] = load_backend(name)(context)
            except TimeSliceError as exc:
                self.unavailable[name] = exc.message
                log.warning("backend %s is not available: %s", name, exc.message)
            except Exception as exc:
                self.unavailable[name] = f"{type(exc).__name__}: {exc}"
                log.warning("backend %s failed to start: %s", name, exc)

    async def _listen(self) -> None:
        self._server = self._edge_server()
        self._address = await self._server.serve_configured(self.config)

    async def _serve_metrics(self) -> None:
        """Metrics and the HTTP probes on `metrics_port` (when set), fed by the engine."""
        if not self.config.metrics_port:
            return
        from timeslice.metrics.agent import AgentMetrics
        from timeslice.metrics.http import MetricsServer

        self.metrics = AgentMetrics(
            lambda: (job.state for job in self.table.jobs.values()), lambda: len(self.channels)
        )
        self.engine.finished = self.metrics.finished
        host = self.config.metrics_host or self.config.host
        server = MetricsServer(
            host, self.config.metrics_port, self.metrics.registry, lambda: self.serving
        )
        await server.start()
        self._metrics_server = server
        log.info("metrics on http://%s/metrics", server.address)

    @property
    def metrics_address(self) -> str | None:
        """ "HOST:PORT" of the metrics and probe port (None: off or not started)."""
        return self._metrics_server.address if self._metrics_server is not None else None

    async def _listen_unix(self) -> None:
        """Serve the same services on the Unix socket too, if configured."""
        if self.config.socket is None:
            return
        self._unix = bind_unix(self.config.socket)
        self._unix_server = self._edge_server()
        await self._unix_server.start(sock=self._unix.sock)

    def _edge_server(self) -> EdgeServer | GrpcServer:
        services = [AgentService(self), HealthService(self)]
        return edge_server(self.config.http2, services, connection_limits(self.config), "the agent")

    async def _stop_unix(self) -> None:
        if self._unix_server is not None:
            await self._unix_server.stop()
        if self._unix is not None:
            remove_socket(self._unix)
            self._unix.sock.close()
            self._unix = None

    @property
    def socket_address(self) -> str | None:
        """ "unix:PATH" of the agent's Unix socket, or None when it serves none."""
        return None if self._unix is None else f"unix:{self._unix.path}"

    def _backend(self, name: str) -> Backend:
        backend = self.backends.get(name)
        if backend is not None:
            return backend
        if name in self.unavailable:
            raise ConflictError(f"backend {name} is not available: {self.unavailable[name]}")
        if name in known_backends():
            raise ConflictError(f"backend {name} is disabled on this agent")
        load_backend(name)  # raises the error that lists the installed backends
        raise ConflictError(f"backend {name} is disabled on this agent")

    # --- what the service calls -------------------------------------------------------

    async def ended(self, op_id: str, wait: float) -> None:
        """Return once operation `op_id` has ended in the job table (its end perhaps not
        saved yet: see `flush`), or after `wait` seconds."""
        await self.engine.ended(op_id, wait)

    async def flush(self) -> None:
        """Return once every change made so far is saved."""
        await self.engine.flush()

    async def operation(self, op_id: str, wait: float = 0.0) -> Operation:
        """Operation `op_id`, once finished or after `wait` seconds, whichever first."""
        return await self.engine.operation(op_id, wait)

    def switch_lock(self, group: str) -> asyncio.Lock:
        """Held while a switch of `group` runs: switches of one group run one at a time."""
        return self._switch_locks.setdefault(group, asyncio.Lock())

    def liveness(self, job: Job) -> Liveness:
        """What this node sees of the job's workload: ALIVE (its channel open, or one
        of its processes running), GONE (all of them ended), UNKNOWN (nothing to
        watch: a job known only by a backend without processes, or a workload that
        has not come back since this agent started: it may be reconnecting)."""
        if job.backend == "app_channel":
            if self.channels.get(job.group, job.job) is not None:
                return Liveness.ALIVE
            return Liveness.GONE if job.key in self._connected else Liveness.UNKNOWN
        pids = [int(c.removeprefix("pid:")) for c in job.claims if c.startswith("pid:")]
        if not pids:
            return Liveness.UNKNOWN
        return Liveness.ALIVE if any(pid_exists(pid) for pid in pids) else Liveness.GONE

    async def check_token(
        self, group: str, token: int, proof: bytes = b"", *, epoch: int = 0
    ) -> None:
        """Refuse a fencing token that the orchestrator never issued for `group`,
        and a command of an orchestrator `epoch` lower than the highest seen;
        take (and save) an epoch higher than any seen before returning.

        Taken, a token from the future would make every real command for the
        group stale, for good (the newest token seen is saved); an epoch from
        the future, every command of the real orchestrator. So a token newer
        than any seen for the group, or an epoch newer than any seen, is taken
        only with the orchestrator's `proof` (`timeslice.fencing`: what its
        switches carry, of the group, token and epoch), or once the
        orchestrator, asked, says it issued a token and reached an epoch at
        least as new. An agent without an orchestrator has nobody to ask, and
        takes them as sent (it listens on loopback unless told otherwise).
        """
        if token > MAX_FENCING_TOKEN:
            raise InvalidArgumentError(f"fencing token {token} is out of range")
        if epoch > MAX_ORCHESTRATOR_EPOCH:
            raise InvalidArgumentError(f"orchestrator epoch {epoch} is out of range")
        self.table.check_epoch(epoch)  # a deposed orchestrator's: refused before asking
        new_epoch = epoch > self.table.orchestrator_epoch
        if self._link is not None and (new_epoch or self._new_token(group, token)):
            await self._vouch(group, token, proof, epoch)
        if new_epoch:
            await self.engine.apply(st.TakeEpoch(now=time.time(), epoch=epoch))

    def _new_token(self, group: str, token: int) -> bool:
        """Whether `token` is newer than any seen or vouched for in `group`."""
        known = max(self.table.tokens.get(group, 0), self._issued_tokens.get(group, 0))
        return token > known

    async def _vouch(self, group: str, token: int, proof: bytes, epoch: int) -> None:
        """Refuse `token` of `group` and orchestrator `epoch` unless they are proven
        or the orchestrator says it has issued and reached them."""
        assert self._link is not None
        if proves(self._link.token_key, group, token, proof, epoch=epoch):
            if token:  # the orchestrator has issued it, then
                self._issued_tokens[group] = max(token, self._issued_tokens.get(group, 0))
            return
        issued = await self._link.issued(group)
        if issued.token:  # groups the orchestrator knows only: any caller may name others
            self._issued_tokens[group] = max(issued.token, self._issued_tokens.get(group, 0))
        if self._new_token(group, token):
            raise ConflictError(
                f"fencing token {token} for group {group!r} was never issued: the"
                f" orchestrator's newest is {issued.token}"
            )
        if epoch > issued.epoch:
            raise ConflictError(
                f"orchestrator epoch {epoch} was never reached: the orchestrator's"
                f" is {issued.epoch}"
            )

    async def start_operation(
        self,
        kind: OpKind,
        group: str,
        job: str,
        *,
        backend: str | None = None,
        config: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        token: int = 0,
        timeout: float | None = None,
        pace: Pace | None = None,
    ) -> str:
        """Start a snapshot or restore; return its operation id. The backend checks a
        new job's config and the operation's parameters first; the table decides the rest.
        `pace`: the pipelined switch the operation is a step of."""
        check_id("job_id", job)
        if group:
            check_id("group", group)
        known = self.table.find(group, job)
        if not group and known is not None:
            group = known.group  # found by its id alone, as v1alpha1 clients ask
        await self.check_token(group, token)
        name = backend or (known.backend if known else None)
        claims: tuple[str, ...] = ()
        if name is not None:
            chosen = self._backend(name)
            ref = JobRef(group, job, known.config if known else (config or {}))
            if known is None and kind == st.SNAPSHOT:
                claims = await chosen.check(ref)
            await chosen.check_operation(ref, kind, params or {})
        event = st.Start(
            now=time.time(),
            kind=kind,
            group=group,
            job=job,
            timeout=timeout or self.config.operation_timeout,
            token=token,
            backend=backend,
            config=config,
            claims=claims,
            params=params or {},
        )
        key = (group, job)
        if pace is not None:
            self.engine.paces[key] = pace
        try:
            await self.engine.apply(event)
        finally:
            if pace is not None and self.engine.paces.get(key) is pace:
                del self.engine.paces[key]  # refused, or not saved: it never ran
        return self.table.job(group, job).operation

    def pipelines(self, group: str, job: str) -> bool:
        """Whether the job's saved context can come back step by step while a switch's
        snapshots are under way (its backend knows the steps)."""
        known = self.table.find(group, job)
        if known is None or known.state is not JobState.SAVED:
            return False
        backend = self.backends.get(known.backend)
        paced = pipelined(backend) if backend is not None else None
        return paced is not None and paced.pipelines(JobRef(known.group, known.job, known.config))

    async def reset(self, group: str, job: str, wait: float = 5.0, *, epoch: int = 0) -> JobState:
        """Clear a job's fault (for the orchestrator of `epoch`; 0: an operator's
        call); return its state once its backend has told it."""
        await self.check_token(group, 0, epoch=epoch)
        await self.engine.apply(st.Reset(now=time.time(), group=group, job=job, epoch=epoch))
        found = self.table.job(group, job)
        asking = self.engine.reconciling.get(found.key)
        if asking is not None:
            await asyncio.wait({asking}, timeout=wait)
        return found.state

    async def accelerators(self) -> list[AcceleratorMemory]:
        """Memory of every accelerator the backends can see."""
        seen: dict[str, AcceleratorMemory] = {}
        for backend in self.backends.values():
            try:
                for memory in await backend.accelerators():
                    seen.setdefault(memory.id, memory)
            except Exception as exc:
                log.warning("backend %s could not read accelerator memory: %s", backend.name, exc)
        return list(seen.values())

    async def register(self, channel: WorkloadChannel, state: JobState) -> None:
        """A workload registered over its channel."""
        event = st.Register(
            now=time.time(),
            group=channel.group,
            job=channel.job,
            backend="app_channel",
            config={},
            state=state,
            owner=channel.owner,
        )
        self._backend("app_channel")
        known = self.table.jobs.get((channel.group, channel.job))
        # Before the table learns of it; the owner it has kept holds across restarts.
        self.channels.check_attach(channel, known.owner if known is not None else "")
        saved = self.engine.apply(event)  # raises at once if the table refuses it
        # Attached in the same step as the table learns of the job, so that no request
        # can find the job without its channel.
        channel.state = state.value
        self.channels.attach(channel)
        self._connected.add((channel.group, channel.job))
        await saved

    def unregister(self, channel: WorkloadChannel, reason: str, deregistered: bool) -> None:
        """A workload's channel ended: the job is forgotten if the workload said goodbye
        (ended its stream cleanly), else marked lost."""
        if self.channels.detach(channel) and self._state == "serving":
            now = time.time()
            ended = st.Forget if deregistered else st.Lost
            self.engine.apply(ended(now=now, group=channel.group, job=channel.job, reason=reason))
