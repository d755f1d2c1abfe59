"""The Orchestrator: the lock table behind a gRPC server, with its journal.

Every change goes the same way: the event is handled by the pure `LockTable`
(which refuses it, or changes and answers with effects), appended to the
journal, and only once the journal write is durable are its effects acted on:
a waiting `Acquire` answered, watchers told. Appends are batched: while one
batch is being written, new events gather for the next, so a busy orchestrator
pays one durable write for many decisions and an idle one pays no wait.

Time-driven decisions (a lease running out, a wait limit) come from one timer,
set for the table's next deadline: nothing polls.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import math
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar


from timeslice.api.connections import connection_limits
from timeslice.api.serving import CallGate, GrpcServer, until_set
from timeslice.errors import (
    CancelledError,
    ConflictError,
    DeadlineExceededError,
    InvalidArgumentError,
    JournalClaimLostError,
    NotFoundError,
    TimeSliceError,
    UnavailableError,
)
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.events import Effect, Event
from timeslice.client._transport import parse_target
from timeslice.orchestrator.agents import AgentDirectory
from timeslice.orchestrator.handoff import HandoffDriver
from timeslice.orchestrator.journal import DEFAULT_RETENTION, Journal, open_journal
from timeslice.fencing import KEY_BYTES
from timeslice.orchestrator.model import TableLimits
from timeslice.orchestrator.state import Group, LockTable, check_id, check_node
from timeslice.orchestrator.watches import Notice as Notice  # for watchers to import here
from timeslice.orchestrator.watches import Render, WatchHub
from timeslice.orchestrator.watches import Watch as Watch  # for watchers to import here

log = logging.getLogger(__name__)

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

    # Groups the orchestrator knows at most (each stays known: its fencing token
    # must only grow), and jobs waiting for one group at most.
    max_groups: int = 10_000
    max_waiters_per_group: int = 10_000

    def table_limits(self) -> TableLimits:
        """What the lock table admits."""
        return TableLimits(
            max_groups=self.max_groups, max_waiters_per_group=self.max_waiters_per_group
        )

    def __post_init__(self) -> None:
        self.table_limits()  # checks them
        if not 0 <= self.port <= 65535:
            raise InvalidArgumentError(f"port {self.port} is out of range")
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
            if name not in ev.POLICIES:
                raise InvalidArgumentError(
                    f"unknown policy {name!r}; expected one of {', '.join(ev.POLICIES)}"
                )
        if not self.priority_aging > 0:
            raise InvalidArgumentError("priority_aging must be positive")
        for group, nodes in self.group_nodes.items():
            check_id("group_id", group)
            for node in nodes:
                check_node(node)
        if not self.switch_timeout > 0:
            raise InvalidArgumentError("switch_timeout must be positive")
        if not self.revoked_snapshot_timeout > 0:
            raise InvalidArgumentError("revoked_snapshot_timeout must be positive")


class Orchestrator:
    """Grants each group's accelerators to one job at a time, durably.

    `async with Orchestrator(db="sqlite:///journal.db") as orch:` serves on
    `orch.address` until the block ends. Port 0 (the default) picks a free port.
    """

    def __init__(self, config: OrchestratorConfig | None = None, **options: Any) -> None:
        if config is not None and options:
            raise TypeError("pass either a config or options, not both")
        self.config = config or OrchestratorConfig(**options)
        self.table = LockTable()
        self._journal: Journal | None = None
        self._server: GrpcServer | None = None
        self._address: str | None = None
        self._state = "new"  # new -> serving -> closed
        self._pending: list[tuple[Event, list[Effect], asyncio.Future[list[Effect]]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._since_snapshot = 0
        self._calls: dict[str, _Call] = {}
        self._call_ids = itertools.count(1)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self.watches = WatchHub(self.config.max_watchers, self.config.watch_backlog)
        self.gate = CallGate(
            "the orchestrator", self.config.max_message_bytes, self.config.message_timeout
        )
        self.agents = AgentDirectory()
        self.handoff = HandoffDriver(
            self, self.config.switch_timeout, self.config.revoked_snapshot_timeout
        )
        self._closing = asyncio.Event()
        self._stopped = asyncio.Event()
        self._closer: asyncio.Task[None] | None = None
        #: Why the orchestrator stopped on its own (a journal write failed), if it did.
        self.failure: BaseException | None = None

    # --- lifecycle --------------------------------------------------------------------

    @property
    def address(self) -> str:
        """ "HOST:PORT" the server listens on (known once started)."""
        if self._address is None:
            raise RuntimeError("the orchestrator is not started")
        return self._address

    async def start(self) -> None:
        """Open the journal, rebuild the table, and start serving. Idempotent; cleans
        up after itself if it fails half way."""
        if self._state != "new":
            return
        try:
            self._journal = open_journal(
                self.config.db,
                retention=self.config.journal_retention,
                on_claim_lost=self._claim_lost,
            )
            await self._journal.open()
            await self._restore(self._journal)
            await self._begin_epoch()
            await self._listen()
            if self.failure is not None:  # the journal's claim was lost meanwhile
                raise self.failure
        except BaseException:
            # The cleanup must not replace the error that made the start fail.
            try:
                await self._shutdown()
            except Exception:
                log.exception("cleaning up after a failed start failed")
            raise
        self._state = "serving"
        self.gate.open = True

    async def close(self) -> None:
        """Stop serving: refuse new calls, let those in flight finish (blocked
        Acquires are told to retry: their places in the queues are kept), flush the
        journal, then stop listening. Idempotent."""
        if self._state == "closed":
            return
        self._state = "closed"
        self._closing.set()
        for call in self._calls.values():
            if not call.future.done():
                call.future.set_exception(
                    UnavailableError("the orchestrator is shutting down; retry")
                )
        self._end_watches()
        await self.gate.close(self.config.drain_timeout)
        await self._shutdown()

    async def _shutdown(self) -> None:
        self._state = "closed"
        self._closing.set()
        await self.handoff.close()
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)
        self._end_watches()
        if self._timer is not None:
            self._timer.cancel()
        if self._server is not None:
            await self._server.stop()
        await self.agents.close()
        if self._journal is not None:
            await self._journal.close()
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

    async def _restore(self, journal: Journal) -> None:
        loaded = await journal.load()
        table = LockTable.from_dict(loaded.snapshot) if loaded.snapshot else LockTable()
        for seq, event in loaded.tail:
            try:
                table.handle(event)
            except TimeSliceError as exc:
                raise RuntimeError(f"journal event {seq} does not replay: {exc}") from exc
        table.limits = self.config.table_limits()
        self.table = table
        if len(loaded.tail) >= self.config.snapshot_every:
            await journal.save_snapshot(loaded.last_seq, table.to_dict())
        log.info(
            "journal: snapshot at %d, %d event(s) replayed, %d group(s)",
            loaded.snapshot_seq,
            len(loaded.tail),
            len(table.groups),
        )

    async def _begin_epoch(self) -> None:
        now = time.time()
        wanted = {"": self.config.hold_limit, **self.config.hold_limits}
        grace = self.config.hold_grace
        for group, limit in wanted.items():
            if (self.table.hold_limits.get(group), self.table.hold_graces.get(group)) != (
                limit,
                grace,
            ):
                self.apply(ev.SetHoldLimit(now, group, limit, grace))
        policies = {"": self.config.policy, **self.config.policies}
        for group, policy in policies.items():
            if self.table.policies.get(group) != (policy, self.config.priority_aging):
                self.apply(ev.SetPolicy(now, group, policy, self.config.priority_aging))
        for group, configured in self.config.group_nodes.items():
            known = self.table.nodes.get(group, ())
            if missing := [node for node in configured if node not in known]:
                self.apply(ev.SetGroupNodes(now, group, (*known, *missing)))
        await self.apply(ev.Recover(now, self.config.recovery_grace))
        # Switches the journal says were under way: the agents know how far each
        # got; running it again finishes it.
        for g in self.table.groups.values():
            if g.holder is not None and g.holder.switching:
                self.handoff.start(ev.SwitchStarted(g.name, g.holder.job, g.holder.token, ""))

    async def _listen(self) -> None:
        from timeslice.orchestrator.service import OrchestratorService

        self._server = GrpcServer(
            [OrchestratorService(self)], connection_limits(self.config), "the orchestrator"
        )
        self._address = await self._server.serve(self.config.host, self.config.port)

    # --- the engine: handle, journal, act ---------------------------------------------

    def apply(self, event: Event) -> asyncio.Future[list[Effect]]:
        """Handle `event` now; the future resolves once it is durable and acted on.
        Raises (leaving everything unchanged) if the table refuses the event."""
        if self.failure is not None:
            raise UnavailableError(f"the orchestrator stopped: {self.failure}")
        effects = self.table.handle(event)
        done: asyncio.Future[list[Effect]] = asyncio.get_running_loop().create_future()
        if isinstance(event, ev.KeepAlive) or (
            isinstance(event, ev.DropWaiter | ev.Revoke | ev.RequestYield | ev.SwitchDone)
            and not effects
        ):
            self._act(effects)
            done.set_result(effects)
        else:
            self._pending.append((event, effects, done))
            if self._flusher is None:
                self._flusher = asyncio.get_running_loop().create_task(self._flush())
        self._rearm()
        return done

    async def _flush(self) -> None:
        assert self._journal is not None
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    seq = await self._journal.append([event for event, _, _ in batch])
                except Exception as exc:
                    self._journal_failed(batch, exc)
                    return
                if self.failure is not None:  # the journal's claim was lost meanwhile
                    self._journal_failed(batch, self.failure)
                    return
                for _, effects, done in batch:
                    self._act(effects)
                    if not done.done():
                        done.set_result(effects)
                self._since_snapshot += len(batch)
                if self._since_snapshot >= self.config.snapshot_every and not self._pending:
                    self._since_snapshot = 0
                    state = self.table.to_dict()  # nothing newer than `seq` is handled yet
                    try:
                        await self._journal.save_snapshot(seq, state)
                    except Exception:
                        log.exception("could not write a journal snapshot")
        finally:
            self._flusher = None

    def _journal_failed(
        self, batch: list[Any], exc: BaseException, what: str = "journal write failed"
    ) -> None:
        """A decision could not be made durable, and the table is already ahead of
        the journal: stop (fail-stop), failing everything in the air. Clients
        retry with their request ids against the next start, which rebuilds the
        table from what the journal holds."""
        if self.failure is None:
            log.error("%s, the orchestrator stops: %s", what, exc)
            self.failure = exc
        pending, self._pending = [*batch, *self._pending], []
        error = UnavailableError(f"{what}: {exc}")
        for _, _, done in pending:
            if not done.done():
                done.set_exception(error)
        for call in self._calls.values():
            if not call.future.done():
                call.future.set_exception(error)
        if self._closer is None:
            self._closer = asyncio.get_running_loop().create_task(self.close())

    def _claim_lost(self, error: JournalClaimLostError) -> None:
        """Another orchestrator may write the journal now: stop granting at once, as
        after a failed write. During a start, the start fails instead."""
        if self._state == "new":
            self.failure = error
        else:
            self._journal_failed([], error, "the journal's claim was lost")

    def _act(self, effects: list[Effect]) -> None:
        """Carry out effects whose event is durable."""
        for effect in effects:
            match effect:
                case ev.Granted():
                    call = self._calls.get(effect.call_id)
                    if call is not None:
                        call.granted(effect)
                    elif effect.call_id and effect.must_deliver:
                        # The call that asked is gone: roll the grant back.
                        revoke = ev.Revoke(
                            time.time(),
                            effect.group,
                            effect.token,
                            ev.REASON_NOT_DELIVERED,
                            effect.call_id,
                        )
                        self.apply(revoke)
                    self._check_holder(effect.group)
                case ev.LeftQueue():
                    error: TimeSliceError
                    if effect.reason == ev.REASON_WAIT_TIMEOUT:
                        error = DeadlineExceededError(f"not granted {effect.group} in time")
                    elif effect.reason.startswith(ev.REASON_QUARANTINED):
                        error = ConflictError(f"job {effect.job} is {effect.reason}")
                    else:
                        error = CancelledError(f"left the queue of {effect.group}: {effect.reason}")
                    self._fail_call(effect.call_id, error)
                case ev.Revoked(call_id=call_id) if call_id:
                    # A grant whose switch failed: its Acquire is still waiting.
                    self._fail_call(call_id, ConflictError(f"{effect.group}: {effect.reason}"))
                case ev.SwitchStarted():
                    self.handoff.start(effect)
                case ev.Superseded():
                    self._fail_call(
                        effect.call_id,
                        ConflictError(
                            f"a newer Acquire of {effect.job} on {effect.group} took this one's place"
                        ),
                    )
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

    def _fail_call(self, call_id: str, error: TimeSliceError) -> None:
        call = self._calls.get(call_id)
        if call is not None and not call.future.done():
            call.future.set_exception(error)

    def _rearm(self) -> None:
        at = self.table.next_deadline()
        if at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, at
        if at is not None and self._state != "closed":
            delay = max(0.0, at - time.time())
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = self._timer_at = None
        if self.failure is not None:
            return
        now = time.time()
        while (event := self.table.due(now)) is not None:
            self.apply(event)
        self._rearm()

    def _end_watches(self) -> None:
        self.watches.close()

    # --- agents and the switch ----------------------------------------------------------

    def agent_reported(
        self,
        session: object,
        node: str,
        address: str,
        groups: list[str],
        liveness: dict[tuple[str, str], str],
        accelerators: dict[str, int] | None = None,
        token_key: bytes = b"",
    ) -> None:
        """An agent in session reported: register it (journaled when new), join the
        groups it names, and revoke holders whose every workload is gone.
        `token_key`: what the switches sent to it prove their tokens with."""
        check_node(node)
        parse_target(address)
        if token_key and len(token_key) != KEY_BYTES:
            raise InvalidArgumentError(f"a token key has {KEY_BYTES} bytes")
        now = time.time()
        if self.table.agents.get(node) != address:
            self.apply(ev.RegisterAgent(now, node, address))
        for group in groups:
            known = self.table.nodes.get(group, ())
            if node not in known:
                self.apply(ev.SetGroupNodes(now, group, (*known, node)))
        self.agents.reported(session, node, address, liveness, accelerators or {}, token_key)
        for group, nodes in self.table.nodes.items():
            if node in nodes or address in nodes:
                self._check_holder(group)

    def agent_left(self, session: object, node: str) -> None:
        """An agent's session ended."""
        self.agents.left(session, node)

    def _check_holder(self, group: str) -> None:
        """Revoke the holder of `group` when the agents saw its workload, and every one
        of them now says it is gone. A holder nobody sees (a job without a
        registered workload) is never revoked this way."""
        g = self.table.groups.get(group)
        h = g.holder if g is not None else None
        if h is None or h.switching or self._state != "serving":
            return
        seen = {
            self.agents.liveness(node, group, h.job) for node in self.table.nodes.get(group, ())
        }
        if "GONE" in seen and "ALIVE" not in seen:
            log.info("%s: the workload of holder %s is gone; revoking", group, h.job)
            self.apply(ev.Revoke(time.time(), group, h.token, ev.REASON_HOLDER_GONE))

    def group_agents(self, group: str) -> list[tuple[str, str | None]]:
        """(node, address or None) for every node of `group`."""
        nodes = self.table.nodes.get(group, ())
        return [(node, self.agents.address(node, self.table.agents)) for node in nodes]

    async def until_closed(self, items: AsyncIterator[_T]) -> AsyncIterator[_T]:
        """`items`, until they end or the orchestrator starts closing."""
        async for item in until_set(items, self._closing):
            yield item

    # --- what the service calls -------------------------------------------------------

    async def set_group_nodes(self, group: str, nodes: tuple[str, ...]) -> None:
        """Name the nodes `group` spans (empty: none)."""
        await self.apply(ev.SetGroupNodes(time.time(), group, nodes))

    async def register_job(
        self, group: str, job: str, node: str, backend: dict[str, Any] | None
    ) -> None:
        """Record the backend `job`'s contexts need on `group` (on `node` only, when set)."""
        await self.apply(ev.SetJobBackend(time.time(), group, job, node, backend))

    async def reset_job(self, group: str, job: str) -> bool:
        """Lift `job`'s quarantine on `group`, and clear its fault on the group's agents.
        True if the orchestrator had it quarantined."""
        effects = await self.apply(ev.ResetJob(time.time(), group, job))
        await self.agents.reset(group, job, [a for _, a in self.group_agents(group) if a])
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
            [group], job, request_id=request_id, lease_ttl=lease_ttl,
            wait_timeout=wait_timeout, priority=priority,
        )  # fmt: skip
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
    ) -> list[ev.Granted]:
        """Wait until `job` holds every one of `groups`, granted all at once; return
        the grants in the order of `groups`."""
        if wait_timeout is not None and wait_timeout < 0:
            raise InvalidArgumentError("wait timeout must not be negative")
        if not groups:
            raise InvalidArgumentError("name at least one group")
        now = time.time()
        call = _Call(
            f"{self.table.epoch}.{next(self._call_ids)}", job, tuple(dict.fromkeys(groups))
        )
        self._calls[call.call_id] = call
        deadline = now + wait_timeout if wait_timeout is not None else None
        first, *more = call.groups
        event = ev.Acquire(now, first, job, call.call_id, request_id, lease_ttl, deadline,
                           priority, tuple(more))  # fmt: skip
        try:
            await asyncio.shield(self.apply(event))
            return await call.future
        except asyncio.CancelledError:
            self._abandon(call)
            raise
        except TimeSliceError:
            if len(call.groups) > 1:
                self._abandon(call)  # what was granted of it goes back
            raise
        finally:
            self._calls.pop(call.call_id, None)

    def _abandon(self, call: _Call) -> None:
        """The caller went away (or a bundle failed part way): take it out of the
        queues, and roll back what it was granted."""
        self._calls.pop(call.call_id, None)
        if call.future.done() and not call.future.cancelled():
            call.future.exception()  # nobody will read it now (a shutdown's, say)
        if self._state == "closed" or self.failure is not None:
            return  # its place is kept: the client retries against the next start
        now = time.time()
        for group in call.groups:
            grant = call.grants.get(group)
            g = self.table.groups.get(group)
            h = g.holder if g is not None else None
            if grant is not None:
                if grant.must_deliver:
                    revoke = ev.Revoke(
                        now, group, grant.token, ev.REASON_NOT_DELIVERED, call.call_id
                    )
                    self.apply(revoke)
            elif h is not None and h.call_id == call.call_id and h.switching:
                self.apply(ev.Revoke(now, group, h.token, ev.REASON_NOT_DELIVERED, call.call_id))
            else:
                self.apply(ev.DropWaiter(now, group, call.job, call.call_id, ev.REASON_CANCELLED))

    async def yield_(
        self, group: str, job: str, *, request_id: str = "", token: int | None = None
    ) -> ev.Yielded:
        """Release `group`, held by `job`."""
        effects = await self.apply(ev.Yield(time.time(), group, job, request_id, token))
        return _first(effects, ev.Yielded)

    async def keep_alive(self, group: str, job: str, lease_id: str) -> ev.LeaseRenewed:
        """Renew the holder's lease."""
        effects = await self.apply(ev.KeepAlive(time.time(), group, job, lease_id))
        return _first(effects, ev.LeaseRenewed)

    async def force_release(self, group: str, job: str = "", reason: str = "") -> list[Effect]:
        """Take `group` away from its holder (operator action)."""
        return await self.apply(ev.ForceRelease(time.time(), group, job, reason))

    def group(self, name: str) -> Group:
        """The group named `name`, read-only. A group with nodes that nobody has asked
        for yet is known too (idle)."""
        group = self.table.groups.get(name)
        if group is None and name in self.table.nodes:
            return Group(name, state_since=0.0)
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


