"""Registering a workload that does its own offload with its node's agent.

    registration = await register_workload("127.0.0.1:50052", "job-a", workload=engine)
    ...
    await registration.close()

or, in a programme without an event loop, as with the v1alpha1 client:

    handle = register_workload("127.0.0.1:50052", "job-a", workload=engine)
    ...
    handle.close()

`register_workload` is a plain function that returns a `WorkloadHandle`. Called
where an event loop runs, the registration starts at once as a task of that
loop, and awaiting the handle waits until it is registered and gives the
`WorkloadRegistration` (`timeslice.client.registration`). Called where none
runs, the registration is served by a thread of its own and the handle is
returned once registered. Either way it registers: a handle that nobody awaits
is still a registration, closed by `handle.close()`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Generator, Iterable
from types import TracebackType
from typing import Any

from grpclib.client import Channel

from timeslice.client._bridge import LoopThread
from timeslice.client.adapters import RestoreCallback, SnapshotCallback
from timeslice.client.registration import (
    CLOSE_GRACE_SEC,
    DEFAULT_CONNECT_TIMEOUT_SEC,
    FATAL_STATUSES,
    FIRST_BACKOFF_SEC,
    MAX_BACKOFF_SEC,
    RUNNING,
    SAVED,
    STABLE_CONNECTION_SEC,
    WORKLOAD_CHANNEL,
    Backoff,
    WorkloadRegistration,
)
from timeslice.errors import TimeSliceError
from timeslice.security.tls import ClientTls

__all__ = [
    "CLOSE_GRACE_SEC",
    "DEFAULT_CONNECT_TIMEOUT_SEC",
    "FATAL_STATUSES",
    "FIRST_BACKOFF_SEC",
    "MAX_BACKOFF_SEC",
    "RUNNING",
    "SAVED",
    "STABLE_CONNECTION_SEC",
    "WORKLOAD_CHANNEL",
    "Backoff",
    "WorkloadHandle",
    "WorkloadRegistration",
    "register_workload",
    "register_workload_in_thread",
]

log = logging.getLogger(__name__)

# How long `close()` waits by default for a registration served from elsewhere.
CLOSE_TIMEOUT_SEC = 5.0

# The handles served on a caller's event loop and not closed yet: asyncio keeps
# only weak references to tasks, and a v1alpha1 programme may drop its handle.
_OPEN_ON_LOOPS: set[WorkloadHandle] = set()


class WorkloadHandle(Coroutine[Any, Any, WorkloadRegistration]):
    """One workload registration, as `register_workload` returns it.

    On an event loop (``loop`` given) the registration starts at once as a task
    of that loop; ``await handle`` waits until it is registered and returns the
    `WorkloadRegistration` (the handle is a coroutine, so `asyncio.create_task`
    and `asyncio.wait_for` take it too). Without one, it is served by a daemon
    thread with an event loop of its own, and the constructor returns once it is
    registered; coroutine callbacks then run on that thread's loop, so they must
    not belong to another loop.

    `close()` ends the registration, from any thread, in both cases.
    """

    def __init__(
        self,
        registration: WorkloadRegistration,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self._registration = registration
        self._closed = False
        self._awaited = False
        self._waiting: Coroutine[Any, Any, WorkloadRegistration] | None = None
        self._loop = loop
        self._runner: LoopThread | None = None
        self._starting: asyncio.Task[WorkloadRegistration] | None = None
        if loop is not None:
            self._starting = loop.create_task(
                registration.start(), name=f"timeslice-register-{registration.job_id}"
            )
            self._starting.add_done_callback(self._started)
            _OPEN_ON_LOOPS.add(self)
            return
        self._runner = LoopThread(f"timeslice-workload-{registration.job_id}")
        try:
            self._runner.run(registration.start)
        except BaseException:
            self._runner.stop()
            self._runner.join()
            raise

    @property
    def registration(self) -> WorkloadRegistration:
        """The registration itself (its properties are safe to read from any thread)."""
        return self._registration

    @property
    def connected(self) -> bool:
        """Whether the registration's stream is open now."""
        return self._registration.connected

    @property
    def state(self) -> str:
        """Where the workload's context is, as it would register now."""
        return self._registration.state

    @property
    def error(self) -> TimeSliceError | None:
        """What ended the registration, when an error did."""
        return self._registration.error

    @property
    def closed(self) -> bool:
        """Whether `close` was called or the registration ended on its own."""
        return self._closed or self._registration.closed

    # --- awaiting: a coroutine that waits until registered --------------------------------

    def __await__(self) -> Generator[Any, None, WorkloadRegistration]:
        return self._wait_registered().__await__()

    def send(self, value: Any) -> Any:
        """The coroutine protocol (what a task drives), passed to the wait for registration."""
        return self._wait_registered().send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None, /) -> Any:
        """The coroutine protocol, passed to the wait for registration."""
        waiting = self._wait_registered()
        if val is None and tb is None:
            return waiting.throw(typ)
        return waiting.throw(typ, val, tb)

    def _wait_registered(self) -> Coroutine[Any, Any, WorkloadRegistration]:
        if self._waiting is None:
            self._awaited = True
            self._waiting = self._registered()
        return self._waiting

    async def _registered(self) -> WorkloadRegistration:
        if self._starting is None:
            raise RuntimeError(
                "this registration is served by a thread of its own (register_workload was"
                " called where no event loop ran): use the handle without await"
            )
        return await self._starting

    def _started(self, starting: asyncio.Task[WorkloadRegistration]) -> None:
        if starting.cancelled():
            _OPEN_ON_LOOPS.discard(self)
            return
        error = starting.exception()
        if error is None:
            return
        _OPEN_ON_LOOPS.discard(self)
        if not self._awaited and not self._closed:
            # Nobody awaits the handle to be told: say it here, loudly.
            log.error(
                "job %s: the workload was not registered with the agent at %s: %s",
                self._registration.job_id,
                self._registration.agent,
                error,
            )

    # --- closing ----------------------------------------------------------------------

    def close(self, timeout: float | None = CLOSE_TIMEOUT_SEC) -> None:
        """Ends the registration. Idempotent.

        From another thread than the registration's loop it waits until closed, at
        most ``timeout`` seconds (None: no limit). On that loop's own thread it
        cannot wait there: it starts the close and returns (await
        ``handle.registration.close()`` instead to wait for it).
        """
        if self._closed:
            return
        self._closed = True
        if self._runner is not None:
            try:
                self._runner.run(self._registration.close)
            finally:
                self._runner.stop()
                self._runner.join(timeout)
            return
        loop = self._loop
        assert loop is not None
        if loop.is_closed():
            _OPEN_ON_LOOPS.discard(self)
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            closing = loop.create_task(self._registration.close())
            closing.add_done_callback(lambda _: _OPEN_ON_LOOPS.discard(self))
            return
        future = asyncio.run_coroutine_threadsafe(self._registration.close(), loop)
        try:
            future.result(timeout)
        finally:
            _OPEN_ON_LOOPS.discard(self)

    def __enter__(self) -> WorkloadHandle:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<WorkloadHandle {self._registration!r}>"


