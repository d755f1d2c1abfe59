"""A Slime phase callback: the job holds its trainer and sampler pools only for the
phases that use them.

Slime's driver calls ``on_phase_begin(phase, role, context)`` and
``on_phase_end(phase, role, context)`` around each phase, with the role that
says which pool the phase runs on; the callback has the hook names, the
environment variables and the phase-to-pool mapping of the v1alpha1 Slime
integration (``timeslice_slime.TimesliceCallback``), so it replaces it in a
driver's configuration:

    phase (role)                               holds
    init, weight_sync (both)                   trainer and sampler pools, together
    train, create (trainer)                    trainer pool
    generate, offload, onload, eval (sampler)  sampler pool

What differs from v1alpha1:

- A phase's pools are acquired in one atomic call (``acquire_groups``), not the
  trainer pool and then the sampler pool, and the job never waits while it
  holds a pool: it never keeps its trainer pool idle while it waits for its
  sampler pool, and jobs cannot deadlock however they ask (a lock order is
  safe only while every job keeps it).
- Slime's asynchronous driver dispatches the next generation while training
  runs. With ``async_driver=True`` (``TIMESLICE_SLIME_ASYNC=1``) the train phase
  holds both pools, so that the generation begun inside it waits for nothing;
  without it, that generation raises `ConflictError` instead of waiting for
  the sampler pool while holding the trainer pool.
- A phase's end yields only the pools no other open phase needs (training
  that ends while the next generation runs keeps the sampler pool).
- Every grant has a lease that the client renews in the background, so there
  is no exit handler: a driver that dies stops renewing and its pools go to
  the next job when the lease runs out (at once, when the agent sees the
  workloads go). `close()` yields what is held.

Configuration, from the arguments or else the environment (all four needed,
else the callback does nothing, so the same image runs without timeslice):
``TIMESLICE_JOB_ID``, ``TIMESLICE_ORCH_ADDR``, ``TIMESLICE_TRAINER_GROUP``,
``TIMESLICE_SAMPLER_GROUP``; optionally ``TIMESLICE_AGENT_ADDR`` with
``workloads`` (role -> workload) registered by the callback for state that
lives in the driver's own process (Slime's Megatron and SGLang processes
register theirs with their own nodes' agents).

Slime cannot be installed on the CPU machines that test this package: the
callback is tested against this hook contract, replayed as Slime's
synchronous and asynchronous drivers call it, not against Slime itself. A
driver that checks ``isinstance(cb, PhaseCallback)`` can use
``class Callback(TimeSliceSlimeCallback, PhaseCallback): pass``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Final

from timeslice.errors import InvalidArgumentError
from timeslice.ids import check_id
from timeslice.integrations._locks import LockClient, PhaseLocks, connect
from timeslice.integrations._registrations import Registrations

log = logging.getLogger("timeslice.integrations")

ENV_JOB_ID: Final = "TIMESLICE_JOB_ID"
ENV_ORCH_ADDR: Final = "TIMESLICE_ORCH_ADDR"
ENV_TRAINER_GROUP: Final = "TIMESLICE_TRAINER_GROUP"
ENV_SAMPLER_GROUP: Final = "TIMESLICE_SAMPLER_GROUP"
ENV_AGENT_ADDR: Final = "TIMESLICE_AGENT_ADDR"
ENV_ASYNC: Final = "TIMESLICE_SLIME_ASYNC"

TRAINER: Final = "trainer"
SAMPLER: Final = "sampler"
BOTH: Final = "both"
ROLES: Final = {TRAINER: (TRAINER,), SAMPLER: (SAMPLER,), BOTH: (TRAINER, SAMPLER)}
# The phase inside which the asynchronous driver dispatches the next generation.
TRAIN_PHASE: Final = "train"

DEFAULT_ACQUIRE_TIMEOUT_SEC: Final = 600.0


class TimeSliceSlimeCallback:
    """Slime's phase hooks on the orchestrator: each phase holds its role's pools.

    Arguments left None are read from the environment (see the module's
    docstring). ``client`` replaces the connection to the orchestrator (and is
    not closed by the callback). ``workloads`` maps a role ("trainer",
    "sampler") to a workload registered with ``agent`` in that role's group.
    ``async_driver``: the train phase holds both pools (Slime's asynchronous
    driver generates beside training).
    """

    def __init__(
        self,
        *,
        job_id: str | None = None,
        orchestrator: str | None = None,
        trainer_group: str | None = None,
        sampler_group: str | None = None,
        agent: str | None = None,
        workloads: Mapping[str, object] | None = None,
        async_driver: bool | None = None,
        client: LockClient | None = None,
        lease_ttl_sec: float | None = 10.0,
        acquire_timeout_sec: float | None = DEFAULT_ACQUIRE_TIMEOUT_SEC,
        connect_timeout_sec: float = 30.0,
    ) -> None:
        job_id = job_id or os.environ.get(ENV_JOB_ID) or None
        orchestrator = orchestrator or os.environ.get(ENV_ORCH_ADDR) or None
        trainer_group = trainer_group or os.environ.get(ENV_TRAINER_GROUP) or None
        sampler_group = sampler_group or os.environ.get(ENV_SAMPLER_GROUP) or None
        agent = agent or os.environ.get(ENV_AGENT_ADDR) or None
        if async_driver is None:
            async_driver = os.environ.get(ENV_ASYNC, "").strip().lower() in ("1", "true", "yes")
        self.async_driver = async_driver
        self.job_id = job_id
        self.locks: PhaseLocks | None = None
        self.registrations: Registrations | None = None
        self.groups: dict[str, str] = {}
        self._owns_client = False
        if not (job_id and (orchestrator or client) and trainer_group and sampler_group):
            log.warning(
                "time-slicing is off: set %s, %s, %s and %s; the callback does nothing",
                ENV_JOB_ID,
                ENV_ORCH_ADDR,
                ENV_TRAINER_GROUP,
                ENV_SAMPLER_GROUP,
            )
            return
        check_id("job_id", job_id)
        check_id("trainer_group", trainer_group)
        check_id("sampler_group", sampler_group)
        if trainer_group == sampler_group:
            raise InvalidArgumentError(
                f"the trainer and sampler pools must be different groups, not both"
                f" {trainer_group!r}"
            )
        if workloads and agent is None:
            raise InvalidArgumentError(f"workloads need the agent's address ({ENV_AGENT_ADDR})")
        if unknown := sorted(set(workloads or {}) - {TRAINER, SAMPLER}):
            raise InvalidArgumentError(f"workloads are keyed by role (trainer, sampler): {unknown}")
        self.groups = {TRAINER: trainer_group, SAMPLER: sampler_group}
        registrations = (
            Registrations(agent, job_id, connect_timeout_sec=connect_timeout_sec)
            if agent is not None
            else None
        )
        self.locks, self._owns_client = connect(
            job_id=job_id,
            client=client,
            orchestrator=orchestrator or "",
            lease_ttl_sec=lease_ttl_sec,
            acquire_timeout_sec=acquire_timeout_sec,
        )
        self.registrations = registrations
        try:
            for role, workload in (workloads or {}).items():
                assert registrations is not None
                registrations.add(self.groups[role], workload)
        except BaseException:
            self.close()
            raise

    @property
    def enabled(self) -> bool:
        """Whether the callback talks to an orchestrator (False: it does nothing)."""
        return self.locks is not None

    def held(self, role: str) -> bool:
        """Whether the job holds the pool of ``role`` ("trainer" or "sampler") now."""
        if self.locks is None:
            return False
        return self.groups[_single_role(role)] in self.locks.held

    def on_phase_begin(self, phase: str, role: str, context: object = None) -> None:
        """Holds the pools of ``role`` for ``phase`` (with ``async_driver``, both for
        the train phase), acquiring those not held in one call."""
        groups = self._groups(role)
        if self.async_driver and phase == TRAIN_PHASE:
            groups = self._groups(BOTH)
        if self.locks is not None:
            self.locks.begin(phase, groups)

    def on_phase_end(self, phase: str, role: str, context: object = None) -> None:
        """Yields the pools of ``phase`` that no other open phase needs."""
        self._groups(role)  # an unknown role is an error here too
        if self.locks is not None:
            self.locks.end(phase)

    def close(self, *, restore: bool = True) -> None:
        """Yields every pool, ends the registrations and closes the client. Idempotent."""
        try:
            if self.locks is not None:
                self.locks.close(close_client=self._owns_client)
        finally:
            if self.registrations is not None:
                self.registrations.close(restore=restore)

    def _groups(self, role: str) -> list[str]:
        roles = ROLES.get(role) if isinstance(role, str) else None
        if roles is None:
            raise InvalidArgumentError(f"unknown role {role!r}: one of {sorted(ROLES)}")
        if self.locks is None:
            return []
        return [self.groups[r] for r in roles]


def _single_role(role: str) -> str:
    if role not in (TRAINER, SAMPLER):
        raise InvalidArgumentError(f"unknown role {role!r}: trainer or sampler")
    return role


TimesliceCallback = TimeSliceSlimeCallback
"""The v1alpha1 integration's name, for drivers configured with it."""