class _Call:
    """One waiting Acquire: the groups it asks for, and the grants it has so far."""

    def __init__(self, call_id: str, job: str, groups: tuple[str, ...]) -> None:
        self.call_id, self.job, self.groups = call_id, job, groups
        self.grants: dict[str, ev.Granted] = {}
        self.future: asyncio.Future[list[ev.Granted]] = asyncio.get_running_loop().create_future()

    def granted(self, grant: ev.Granted) -> None:
        self.grants[grant.group] = grant
        if len(self.grants) == len(self.groups) and not self.future.done():
            self.future.set_result([self.grants[g] for g in self.groups])


def tune_gc_for_serving() -> None:
    """Set this process's garbage collector for serving an orchestrator: collect the
    youngest objects every 50,000 allocations instead of every 700.

    Every waiting Acquire keeps some eighty objects alive (its stream, its futures,
    its place in the table) for as long as it waits, and every collection of the
    oldest generation walks them all: with thousands of jobs queued, the default
    thresholds spend a third of the orchestrator's time there. What an Acquire or
    a Yield allocates is freed by reference counting, not by the collector, so
    collecting rarely loses nothing. `timeslice serve orchestrator` calls this; a
    program that embeds an Orchestrator decides for itself.
    """
    gc.set_threshold(50_000, 20, 10)


_T = TypeVar("_T")


def _first(effects: list[Effect], kind: type[_T]) -> _T:
    for effect in effects:
        if isinstance(effect, kind):
            return effect
    raise TypeError(f"no {kind.__name__} among {effects!r}")