def register_workload(
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
) -> WorkloadHandle:
    """Registers a workload with the agent at `agent` and keeps it registered until
    closed; the arguments are the v1alpha1 client's.

    Give either `workload` (a vLLM engine, or an object with ``snapshot(mode,
    tags)`` and ``restore(tags)``, such as `HostMemoryWorkload`) or both
    callbacks ``on_snapshot(mode, tags)`` and ``on_restore(tags)``; see
    `timeslice.client.adapters`. ``supported_modes`` ("offload", "discard"),
    ``default_mode`` and ``tags`` are what the workload registers with; they
    override what the workload object declares. ``tls`` and ``token`` are the
    credentials of the connection to the agent (defaults: TIMESLICE_TLS_* and
    TIMESLICE_TOKEN, unless ``credentials_from_env`` is False).

    Where an event loop runs, the registration starts at once on it:
    ``registration = await register_workload(...)`` returns once registered
    (see `WorkloadRegistration.start` for ``connect_timeout_sec``). Where none
    runs, it is served by a thread of its own and the `WorkloadHandle` is
    returned once registered; ``handle.close()`` ends it. Raises
    `InvalidArgumentError` at once for arguments it cannot use.
    """
    registration = WorkloadRegistration(
        agent,
        job_id,
        group,
        workload,
        on_snapshot,
        on_restore,
        supported_modes,
        default_mode,
        tags,
        connect_timeout_sec=connect_timeout_sec,
        tls=tls,
        token=token,
        credentials_from_env=credentials_from_env,
    )
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is None and not isinstance(agent, str):
        raise RuntimeError(
            "a grpclib Channel belongs to its event loop: register_workload with a"
            " channel is for code running on that loop"
        )
    return WorkloadHandle(registration, loop=loop)


def register_workload_in_thread(
    agent: str,
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
) -> WorkloadHandle:
    """`register_workload` on a thread of its own even where an event loop runs (its
    callbacks then run away from that loop). Blocks until registered;
    `handle.close()` ends it."""
    registration = WorkloadRegistration(
        agent,
        job_id,
        group,
        workload,
        on_snapshot,
        on_restore,
        supported_modes,
        default_mode,
        tags,
        connect_timeout_sec=connect_timeout_sec,
        tls=tls,
        token=token,
        credentials_from_env=credentials_from_env,
    )
    return WorkloadHandle(registration)
