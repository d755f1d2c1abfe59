"""The groups a job's phases hold: acquired all at once, yielded when no open phase
needs them.

Every plugin maps its framework's phases onto groups the same way: a phase that
begins acquires its groups in one atomic `acquire_groups` call, and a phase that
ends yields the groups no other open phase needs. Holding is idempotent: a phase
that begins while another one holds its groups acquires nothing.

A job never waits while it holds a group. A phase that begins while others hold
some groups, and needs one more, is refused (`ConflictError`) before anything is
sent: the earlier phase must name that group too, so that both are acquired
together. Waiting while holding keeps the held group idle for the wait, and
deadlocks as soon as two jobs ask in different orders; acquired together, the
groups are granted at once or not at all, whatever order others ask in.

A grant's lease is renewed by the client in the background; a process that
dies stops renewing, and its groups go to the next job when the lease runs out
(or at once, when the agent sees its workload go). No exit handler is needed.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Final, Protocol

from timeslice.client._sync import TimeSliceOrchestratorClient
from timeslice.client.types import AcquireResult, YieldResult
from timeslice.errors import ConflictError, InvalidArgumentError, LeaseLostError, NotFoundError
from timeslice.ids import check_id

log = logging.getLogger("timeslice.integrations")

# A phase names a handful of groups (Slime: a trainer and a sampler pool), and a
# loop has a handful of phases open at once.
MAX_PHASE_GROUPS: Final = 16
MAX_OPEN_PHASES: Final = 64
MAX_PHASE_NAME_CHARS: Final = 128


class LockClient(Protocol):
    """What `PhaseLocks` needs of an orchestrator client (`TimeSliceOrchestratorClient` has it)."""

    def acquire_groups(
        self,
        group_ids: Sequence[str],
        job_id: str | None = None,
        timeout_sec: float | None = None,
    ) -> AcquireResult:
        """Blocks until the job holds every group, granted at once."""
        ...

    def release(
        self,
        job_id: str | None = None,
        group_id: str | None = None,
        timeout_sec: float | None = None,
    ) -> YieldResult:
        """Yields one group."""
        ...

    def lease_lost(self, job_id: str | None = None, group_id: str | None = None) -> bool:
        """Whether the job's last grant in the group lost its lease."""
        ...

    def close(self) -> None:
        """Stops the client."""
        ...


def check_groups(groups: Iterable[str]) -> tuple[str, ...]:
    """The groups, each checked, duplicates dropped (first kept); at least one."""
    if isinstance(groups, str):
        raise InvalidArgumentError("groups must be a sequence of group ids, not one string")
    found = tuple(dict.fromkeys(groups))
    if not found:
        raise InvalidArgumentError("a phase must name at least one group")
    if len(found) > MAX_PHASE_GROUPS:
        raise InvalidArgumentError(
            f"a phase may name at most {MAX_PHASE_GROUPS} groups, not {len(found)}"
        )
    for group in found:
        if not isinstance(group, str):
            raise InvalidArgumentError(f"a group id must be a string, not {type(group).__name__}")
        check_id("group_id", group)
    return found


