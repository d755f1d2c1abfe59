"""The Agent: one per node. It moves jobs' accelerator contexts to host memory and
back through its backends, and keeps the job table that says where each is.

Every change goes the same way as in the orchestrator: the pure `JobTable`
handles the event (or refuses it), the table is saved, and only then are the
effects carried out: an operation started on its backend, a waiting
`GetOperation` answered. Saves are coalesced: one write covers every change
made while the previous write was under way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from timeslice.agent import state as st
from timeslice.agent.channels import WorkloadChannel, WorkloadChannels
from timeslice.agent.link import OrchestratorLink
from timeslice.agent.state import Job, JobState, JobTable, Operation, OpStatus
from timeslice.agent.store import StateStore
from timeslice.api.bounds import MAX_FENCING_TOKEN
from timeslice.fencing import proves
from timeslice.api.connections import connection_limits
from timeslice.api.serving import CallGate, GrpcServer
from timeslice.backends._processes import pid_exists
from timeslice.client._transport import parse_target
from timeslice.orchestrator.model import check_id
from timeslice.backends import (
    AcceleratorMemory,
    Backend,
    BackendContext,
    JobRef,
    known_backends,
    load_backend,
)
from timeslice.errors import (
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    TimeSliceError,
    UnavailableError,
)

log = logging.getLogger(__name__)

MiB = 1024 * 1024
# Finished operations saved with the job table: what GetOperation can still answer
# after a restart (every pending one is saved too).
SAVED_OPERATIONS = 16


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
    drain_timeout: float = 5.0
    # The orchestrator (HOST:PORT) to register with and report jobs to; None: none.
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

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise InvalidArgumentError(f"port {self.port} is out of range")
        connection_limits(self)  # checks them
        if not self.node_name:
            raise InvalidArgumentError("node_name must not be empty")
        check_id("node_name", self.node_name)
        for target in filter(None, (self.orchestrator, self.advertise)):
            parse_target(target)
        for group in self.groups:
            check_id("group", group)
        if self.operation_timeout <= 0 or self.operation_retention <= 0:
            raise InvalidArgumentError("operation timeout and retention must be positive")
        if self.max_jobs < 1:
            raise InvalidArgumentError("max_jobs must be positive")


class Agent:
    """Snapshots and restores jobs' accelerator contexts on this node.

    `async with Agent(node_name="n1", db="sqlite:///agent.db") as agent:` serves
    on `agent.address` until the block ends.
    """

    def __init__(self, config: AgentConfig | None = None, **options: Any) -> None:
        if config is not None and options:
            raise TypeError("pass either a config or options, not both")
        self.config = config or AgentConfig(**options)
        self.table = JobTable(
            op_retention=self.config.operation_retention, max_jobs=self.config.max_jobs
        )
        self.channels = WorkloadChannels()
        self.backends: dict[str, Backend] = {}
        self.unavailable: dict[str, str] = {}  # backend name -> why it cannot serve
        self._store = StateStore(self.config.db)
        self._server: GrpcServer | None = None
        self._address: str | None = None
        self._state = "new"
        self._waiting: list[asyncio.Future[None]] = []
        self._effects: list[st.Effect] = []
        self._saver: asyncio.Task[None] | None = None
        self._writing: asyncio.Future[Any] | None = None  # the changes the write under way saves
        self._tasks: dict[str, asyncio.Task[None]] = {}  # running operations
        self._background: set[asyncio.Task[None]] = set()
        self._reconciling: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._done: dict[str, asyncio.Event] = {}  # set once an operation's end is saved
        self._ended: dict[str, asyncio.Event] = {}  # set as soon as it is in the table
        self._timer: asyncio.TimerHandle | None = None
        self.gate = CallGate(
            "the agent", self.config.max_message_bytes, self.config.message_timeout
        )
        #: Set when the agent starts closing (health watchers are told).
        self.stopping = asyncio.Event()
        #: Set after every saved change of the job table (what reports wait on).
        self.changed = asyncio.Event()
        self._switch_locks: dict[str, asyncio.Lock] = {}
        # Workloads that registered over a channel since this agent started.
        self._connected: set[tuple[str, str]] = set()
        self._link: OrchestratorLink | None = None
        # Per group, the newest fencing token the orchestrator said it issued.
        self._issued_tokens: dict[str, int] = {}

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
            saved = await self._store.load()
            if saved is not None:
                self.table = JobTable.from_dict(
                    saved,
                    op_retention=self.config.operation_retention,
                    max_jobs=self.config.max_jobs,
                )
            await self._load_backends()
            self._state = "serving"
            await self._apply(st.Recover(time.time()))
            await self._listen()
            self.gate.open = True
            if self.config.orchestrator is not None:
                self._link = OrchestratorLink(self, self.config.orchestrator)
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
        self.stopping.set()
        self.channels.close_all("the agent is shutting down")
        for event in self._done.values():
            event.set()
        await self.gate.close(self.config.drain_timeout)
        await self._shutdown()

    async def _shutdown(self) -> None:
        if self._link is not None:
            await self._link.close()
        for op_id, task in list(self._tasks.items()):
            task.cancel()
            self._apply(st.Finish(time.time(), op_id, False, error="the agent shut down"))
        if self._saver is not None:
            await asyncio.gather(self._saver, return_exceptions=True)
        self._state = "closed"
        if self._timer is not None:
            self._timer.cancel()
        for task in [*self._tasks.values(), *self._background]:
            task.cancel()
        await asyncio.gather(*self._tasks.values(), *self._background, return_exceptions=True)
        if self._server is not None:
            await self._server.stop()
        for backend in self.backends.values():
            try:
                await backend.close()
            except Exception:
                log.exception("closing backend %s failed", backend.name)
        await self._store.close()

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
            context = BackendContext(self.config.node_name, self.channels, options)
            try:
                self.backends[name] = load_backend(name)(context)
            except TimeSliceError as exc:
                self.unavailable[name] = exc.message
                log.warning("backend %s is not available: %s", name, exc.message)
            except Exception as exc:
                self.unavailable[name] = f"{type(exc).__name__}: {exc}"
                log.warning("backend %s failed to start: %s", name, exc)

    async def _listen(self) -> None:
        from timeslice.agent.service import AgentService, HealthService

        self._server = GrpcServer(
            [AgentService(self), HealthService(self)],
            connection_limits(self.config),
            "the agent",
        )
        self._address = await self._server.serve(self.config.host, self.config.port)

    # --- the engine: handle, save, act ------------------------------------------------

    def _apply(self, event: st.Event) -> asyncio.Future[None]:
        """Handle `event`; the future resolves once the table is saved and the
        effects are under way. Raises (changing nothing) if the table refuses it."""
        effects = self.table.handle(event)
        for effect in effects:
            if isinstance(effect, st.Done) and (ended := self._ended.pop(effect.op_id, None)):
                ended.set()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._effects += effects
        self._waiting.append(done)
        if self._saver is None:
            self._saver = asyncio.get_running_loop().create_task(self._save())
        return done

    async def _save(self) -> None:
        try:
            # One turn of the loop first, so that what is decided in the same moment
            # (a switch starting its restore as its snapshot ends) joins this write.
            await asyncio.sleep(0)
            while self._waiting:
                waiting, self._waiting = self._waiting, []
                effects, self._effects = self._effects, []
                self._writing = asyncio.gather(*waiting, return_exceptions=True)
                try:
                    await self._store.save(self.table.to_dict(finished=SAVED_OPERATIONS))
                except Exception as exc:
                    log.error("saving the job table failed: %s", exc)
                    error = UnavailableError(f"the agent could not save its job table: {exc}")
                    for done in waiting:
                        done.set_exception(error)
                    continue
                self._act(effects)
                for done in waiting:
                    if not done.done():
                        done.set_result(None)
                self._rearm()
                self.changed.set()
        finally:
            self._saver = self._writing = None

    def _act(self, effects: list[st.Effect]) -> None:
        for effect in effects:
            match effect:
                case st.Run(op_id=op_id):
                    self._tasks[op_id] = self._spawn(self._run(op_id))
                case st.Cancel(op_id=op_id):
                    if (task := self._tasks.pop(op_id, None)) is not None:
                        task.cancel()
                case st.Done(op_id=op_id):
                    if (event := self._done.pop(op_id, None)) is not None:
                        event.set()
                case st.Reconcile(group=group, job=job):
                    task = self._spawn(self._reconcile(group, job))
                    self._background.add(task)
                    self._reconciling[(group, job)] = task
                case _:
                    raise TypeError(f"not an effect: {effect!r}")

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        task.add_done_callback(self._background.discard)
        return task

    async def _run(self, op_id: str) -> None:
        op = self.table.operations[op_id]
        job = self.table.jobs[(op.group, op.job)]
        ref = JobRef(job.group, job.job, job.config)
        left = op.deadline - time.time()
        try:
            backend = self._backend(op.backend)
            run = backend.snapshot if op.kind == st.SNAPSHOT else backend.restore
            moved = await asyncio.wait_for(run(ref, {**op.params, "timeout": left}), left)
            finish = st.Finish(time.time(), op_id, True, moved.storage_bytes, moved.device_bytes)
        except asyncio.CancelledError:
            return  # its deadline passed, or the agent is shutting down: already finished
        except TimeoutError:
            finish = st.Finish(time.time(), op_id, False, error=f"deadline exceeded ({left:.1f} s)")
        except TimeSliceError as exc:
            finish = st.Finish(time.time(), op_id, False, error=exc.message or type(exc).__name__)
        except Exception as exc:
            log.exception("%s %s failed", op.kind, op_id)
            finish = st.Finish(time.time(), op_id, False, error=f"{type(exc).__name__}: {exc}")
        finally:
            self._tasks.pop(op_id, None)
        if self._state != "closed":
            self._apply(finish)

    async def _reconcile(self, group: str, job_id: str) -> None:
        job = self.table.jobs.get((group, job_id))
        if job is None:
            return
        try:
            where = await self._backend(job.backend).state(JobRef(group, job_id, job.config))
            reason = "" if where else f"backend {job.backend} cannot tell where its context is"
        except Exception as exc:
            where, reason = None, f"backend {job.backend} failed to tell its state: {exc}"
        state = JobState(where) if where in ("RUNNING", "SAVED") else None
        if self._state == "serving":
            await self._apply(st.Reconciled(time.time(), group, job_id, state, reason))

    def _rearm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        at = self.table.next_deadline()
        if at is not None and self._state == "serving":
            delay = max(0.0, at - time.time())
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._apply(st.Tick(time.time()))

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

    def switch_lock(self, group: str) -> asyncio.Lock:
        """Held while a switch of `group` runs: switches of one group run one at a time."""
        return self._switch_locks.setdefault(group, asyncio.Lock())

    def liveness(self, job: Job) -> str:
        """What this node sees of the job's workload: "ALIVE" (its channel open, or
        one of its processes running), "GONE" (all of them ended), "" (nothing to
        watch: a job known only by a backend without processes, or a workload that
        has not come back since this agent started: it may be reconnecting)."""
        if job.backend == "app_channel":
            if self.channels.get(job.group, job.job) is not None:
                return "ALIVE"
            return "GONE" if job.key in self._connected else ""
        pids = [int(c.removeprefix("pid:")) for c in job.claims if c.startswith("pid:")]
        if not pids:
            return ""
        return "ALIVE" if any(pid_exists(pid) for pid in pids) else "GONE"

    async def check_token(self, group: str, token: int, proof: bytes = b"") -> None:
        """Refuse a fencing token that the orchestrator never issued for `group`.

        Taken, a token from the future would make every real command for the
        group stale, for good (the newest token seen is saved). So a token
        newer than any seen for the group is taken only with the orchestrator's
        `proof` (`timeslice.fencing`: what its switches carry), or once the
        orchestrator, asked, says it issued one at least as new. An agent
        without an orchestrator has nobody to ask, and takes tokens as sent (it
        listens on loopback unless told otherwise).
        """
        if token > MAX_FENCING_TOKEN:
            raise InvalidArgumentError(f"fencing token {token} is out of range")
        if not token or self._link is None or token <= self.table.tokens.get(group, 0):
            return
        if token <= self._issued_tokens.get(group, 0):
            return
        if proves(self._link.token_key, group, token, proof):
            self._issued_tokens[group] = token  # the orchestrator has issued it, then
            return
        issued = await self._link.issued_token(group)
        if issued:  # groups the orchestrator knows only: any caller may name others
            self._issued_tokens[group] = max(issued, self._issued_tokens.get(group, 0))
        if token > issued:
            raise ConflictError(
                f"fencing token {token} for group {group!r} was never issued: the"
                f" orchestrator's newest is {issued}"
            )

    async def start_operation(
        self,
        kind: str,
        group: str,
        job: str,
        *,
        backend: str | None = None,
        config: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        token: int = 0,
        timeout: float | None = None,
    ) -> str:
        """Start a snapshot or restore; return its operation id. The backend checks a
        new job's config and the operation's parameters first; the table decides the rest."""
        check_id("job_id", job)
        if group:
            check_id("group", group)
        await self.check_token(group, token)
        known = self.table.find(group, job)
        name = backend or (known.backend if known else None)
        claims: tuple[str, ...] = ()
        if name is not None:
            chosen = self._backend(name)
            ref = JobRef(group, job, known.config if known else (config or {}))
            if known is None and kind == st.SNAPSHOT:
                claims = await chosen.check(ref)
            await chosen.check_operation(ref, kind, params or {})
        event = st.Start(
            time.time(),
            kind,
            group,
            job,
            timeout or self.config.operation_timeout,
            token,
            backend,
            config,
            claims,
            params or {},
        )
        await self._apply(event)
        return self.table.job(group, job).operation

    async def ended(self, op_id: str, wait: float) -> None:
        """Return once operation `op_id` has ended in the job table (its end perhaps not
        saved yet: see `flush`), or after `wait` seconds."""
        op = self.table.operations.get(op_id)
        if op is not None and op.status is OpStatus.PENDING and wait > 0:
            event = self._ended.setdefault(op_id, asyncio.Event())
            # asyncio.timeout, not wait_for: no task in between, so that this caller
            # runs in the very turn of the loop the operation ends in.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await event.wait()

    async def flush(self) -> None:
        """Return once every change made so far is saved."""
        if self._waiting:  # changes not taken by a write yet: wait for the next one
            saved: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.append(saved)
            await saved
        elif self._writing is not None:  # the write under way has them all
            await asyncio.shield(self._writing)

    async def operation(self, op_id: str, wait: float = 0.0) -> Operation:
        """Operation `op_id`, once finished or after `wait` seconds, whichever first."""
        op = self.table.operations.get(op_id)
        if op is None:
            raise NotFoundError(f"unknown operation {op_id!r} (finished ones are kept "
                                f"{self.config.operation_retention:.0f} s)")  # fmt: skip
        if op.status is OpStatus.PENDING and wait > 0:
            event = self._done.setdefault(op_id, asyncio.Event())
            try:
                await asyncio.wait_for(event.wait(), wait)
            except TimeoutError:
                pass
        return op

    async def reset(self, group: str, job: str, wait: float = 5.0) -> JobState:
        """Clear a job's fault; return its state once its backend has told it."""
        await self._apply(st.Reset(time.time(), group, job))
        found = self.table.job(group, job)
        asking = self._reconciling.get(found.key)
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
        event = st.Register(time.time(), channel.group, channel.job, "app_channel", {}, (), state)
        self._backend("app_channel")
        saved = self._apply(event)  # raises at once if the table refuses it
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
            event = (st.Forget(now, channel.group, channel.job, reason) if deregistered
                     else st.Lost(now, channel.group, channel.job, reason))  # fmt: skip
            self._apply(event)
