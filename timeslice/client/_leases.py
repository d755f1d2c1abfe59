"""The grants a client holds, and the background KeepAlive of their leases."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb
from timeslice.client._transport import backoff_delays
from timeslice.errors import (
    ConflictError,
    LeaseLostError,
    NotFoundError,
    TimeSliceError,
    UnimplementedError,
)

logger = logging.getLogger("timeslice.client")

LeaseLostCallback = Callable[[str, str, TimeSliceError], object]
"""Called as `(group_id, job_id, error)` when a held lease is lost; may be async."""

# The shortest deadline a renewal is sent with, so that a lease about to run
# out still gets one real try.
_MIN_RENEW_TIMEOUT_SEC = 0.05


@dataclass
class Holding:
    """One grant this client holds: what a release must send, and when its lease runs out.

    `expires_at` is on the event loop's clock, counted from when the client
    heard of the grant or sent the renewal that extended it.
    """

    group_id: str
    job_id: str
    fencing_token: int
    lease_id: str
    ttl_ms: int
    expires_at: float | None
    keep_alive_task: asyncio.Task[None] | None = None
    yield_requested: bool = False  # the last renewal said the hold limit is reached


Renew = Callable[[Holding, float], Awaitable[pb.KeepAliveResponse]]
"""Sends one KeepAlive for a holding with the given deadline, raising timeslice errors."""


class LeaseKeeper:
    """Keeps the leases of held grants alive and remembers the ones that were lost.

    A lease is renewed every third of its TTL. An error that says the grant is
    gone (ABORTED, NOT_FOUND, FAILED_PRECONDITION) loses it at once; any other
    failure is retried until the lease would have run out, and then loses it;
    UNIMPLEMENTED (a server without leases) stops the renewals quietly.
    """

    def __init__(
        self,
        renew: Renew,
        *,
        call_timeout_sec: float,
        on_lease_lost: LeaseLostCallback | None,
    ) -> None:
        self._send_keep_alive = renew
        self._call_timeout_sec = call_timeout_sec
        self._on_lease_lost = on_lease_lost
        self._held: dict[tuple[str, str], Holding] = {}
        self._lost: dict[tuple[str, str], TimeSliceError] = {}

    def hold(
        self,
        group_id: str,
        job_id: str,
        fencing_token: int,
        lease: pb.Lease | None,
        received_at: float,
    ) -> Holding:
        """Records a grant and starts renewing its lease if it has one."""
        key = (group_id, job_id)
        previous = self._held.pop(key, None)
        if previous is not None and previous.keep_alive_task is not None:
            previous.keep_alive_task.cancel()
        self._lost.pop(key, None)
        ttl_ms = lease.ttl_ms if lease is not None else 0
        holding = Holding(
            group_id=group_id,
            job_id=job_id,
            fencing_token=fencing_token,
            lease_id=lease.lease_id if lease is not None else "",
            ttl_ms=ttl_ms,
            expires_at=received_at + ttl_ms / 1000 if ttl_ms > 0 else None,
        )
        if ttl_ms > 0:
            holding.keep_alive_task = asyncio.create_task(
                self._keep_alive(holding), name=f"timeslice keepalive {group_id}/{job_id}"
            )
        self._held[key] = holding
        return holding

    def held(self, group_id: str, job_id: str) -> Holding | None:
        """The grant held for this job in this group, if any."""
        return self._held.get((group_id, job_id))

    def lost(self, group_id: str, job_id: str) -> TimeSliceError | None:
        """Why the job's last grant in this group was lost; None if it was not."""
        return self._lost.get((group_id, job_id))

    def run_out(self, group_id: str, job_id: str, now: float) -> bool:
        """Whether the lease of the job's grant has run out by `now` (the loop's clock)
        with no renewal heard: a process frozen past its lease learns so the moment it
        runs again, before any renewal could tell it."""
        holding = self._held.get((group_id, job_id))
        return holding is not None and holding.expires_at is not None and now > holding.expires_at

    async def take(self, group_id: str, job_id: str) -> Holding | None:
        """Forgets a grant (before its release) and stops renewing it."""
        holding = self._held.pop((group_id, job_id), None)
        if holding is not None:
            await _stop(holding.keep_alive_task)
            holding.keep_alive_task = None
        return holding

    def put_back(self, holding: Holding) -> None:
        """Remembers a grant again after a release that did not get through.

        Its lease is not renewed any more; the grant is kept so that a repeated
        release still sends its fencing token.
        """
        self._held.setdefault((holding.group_id, holding.job_id), holding)

    def renewed(self, holding: Holding, response: pb.KeepAliveResponse, sent_at: float) -> None:
        """Extends a holding after a successful KeepAlive sent at `sent_at`."""
        lease = response.lease
        if lease is not None and lease.ttl_ms > 0:
            holding.ttl_ms = lease.ttl_ms
            holding.lease_id = lease.lease_id or holding.lease_id
        if holding.ttl_ms > 0:
            holding.expires_at = sent_at + holding.ttl_ms / 1000
        if response.fencing_token:
            holding.fencing_token = response.fencing_token
        holding.yield_requested = response.yield_requested

    async def close(self) -> None:
        """Stops every renewal; the grants themselves stay with the server."""
        holdings = list(self._held.values())
        self._held.clear()
        for holding in holdings:
            await _stop(holding.keep_alive_task)

    async def _keep_alive(self, holding: Holding) -> None:
        try:
            while True:
                await asyncio.sleep(holding.ttl_ms / 3000)
                if not await self._renew(holding):
                    return
        except Exception:
            logger.exception("keepalive of %s/%s failed", holding.group_id, holding.job_id)

    async def _renew(self, holding: Holding) -> bool:
        """Renews once, retrying until the lease runs out. False: stop renewing."""
        loop = asyncio.get_running_loop()
        delays = backoff_delays()
        while True:
            assert holding.expires_at is not None
            sent_at = loop.time()
            timeout = max(
                min(self._call_timeout_sec, holding.expires_at - sent_at), _MIN_RENEW_TIMEOUT_SEC
            )
            try:
                response = await self._send_keep_alive(holding, timeout)
            except (ConflictError, NotFoundError) as error:
                await self._report_lost(holding, error)
                return False
            except UnimplementedError:
                logger.debug("the server does not know KeepAlive; leases are not renewed")
                holding.expires_at = None  # nor do its grants run out
                return False
            except TimeSliceError as error:
                left = holding.expires_at - loop.time()
                if left <= 0:
                    await self._report_lost(
                        holding,
                        LeaseLostError(
                            f"the lease of job {holding.job_id!r} in group {holding.group_id!r}"
                            f" ran out while it could not be renewed: {error.message}"
                        ),
                    )
                    return False
                logger.debug("KeepAlive failed, retrying: %s", error)
                await asyncio.sleep(min(next(delays), left))
            else:
                self.renewed(holding, response, sent_at)
                return True

    async def _report_lost(self, holding: Holding, error: TimeSliceError) -> None:
        # The holding stays: a late release still sends its (now stale) token
        # and is refused, instead of releasing a grant that is not ours.
        self._lost[(holding.group_id, holding.job_id)] = error
        logger.warning(
            "lost the lease of job %r in group %r: %s", holding.job_id, holding.group_id, error
        )
        if self._on_lease_lost is None:
            return
        try:
            outcome = self._on_lease_lost(holding.group_id, holding.job_id, error)
            if inspect.isawaitable(outcome):
                await outcome
        except Exception:
            logger.exception("on_lease_lost callback failed")


async def _stop(task: asyncio.Task[None] | None) -> None:
    # A callback may release from inside the keepalive task: never await oneself.
    current = asyncio.current_task()
    if task is None or task is current:
        return
    # Only a cancellation of this caller that arrives while it waits is its own:
    # a count raised before (by grpclib, which never takes its back) is not.
    before = current.cancelling() if current is not None else 0
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        if current is not None and current.cancelling() > before:
            raise