class PhaseLocks:
    """The groups one job holds for its phases, through a blocking orchestrator client.

    Groups are yielded in the reverse of the order they were granted in (a
    phase's own in the reverse of the order it names them). ``acquire_timeout_sec``
    bounds each wait (None: no limit), after which `DeadlineExceededError` is
    raised and the job has left the queue. Not thread-safe: a training loop calls
    it from one thread.
    """

    def __init__(
        self,
        client: LockClient,
        *,
        job_id: str,
        acquire_timeout_sec: float | None = None,
    ) -> None:
        check_id("job_id", job_id)
        _check_acquire_timeout(acquire_timeout_sec)
        self.client = client
        self.job_id = job_id
        self.acquire_timeout_sec = acquire_timeout_sec
        self._held: list[str] = []  # in the order they were granted
        self._phases: dict[str, tuple[str, ...]] = {}  # open phases and the groups they need
        self.acquisitions = 0  # Acquire calls sent
        self.last_result: AcquireResult | None = None  # the answer to the last one
        self.releases = 0  # groups yielded

    @property
    def held(self) -> frozenset[str]:
        """The groups the job holds now."""
        return frozenset(self._held)

    def acquire(self, groups: Iterable[str]) -> AcquireResult | None:
        """Holds every one of ``groups``: those not held yet are acquired in one
        atomic call. Returns its result, or None when all were held already.

        Raises `ConflictError`, sending nothing, when some are missing while the
        job holds other groups: it never waits while it holds.
        """
        wanted = check_groups(groups)
        missing = [group for group in wanted if group not in self._held]
        if not missing:
            return None
        if self._held:
            raise ConflictError(
                f"job {self.job_id!r} would wait for {missing} while it holds"
                f" {list(self._held)}: a job waits only while it holds nothing; name"
                f" {missing} in the phase that acquired {list(self._held)} too, so that"
                " they are acquired together"
            )
        result = self.client.acquire_groups(
            missing, job_id=self.job_id, timeout_sec=self.acquire_timeout_sec
        )
        self.acquisitions += 1
        self.last_result = result
        self._held.extend(missing)
        return result

    @property
    def open_phases(self) -> dict[str, tuple[str, ...]]:
        """The phases begun and not ended, with the groups each needs."""
        return dict(self._phases)

    def begin(self, phase: str, groups: Iterable[str]) -> AcquireResult | None:
        """A phase begins: holds its groups (see `acquire`) until it ends. A phase
        begun again before it ended keeps the groups it had and adds these."""
        _check_phase(phase)
        wanted = check_groups(groups)
        if phase not in self._phases and len(self._phases) >= MAX_OPEN_PHASES:
            raise InvalidArgumentError(
                f"job {self.job_id!r} has {MAX_OPEN_PHASES} phases open: end one first"
            )
        result = self.acquire(wanted)
        self._phases[phase] = tuple(dict.fromkeys((*self._phases.get(phase, ()), *wanted)))
        return result

    def end(self, phase: str) -> None:
        """A phase ends: yields its groups that no other open phase needs (see
        `release`). A phase that is not open ends with nothing released."""
        _check_phase(phase)
        groups = self._phases.pop(phase, None)
        if groups is None:
            log.debug("job %s: phase %r ended without having begun", self.job_id, phase)
            return
        needed = {group for other in self._phases.values() for group in other}
        self._release([g for g in self._held if g in groups and g not in needed])

    def release(self, groups: Iterable[str]) -> None:
        """Yields those of ``groups`` that are held, the last granted first.

        A grant that is not the job's any more (refused, or its lease lost) is
        forgotten and the others are still released; then `LeaseLostError` is
        raised: the phase ran while the group could already have gone to another
        job. Any other failure is raised at once, the groups not tried yet still
        held.
        """
        wanted = set(check_groups(groups))
        self._release([group for group in self._held if group in wanted])

    def release_all(self) -> None:
        """Yields every held group (see `release`) and ends every open phase."""
        self._phases.clear()
        self._release(list(self._held))

    @contextlib.contextmanager
    def holding(self, groups: Iterable[str]) -> Iterator[AcquireResult | None]:
        """Holds ``groups`` for a block, and releases what this block acquired after it."""
        before = self.held
        result = self.acquire(groups)
        try:
            yield result
        finally:
            self._release([group for group in self._held if group not in before])

    def close(self, *, close_client: bool = True) -> None:
        """Releases every held group (a lost lease is logged) and, with
        ``close_client``, closes the client. Idempotent."""
        try:
            self.release_all()
        except LeaseLostError as error:
            log.warning("job %s: %s", self.job_id, error)
        finally:
            if close_client:
                self.client.close()

    def _release(self, groups: list[str]) -> None:
        ordered = [group for group in reversed(self._held) if group in groups]
        lost: list[str] = []
        for group in ordered:
            if self.client.lease_lost(self.job_id, group):
                lost.append(group)
            try:
                self.client.release(self.job_id, group)
            except (ConflictError, NotFoundError) as error:
                # The grant is not ours any more: nothing is left to release.
                log.warning("job %s: releasing %s: %s", self.job_id, group, error)
                if group not in lost:
                    lost.append(group)
            finally:
                # Forgotten also when the release failed otherwise: the error
                # goes up, and the lease runs out if the yield never arrived.
                self._held.remove(group)
                self.releases += 1
        if lost:
            raise LeaseLostError(
                f"job {self.job_id!r} lost its grant of {lost} before the phase ended:"
                " its work may have run while the accelerators were another job's"
            )


def _check_phase(phase: str) -> None:
    if not isinstance(phase, str) or not phase:
        raise InvalidArgumentError("a phase must be named by a non-empty string")
    if len(phase) > MAX_PHASE_NAME_CHARS:
        raise InvalidArgumentError(
            f"a phase name may have at most {MAX_PHASE_NAME_CHARS} characters, not {len(phase)}"
        )


def _check_acquire_timeout(acquire_timeout_sec: float | None) -> None:
    if acquire_timeout_sec is not None and not acquire_timeout_sec > 0:
        raise InvalidArgumentError(
            f"acquire_timeout_sec must be positive or None: {acquire_timeout_sec}"
        )


def connect(
    *,
    job_id: str,
    client: LockClient | None,
    orchestrator: str,
    group_id: str | None = None,
    lease_ttl_sec: float | None,
    acquire_timeout_sec: float | None,
) -> tuple[PhaseLocks, bool]:
    """`PhaseLocks` over ``client``, or over a new `TimeSliceOrchestratorClient` of
    ``orchestrator`` (checked before it is made); and whether the client is new,
    so the caller's to close."""
    check_id("job_id", job_id)
    _check_acquire_timeout(acquire_timeout_sec)
    if client is not None:
        return PhaseLocks(client, job_id=job_id, acquire_timeout_sec=acquire_timeout_sec), False
    made = TimeSliceOrchestratorClient(orchestrator, job_id, group_id, lease_ttl_sec=lease_ttl_sec)
    return PhaseLocks(made, job_id=job_id, acquire_timeout_sec=acquire_timeout_sec), True
