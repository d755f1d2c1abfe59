"""A workload's side of the agent's `WorkloadChannel`: `WorkloadRegistration`
registers, then carries out the agent's snapshot and restore commands.

The registration keeps one stream open to the agent. It sends `register` first
(with the workload's capabilities and where its context is now), then answers
every command with a `CommandResult`, one command at a time. When the stream
breaks it connects again, with exponential backoff and jitter, and registers
again (the agent then replaces the old stream), saying SAVED if the workload's
context is out of the accelerators.

What the commands run is an adapter (see `timeslice.client.adapters`): blocking
callables run on a worker thread of the registration's own, one at a time;
coroutine functions run on the registration's event loop. `register_workload`
(in `timeslice.client.workload`) is how a programme makes one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Final

from grpclib.client import Channel, Stream
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from timeslice.api.bounds import MAX_TEXT_BYTES, cap
from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
from timeslice.api.status import from_grpc_error
from timeslice.backends import DISCARD, OFFLOAD
from timeslice.client._transport import close_channel, credentials, in_own_task, open_channel
from timeslice.client.adapters import (
    Capabilities,
    RestoreCallback,
    SnapshotCallback,
    WorkloadAdapter,
    resolve_adapter,
)
from timeslice.errors import (
    InvalidArgumentError,
    TimeSliceError,
    UnavailableError,
)
from timeslice.ids import parse_target
from timeslice.security.tls import ClientTls

log = logging.getLogger(__name__)

WORKLOAD_CHANNEL: Final = "/snapshot_agent.v1alpha1.SnapshotAgentService/WorkloadChannel"

FIRST_BACKOFF_SEC: Final = 0.05
MAX_BACKOFF_SEC: Final = 5.0
# A stream that stayed up this long was a good connection: the next retry starts
# from the first pause again.
STABLE_CONNECTION_SEC: Final = 5.0
DEFAULT_CONNECT_TIMEOUT_SEC: Final = 30.0
# How long close() waits for the agent to end its side of the stream.
CLOSE_GRACE_SEC: Final = 1.0

# Statuses that no retry can change: the registration ends with the error.
# ALREADY_EXISTS: a newer registration of the same job (the same user's) took
# this one's place; registering again would only take it back.
FATAL_STATUSES: Final = frozenset(
    {
        Status.INVALID_ARGUMENT,
        Status.UNIMPLEMENTED,
        Status.PERMISSION_DENIED,
        Status.UNAUTHENTICATED,
        Status.ALREADY_EXISTS,
    }
)

RUNNING: Final = "RUNNING"
SAVED: Final = "SAVED"

_WIRE_MODES: Final = {OFFLOAD: pb.SuspendMode.OFFLOAD, DISCARD: pb.SuspendMode.DISCARD}
_MODE_NAMES: Final = {wire: name for name, wire in _WIRE_MODES.items()}
_WIRE_STATES: Final = {RUNNING: pb.JobState.RUNNING, SAVED: pb.JobState.SAVED}


class Backoff:
    """Pauses between reconnections: from 50 ms doubling up to 5 s, each drawn
    between half and all of its step so that many workloads do not reconnect
    in step."""

    def __init__(
        self,
        first_sec: float = FIRST_BACKOFF_SEC,
        max_sec: float = MAX_BACKOFF_SEC,
        rng: random.Random | None = None,
    ) -> None:
        self._first = first_sec
        self._max = max_sec
        self._step = first_sec
        self._rng = rng or random.Random()

    def next(self) -> float:
        """The next pause, in seconds."""
        step, self._step = self._step, min(self._step * 2, self._max)
        return self._rng.uniform(step / 2, step)

    def reset(self) -> None:
        """Start again from the first pause."""
        self._step = self._first


class WorkloadRegistration:
    """One workload registered with an agent, kept registered until `close`.

    Made by `register_workload`, or directly and started with `start()` or
    `async with`. ``agent`` is the agent's address (``"host:port"``,
    ``"unix:/path"``) or a grpclib `Channel` (not closed by the registration;
    its credentials are the channel's own). See `register_workload` for the rest.
    """

    def __init__(
        self,
        agent: str | Channel,
        job_id: str,
        group: str = "",
        workload: object | None = None,
        on_snapshot: SnapshotCallback | None = None,
        on_restore: RestoreCallback | None = None,
        supported_modes: Iterable[str] | None = None,
        default_mode: str | None = None,
        tags: Iterable[str] | None = None,
        *,
        connect_timeout_sec: float | None = DEFAULT_CONNECT_TIMEOUT_SEC,
        tls: ClientTls | None = None,
        token: str | None = None,
        credentials_from_env: bool = True,
    ) -> None:
        if not isinstance(job_id, str) or not job_id:
            raise InvalidArgumentError("job_id must be a non-empty string")
        if not isinstance(group, str):
            raise InvalidArgumentError("group must be a string")
        if connect_timeout_sec is not None and not connect_timeout_sec >= 0:
            raise InvalidArgumentError(
                f"connect_timeout_sec must not be negative: {connect_timeout_sec}"
            )
        self._adapter: WorkloadAdapter = resolve_adapter(
            workload,
            on_snapshot,
            on_restore,
            supported_modes=supported_modes,
            default_mode=default_mode,
            tags=tags,
        )
        self._adapter.capabilities()  # refuse inconsistent capabilities now, not on the wire
        if isinstance(agent, str):
            self._target = parse_target(agent)
            self._tls, self._token = credentials(tls, token, credentials_from_env)
            self._channel: Channel | None = None
            self._owns_channel = True
        else:
            self._channel = agent
            self._owns_channel = False
        self.agent = agent if isinstance(agent, str) else "(channel)"
        self.job_id = job_id
        self.group = group
        self._connect_timeout_sec = connect_timeout_sec
        self._state = RUNNING  # as the last successful command left it
        self._executor: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None
        self._registered: asyncio.Future[None] | None = None
        self._connected = False
        self._registrations = 0
        self._commands = 0
        self._error: TimeSliceError | None = None
        self._last_failure = ""
        self._closed = False
        # The stream while it waits for a command (close() ends it), whether it
        # was ended, and the command being carried out.
        self._idle_stream: Stream[pb.WorkloadMessage, pb.AgentCommand] | None = None
        self._stream_ended = False
        self._command: asyncio.Future[pb.CommandResult] | None = None

    # --- what a caller can see ----------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether the registration's stream is open now."""
        return self._connected

    @property
    def registrations(self) -> int:
        """How many times the workload has registered (1 + reconnections)."""
        return self._registrations

    @property
    def commands(self) -> int:
        """How many commands the workload has carried out (successfully or not)."""
        return self._commands

    @property
    def state(self) -> str:
        """Where the workload's context is, as it would register now: RUNNING or SAVED."""
        return self._current_state()

    @property
    def error(self) -> TimeSliceError | None:
        """What ended the registration, when an error did (the agent refused it)."""
        return self._error

    @property
    def closed(self) -> bool:
        """Whether `close` was called or the registration ended on its own."""
        return self._closed or (self._task is not None and self._task.done())

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> WorkloadRegistration:
        """Opens the stream and registers; returns once registered.

        Keeps trying while the agent cannot be reached, for at most
        ``connect_timeout_sec`` (then `UnavailableError`; None: return at once
        and connect in the background). Raises at once what no retry can change.
        """
        if self._task is not None:
            return self
        if self._closed:
            raise RuntimeError("the registration is closed")
        loop = asyncio.get_running_loop()
        if self._channel is None:
            self._channel = open_channel(self._target, self._tls, self._token)
        self._executor = ThreadPoolExecutor(
            1, thread_name_prefix=f"timeslice-workload-{self.job_id}"
        )
        self._registered = loop.create_future()
        self._task = asyncio.create_task(self._serve(), name=f"timeslice-workload-{self.job_id}")
        if self._connect_timeout_sec is None:
            return self
        try:
            async with asyncio.timeout(self._connect_timeout_sec):
                await asyncio.wait(
                    [self._registered, self._task], return_when=asyncio.FIRST_COMPLETED
                )
        except TimeoutError:
            pass
        except BaseException:
            await self.close()
            raise
        if self._registered.done():
            return self
        error = self._error
        await self.close()
        if error is not None:
            raise error
        raise UnavailableError(
            f"could not register job {self.job_id!r} with the agent at {self.agent}"
            f" within {self._connect_timeout_sec:g} s: {self._last_failure or 'no answer'}"
        )

    async def close(self) -> None:
        """Ends the stream and stops reconnecting. A command in progress is finished
        and answered first. Idempotent."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None and not task.done():
            await self._end_session(task)
        self._connected = False
        if self._owns_channel and self._channel is not None:
            close_channel(self._channel)
            self._channel = None
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    async def _end_session(self, task: asyncio.Task[None]) -> None:
        # End our side of the stream, so that the agent sees the workload leave
        # rather than a reset; a command in progress ends it once answered.
        idle, self._idle_stream = self._idle_stream, None
        ending = idle is not None or self._command is not None
        if idle is not None:
            self._stream_ended = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(idle.end(), CLOSE_GRACE_SEC)
        if self._command is not None:
            await asyncio.wait([self._command])
        if ending:
            await asyncio.wait([task], timeout=CLOSE_GRACE_SEC)
        task.cancel()
        await asyncio.wait([task])

    async def wait_closed(self) -> None:
        """Returns when the registration ends; raises the error that ended it, if any."""
        task = self._task
        if task is not None:
            await asyncio.wait([task])
        if self._error is not None:
            raise self._error

    async def __aenter__(self) -> WorkloadRegistration:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        status = "closed" if self.closed else "connected" if self._connected else "connecting"
        return (
            f"<WorkloadRegistration job={self.job_id!r} group={self.group!r}"
            f" {self._adapter.kind} {status} {self.state}>"
        )

    # --- the stream ---------------------------------------------------------------------

    async def _serve(self) -> None:
        """Keeps the workload registered, reconnecting until closed or refused."""
        loop = asyncio.get_running_loop()
        backoff = Backoff()
        while True:
            began = loop.time()
            try:
                # In a task of its own: grpclib's cancellations when the
                # connection drops stay with it (see `in_own_task`).
                await in_own_task(self._session())
                self._last_failure = "the agent ended the stream"
            except asyncio.CancelledError:
                raise
            except GRPCError as exc:
                if exc.status in FATAL_STATUSES:
                    self._error = from_grpc_error(exc)
                    log.error(
                        "job %s: the agent at %s refused the workload: %s",
                        self.job_id,
                        self.agent,
                        self._error.message,
                    )
                    return
                self._last_failure = f"{exc.status.name}: {exc.message}"
            except (OSError, StreamTerminatedError, ProtocolError) as exc:
                self._last_failure = str(exc) or type(exc).__name__
            except Exception as exc:
                # Not a connection failure: say what it was, and keep trying.
                log.warning("job %s: workload channel failed", self.job_id, exc_info=exc)
                self._last_failure = f"{type(exc).__name__}: {exc}"
            finally:
                self._connected = False
            if self._closed:
                return
            if loop.time() - began >= STABLE_CONNECTION_SEC:
                backoff.reset()
            pause = backoff.next()
            log.info(
                "job %s: workload channel to %s down (%s); again in %.2f s",
                self.job_id,
                self.agent,
                self._last_failure,
                pause,
            )
            await asyncio.sleep(pause)

    async def _session(self) -> None:
        """One stream: register, then answer commands until the stream ends."""
        assert self._channel is not None
        self._stream_ended = False
        async with self._channel.request(
            WORKLOAD_CHANNEL, Cardinality.STREAM_STREAM, pb.WorkloadMessage, pb.AgentCommand
        ) as stream:
            await stream.send_request()
            await stream.send_message(pb.WorkloadMessage(register=self._register_message()))
            self._connected = True
            self._registrations += 1
            if self._registered is not None and not self._registered.done():
                self._registered.set_result(None)
            log.debug("job %s: registered with %s as %s", self.job_id, self.agent, self.state)
            while not self._closed:
                self._idle_stream = stream
                try:
                    command = await stream.recv_message()
                finally:
                    self._idle_stream = None
                if command is None:
                    break
                result = await self._carry_out_shielded(stream, command)
                await stream.send_message(pb.WorkloadMessage(result=result))
            if not self._stream_ended:
                await stream.end()

    async def _carry_out_shielded(
        self, stream: Stream[pb.WorkloadMessage, pb.AgentCommand], command: pb.AgentCommand
    ) -> pb.CommandResult:
        running = self._command = asyncio.ensure_future(self._carry_out(command))
        running.add_done_callback(self._command_done)
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            # Cancelled from outside: finish the command all the same, so that the
            # workload is not left half moved, and tell the agent how it went.
            result = await running
            with contextlib.suppress(Exception):
                await stream.send_message(pb.WorkloadMessage(result=result))
            raise

    def _command_done(self, command: asyncio.Future[pb.CommandResult]) -> None:
        if self._command is command:
            self._command = None

    def _register_message(self) -> pb.RegisterWorkload:
        capabilities = self._adapter.capabilities()
        return pb.RegisterWorkload(
            job_id=self.job_id,
            group=self.group,
            capabilities=_wire_capabilities(capabilities),
            state=_WIRE_STATES[self._current_state()],
        )

    def _current_state(self) -> str:
        try:
            declared = self._adapter.state()
        except Exception:
            log.exception("job %s: the workload could not say where its context is", self.job_id)
            declared = None
        return declared or self._state

    async def _carry_out(self, command: pb.AgentCommand) -> pb.CommandResult:
        """Runs one command through the adapter; never raises."""
        assert self._executor is not None
        self._commands += 1
        what = "snapshot" if command.snapshot is not None else "restore"
        try:
            if command.snapshot is not None:
                mode = self._mode(command.snapshot.mode)
                tags = list(command.snapshot.tags)
                moved = await self._adapter.run_snapshot(mode, tags, self._executor)
                self._state = SAVED
            elif command.restore is not None:
                tags = list(command.restore.tags)
                moved = await self._adapter.run_restore(tags, self._executor)
                self._state = RUNNING
            else:
                raise InvalidArgumentError("the command is neither a snapshot nor a restore")
        except Exception as exc:
            log.warning(
                "job %s: %s %s failed: %s", self.job_id, what, command.command_id, exc, exc_info=exc
            )
            # The agent refuses a longer error than MAX_TEXT_BYTES.
            error = cap(f"{type(exc).__name__}: {exc}", MAX_TEXT_BYTES)
            return pb.CommandResult(command_id=command.command_id, ok=False, error=error)
        log.debug("job %s: %s %s done: %s", self.job_id, what, command.command_id, moved)
        return pb.CommandResult(
            command_id=command.command_id,
            ok=True,
            storage_bytes=moved.storage_bytes,
            device_bytes=moved.device_bytes,
        )

    def _mode(self, wire: pb.SuspendMode) -> str:
        capabilities = self._adapter.capabilities()
        if wire == pb.SuspendMode.UNSPECIFIED:
            return capabilities.default_mode or OFFLOAD
        mode = _MODE_NAMES.get(wire)
        if mode is None:
            raise InvalidArgumentError(f"unknown suspend mode {int(wire)}")
        if capabilities.supported_modes and mode not in capabilities.supported_modes:
            raise InvalidArgumentError(
                f"the workload does not support mode {mode!r}; it registered"
                f" {list(capabilities.supported_modes)}"
            )
        return mode


def _wire_capabilities(capabilities: Capabilities) -> pb.WorkloadCapabilities:
    return pb.WorkloadCapabilities(
        supported_modes=[_WIRE_MODES[m] for m in capabilities.supported_modes],
        default_mode=(
            _WIRE_MODES[capabilities.default_mode]
            if capabilities.default_mode is not None
            else pb.SuspendMode.UNSPECIFIED
        ),
        tags=list(capabilities.tags),
        store=capabilities.store,
        pipelined=capabilities.pipelined,
    )
