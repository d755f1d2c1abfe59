"""A veRL trainer plugin: the job holds its accelerators for sampling and for the
weight update, and yields them in between (reward, advantages, data work), through
veRL's own trainer hooks instead of a fork of its trainer.

    plugin = TimeSliceVerlPlugin("ppo-1", groups=["gpus"], orchestrator=ORCH)
    # the trainer calls, every step:
    plugin.on_sample_begin(step);         batch = rollout.generate(prompts)
    plugin.on_sample_end(step);           rewards = reward_fn(batch)      # CPU
    plugin.on_weight_update_begin(step);  actor.update(batch, rewards)
    plugin.on_weight_update_end(step)
    ...
    plugin.close()

The hook contract this plugin assumes (veRL cannot be installed on the CPU
machines that test this package, so it is tested against this contract with a
loop that calls the hooks in this order, not against veRL itself):

- The driver (veRL's single controller) calls the four hooks from one thread.
- ``on_sample_begin(step)`` comes before the rollout engine is woken for the
  step (and the new weights are synced into it); ``on_sample_end(step)`` after
  the generated batch is back and the engine is put to sleep again.
- ``on_weight_update_begin(step)`` comes before the first accelerator work on
  the batch by the actor, critic or reference model (log-probabilities, values,
  the updates); ``on_weight_update_end(step)`` after the last of it.
- Each begin is followed by its end. An asynchronous (one-step off-policy)
  trainer begins the next step's sample before this step's weight update, and
  the phases overlap: the end of one leaves the groups the other needs held.
- Extra positional and keyword arguments (veRL passes the step's metrics or
  batch) are accepted and ignored.

Groups: one group for both phases (``groups``: veRL's colocated hybrid engine,
rollout and training on the same accelerators), or a group (or several) per
phase (``sample_groups``, ``update_groups``: split placement). A phase's groups
are acquired together in one atomic call, and the job never waits while it
holds a group. Colocated, overlapping phases share their group and wait for
nothing. Split and asynchronous, the second phase would wait for its pool
while the first holds the other: pass ``overlap=True``, and each phase
acquires both phases' groups at once (an asynchronous trainer uses both pools
all the time anyway); without it, such an overlap raises `ConflictError`.

Workloads: in a veRL deployment each worker process registers its own state
with its node's agent (``register_workload_in_thread(agent, job, group,
workload=TorchWorkload(...))``, or the `cuda` backend by pid). For a trainer
whose state lives in the driver's own process, pass ``agent`` and
``workloads`` (group -> workload) and the plugin registers them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from timeslice.client.orchestrator import DEFAULT_TARGET
from timeslice.errors import InvalidArgumentError
from timeslice.ids import check_id
from timeslice.integrations._locks import LockClient, check_groups, connect
from timeslice.integrations._registrations import Registrations

log = logging.getLogger("timeslice.integrations")

SAMPLE = "sample"
WEIGHT_UPDATE = "weight_update"


class TimeSliceVerlPlugin:
    """The four veRL trainer hooks, each acquiring or yielding its phase's groups.

    ``groups`` names the groups of both phases, or ``sample_groups`` and
    ``update_groups`` each phase's; with ``overlap``, each phase holds them all
    (phases that overlap on split groups). ``client`` replaces the connection to
    ``orchestrator`` (and is not closed by the plugin). ``agent`` and
    ``workloads`` register workloads of this process, one per group.
    ``lease_ttl_sec`` and ``acquire_timeout_sec`` are the client's lease and the
    longest wait for a turn.
    """

    def __init__(
        self,
        job_id: str,
        groups: Sequence[str] | None = None,
        *,
        sample_groups: Sequence[str] | None = None,
        update_groups: Sequence[str] | None = None,
        overlap: bool = False,
        orchestrator: str = DEFAULT_TARGET,
        client: LockClient | None = None,
        agent: str | None = None,
        workloads: Mapping[str, object] | None = None,
        lease_ttl_sec: float | None = 10.0,
        acquire_timeout_sec: float | None = None,
        connect_timeout_sec: float = 30.0,
    ) -> None:
        check_id("job_id", job_id)
        sample = sample_groups if sample_groups is not None else groups
        update = update_groups if update_groups is not None else groups
        if sample is None or update is None:
            raise InvalidArgumentError(
                "name the groups: groups=[...] for both phases, or sample_groups and update_groups"
            )
        self.sample_groups = check_groups(sample)
        self.update_groups = check_groups(update)
        every = tuple(dict.fromkeys((*self.sample_groups, *self.update_groups)))
        if overlap:
            self.sample_groups = self.update_groups = every
        if workloads and agent is None:
            raise InvalidArgumentError("workloads need the agent's address (agent=...)")
        self.job_id = job_id
        registrations = (
            Registrations(agent, job_id, connect_timeout_sec=connect_timeout_sec)
            if agent is not None
            else None
        )
        for group in workloads or {}:
            if group not in every:
                raise InvalidArgumentError(
                    f"workload for group {group!r}, which no phase names ({list(every)})"
                )
        self.locks, self._owns_client = connect(
            job_id=job_id,
            client=client,
            orchestrator=orchestrator,
            lease_ttl_sec=lease_ttl_sec,
            acquire_timeout_sec=acquire_timeout_sec,
        )
        self.registrations = registrations
        try:
            for group, workload in (workloads or {}).items():
                assert registrations is not None
                registrations.add(group, workload)
        except BaseException:
            self.close()
            raise

    # --- veRL's trainer hooks ---------------------------------------------------------------

    def on_sample_begin(self, *args: object, **kwargs: object) -> None:
        """Before the rollout engine wakes for a step: holds the sample groups."""
        self.locks.begin(SAMPLE, self.sample_groups)

    def on_sample_end(self, *args: object, **kwargs: object) -> None:
        """After the generated batch is back: yields what the update does not hold."""
        self.locks.end(SAMPLE)

    def on_weight_update_begin(self, *args: object, **kwargs: object) -> None:
        """Before the actor, critic or reference model touch the batch: holds the
        update groups."""
        self.locks.begin(WEIGHT_UPDATE, self.update_groups)

    def on_weight_update_end(self, *args: object, **kwargs: object) -> None:
        """After the last update of the step: yields what a sample does not hold."""
        self.locks.end(WEIGHT_UPDATE)

    # --- lifecycle --------------------------------------------------------------------------

    def close(self, *, restore: bool = True) -> None:
        """Yields every group, ends the registrations (bringing their workloads back
        unless ``restore`` is false) and closes the client. Idempotent."""
        try:
            self.locks.close(close_client=self._owns_client)
        finally:
            if self.registrations is not None:
                self.registrations.close(restore=restore)
