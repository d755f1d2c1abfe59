"""The blocking orchestrator client, with the v1alpha1 client's signatures.

It drives an `AsyncTimeSliceOrchestratorClient` on an event loop of its own,
in a daemon thread, so that leases are renewed while the calling thread
computes, and it raises the same exceptions the async client raises.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Awaitable, Callable, Iterator, Sequence
from types import TracebackType
from typing import Any, TypeVar

from timeslice.api.gen.snapshot_agent.v1alpha1 import BackendConfig
from timeslice.client._bridge import LoopThread, OnAccelerators, run_blocking
from timeslice.client._leases import LeaseLostCallback
from timeslice.client._connector import DEFAULT_PING_EVERY_SEC, DEFAULT_PING_TIMEOUT_SEC
from timeslice.client._transport import credentials
from timeslice.client.orchestrator import DEFAULT_TARGET, AsyncTimeSliceOrchestratorClient
from timeslice.client.types import (
    AcquireResult,
    ForceReleaseResult,
    Leadership,
    LeaseInfo,
    OrchestratorGroupStatus,
    WatchEvent,
    YieldResult,
)
from timeslice.targets import parse_targets
from timeslice.security.tls import ClientTls

T = TypeVar("T")

logger = logging.getLogger("timeslice.client")


class TimeSliceOrchestratorClient:
    """Blocking client of the orchestrator: acquire and release a group's lock.

    A drop-in for the v1alpha1 client. ``channel_options`` is accepted for
    compatibility and ignored, with a warning logged (the transport is grpclib,
    not grpcio: its retries are the client's own). The
    keyword-only options are those of `AsyncTimeSliceOrchestratorClient`;
    ``on_lease_lost`` runs on the client's own thread.

    Usable from any thread, and from async code through ``async with
    client.on_accelerators()``. `close()` (or leaving a ``with`` block) stops
    the client; held locks stay held.
    """

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        job_id: str | None = None,
        group_id: str | None = None,
        channel_options: Sequence[tuple[str, Any]] | None = None,
        *,
        lease_ttl_sec: float | None = 10.0,
        call_timeout_sec: float = 10.0,
        reconnect_timeout_sec: float = 30.0,
        on_lease_lost: LeaseLostCallback | None = None,
        priority: int = 0,
        tls: ClientTls | None = None,
        token: str | None = None,
        credentials_from_env: bool = True,
        ping_every_sec: float | None = DEFAULT_PING_EVERY_SEC,
        ping_timeout_sec: float = DEFAULT_PING_TIMEOUT_SEC,
    ) -> None:
        parse_targets(target)  # a bad target fails here, before a thread starts
        tls, token = credentials(tls, token, credentials_from_env)  # and bad credentials
        if channel_options:
            names = [str(o[0]) if isinstance(o, tuple) and o else repr(o) for o in channel_options]
            logger.warning(
                "TimeSliceOrchestratorClient ignores channel_options, grpcio's settings"
                " (its transport is grpclib): %s",
                ", ".join(names[:10]),
            )
        self._runner = LoopThread("timeslice-orchestrator-client")
        self._loop = self._runner.loop

        async def create() -> AsyncTimeSliceOrchestratorClient:
            return AsyncTimeSliceOrchestratorClient(
                target,
                job_id,
                group_id,
                lease_ttl_sec=lease_ttl_sec,
                call_timeout_sec=call_timeout_sec,
                reconnect_timeout_sec=reconnect_timeout_sec,
                on_lease_lost=on_lease_lost,
                priority=priority,
                tls=tls,
                token=token,
                credentials_from_env=False,
                ping_every_sec=ping_every_sec,
                ping_timeout_sec=ping_timeout_sec,
            )

        try:
            self._client = self._runner.run(create)
        except BaseException:
            self._runner.stop()
            self._runner.join()
            raise
        self._join_timeout_sec = call_timeout_sec
        self._finalizer = weakref.finalize(self, self._runner.stop, self._client.close)

    @property
    def target(self) -> str:
        """The server's address."""
        return self._client.target

    @property
    def job_id(self) -> str | None:
        """The job used by calls that do not name one."""
        return self._client.job_id

    @job_id.setter
    def job_id(self, value: str | None) -> None:
        self._client.job_id = value

    @property
    def group_id(self) -> str | None:
        """The group used by calls that do not name one."""
        return self._client.group_id

    @group_id.setter
    def group_id(self, value: str | None) -> None:
        self._client.group_id = value

    def __enter__(self) -> TimeSliceOrchestratorClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stops lease renewals, the connection and the client's thread. Idempotent."""
        if not self._finalizer.alive:
            return
        self._finalizer()
        self._runner.join(self._join_timeout_sec)

    def acquire(
        self,
        job_id: str | None = None,
        group_id: str | None = None,
        timeout_sec: float | None = None,
    ) -> AcquireResult:
        """Blocks until the job holds the group's lock and its context is loaded.

        ``timeout_sec``: the longest wait (None: no limit), after which
        `DeadlineExceededError` is raised and the job has left the queue.
        """
        call = self._client.acquire(job_id, group_id, timeout_sec)
        return self._run(lambda: call)

    def acquire_groups(
        self,
        group_ids: Sequence[str],
        job_id: str | None = None,
        timeout_sec: float | None = None,
    ) -> AcquireResult:
        """Blocks until the job holds every one of ``group_ids``, granted all at once
        (no deadlock whatever order jobs ask in); `release()` each group after."""
        call = self._client.acquire_groups(group_ids, job_id, timeout_sec)
        return self._run(lambda: call)

    def release(
        self,
        job_id: str | None = None,
        group_id: str | None = None,
        timeout_sec: float | None = None,
    ) -> YieldResult:
        """Releases the lock (the Yield call); `LeaseLostError` if it was revoked meanwhile."""
        return self._run(lambda: self._client.release(job_id, group_id, timeout_sec))

    def get_status(
        self,
        group_id: str | None = None,
        timeout_sec: float | None = None,
        *,
        lock_only: bool = False,
    ) -> OrchestratorGroupStatus:
        """The group's lock state and its jobs' context states on every node
        (``lock_only``: the lock state alone, without asking the agents)."""
        return self._run(
            lambda: self._client.get_status(group_id, timeout_sec, lock_only=lock_only)
        )

    def list_groups(self, timeout_sec: float | None = None) -> list[str]:
        """Every group the orchestrator knows."""
        return self._run(lambda: self._client.list_groups(timeout_sec))

    def get_leadership(self, timeout_sec: float | None = None) -> Leadership:
        """Where this orchestrator stands (see the async client's `get_leadership`)."""
        return self._run(lambda: self._client.get_leadership(timeout_sec))

    def keep_alive(
        self,
        job_id: str | None = None,
        group_id: str | None = None,
        timeout_sec: float | None = None,
    ) -> LeaseInfo:
        """Renews the job's lease now (the client also does so in the background)."""
        return self._run(lambda: self._client.keep_alive(job_id, group_id, timeout_sec))

    def lease_lost(self, job_id: str | None = None, group_id: str | None = None) -> bool:
        """Whether the job's last grant in the group lost its lease (until it acquires again)."""
        return self._client.lease_lost(job_id, group_id)

    def watch(self, group_id: str = "") -> Iterator[WatchEvent]:
        """The events of one group, or of every group when ``group_id`` is empty."""
        events = self._client.watch(group_id)
        try:
            while True:
                try:
                    event = self._run(events.__anext__)
                except StopAsyncIteration:
                    return
                yield event
        finally:
            if self._finalizer.alive:
                self._run(events.aclose)

    def force_release(
        self,
        group_id: str | None = None,
        job_id: str = "",
        reason: str = "",
        timeout_sec: float | None = None,
    ) -> ForceReleaseResult:
        """Operator action: takes the group's lock from its holder (only ``job_id``'s if set)."""
        return self._run(lambda: self._client.force_release(group_id, job_id, reason, timeout_sec))

    def register_job(
        self,
        backend_config: BackendConfig | None,
        job_id: str | None = None,
        group_id: str | None = None,
        node: str = "",
        timeout_sec: float | None = None,
    ) -> None:
        """Registers the backend the job's contexts need on the group's nodes."""
        self._run(
            lambda: self._client.register_job(backend_config, job_id, group_id, node, timeout_sec)
        )

    def reset_job(
        self,
        job_id: str | None = None,
        group_id: str | None = None,
        timeout_sec: float | None = None,
    ) -> bool:
        """Operator action: lifts the job's quarantine on the group."""
        return self._run(lambda: self._client.reset_job(job_id, group_id, timeout_sec))

    def set_group_nodes(
        self, nodes: Sequence[str], group_id: str | None = None, timeout_sec: float | None = None
    ) -> None:
        """Names the nodes the group spans."""
        self._run(lambda: self._client.set_group_nodes(nodes, group_id, timeout_sec))

    def on_accelerators(
        self,
        job_id: str | None = None,
        group_id: str | None = None,
        timeout_sec: float | None = None,
    ) -> OnAccelerators:
        """The lock around a block or a function: ``with``, ``async with``, or a decorator."""
        return self._client.on_accelerators(job_id, group_id, timeout_sec)

    def _run(self, factory: Callable[[], Awaitable[T]]) -> T:
        if not self._finalizer.alive:
            raise RuntimeError("the orchestrator client is closed")
        return run_blocking(self._loop, factory)
