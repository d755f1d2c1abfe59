"""A recording stand-in for the orchestrator client, for tests of the plugins' hook
logic on their own (the integration tests use a real orchestrator)."""

from __future__ import annotations

from collections.abc import Sequence

from timeslice.client.types import AcquireResult, YieldResult
from timeslice.errors import LeaseLostError


class RecordingClient:
    """Grants every acquire at once and records each call: ``("acquire", groups)``,
    ``("release", group)``. Groups in ``lost`` report a lost lease."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.held: set[str] = set()
        self.lost: set[str] = set()
        self.refuse_release: set[str] = set()
        self.closed = False

    def acquire_groups(
        self,
        group_ids: Sequence[str],
        job_id: str | None = None,
        timeout_sec: float | None = None,
    ) -> AcquireResult:
        groups = tuple(group_ids)
        assert not self.held, f"waited for {groups} while holding {self.held}"
        self.calls.append(("acquire", groups))
        self.held |= set(groups)
        return AcquireResult(success=True, waited_ms=0, context_restored=False)

    def release(
        self,
        job_id: str | None = None,
        group_id: str | None = None,
        timeout_sec: float | None = None,
    ) -> YieldResult:
        assert group_id in self.held, f"released {group_id}, not held ({self.held})"
        self.calls.append(("release", group_id))
        self.held.discard(group_id)
        if group_id in self.refuse_release:
            raise LeaseLostError(f"the grant of {group_id} was revoked")
        return YieldResult(success=True, pending_waiters=0, snapshot_deferred=False)

    def lease_lost(self, job_id: str | None = None, group_id: str | None = None) -> bool:
        return group_id in self.lost

    def close(self) -> None:
        self.closed = True
