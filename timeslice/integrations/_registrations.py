"""A job's workloads registered with its node's agent, one per group, for plugins
whose training loop is synchronous."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from timeslice.client.workload import WorkloadHandle, register_workload_in_thread
from timeslice.errors import AlreadyExistsError, InvalidArgumentError
from timeslice.ids import check_id, parse_target

log = logging.getLogger("timeslice.integrations")

SAVED = "SAVED"

Register = Callable[..., WorkloadHandle]


class Registrations:
    """The workloads one job registered with its node's agent, by group.

    Each is served by a thread of its own (`register_workload_in_thread`), so
    that the agent's snapshot and restore commands run while the training
    thread computes or waits.
    """

    def __init__(
        self,
        agent: str,
        job_id: str,
        *,
        connect_timeout_sec: float = 30.0,
        register: Register = register_workload_in_thread,
    ) -> None:
        parse_target(agent)
        check_id("job_id", job_id)
        if not connect_timeout_sec >= 0:
            raise InvalidArgumentError(
                f"connect_timeout_sec must not be negative: {connect_timeout_sec}"
            )
        self.agent = agent
        self.job_id = job_id
        self._connect_timeout_sec = connect_timeout_sec
        self._register = register
        self._handles: dict[str, tuple[object, WorkloadHandle]] = {}
        self._owned: set[str] = set()  # groups whose workload was made here, closed at the end

    def __contains__(self, group: str) -> bool:
        return group in self._handles

    def workload(self, group: str) -> object | None:
        """The workload registered for the group, if any."""
        entry = self._handles.get(group)
        return entry[0] if entry is not None else None

    def add(self, group: str, workload: object, *, owned: bool = False) -> WorkloadHandle:
        """Registers ``workload`` as the job's context in ``group``; blocks until the
        agent has it. `AlreadyExistsError` if the group has one already. An
        ``owned`` workload is closed when its registration ends."""
        check_id("group", group)
        if group in self._handles:
            raise AlreadyExistsError(
                f"job {self.job_id!r} already registered a workload in group {group!r}"
            )
        handle = self._register(
            self.agent,
            self.job_id,
            group,
            workload=workload,
            connect_timeout_sec=self._connect_timeout_sec,
        )
        self._handles[group] = (workload, handle)
        if owned:
            self._owned.add(group)
        return handle

    def remove(self, group: str, *, restore: bool = True) -> None:
        """Ends the group's registration. With ``restore``, a workload the agent left
        switched out is brought back, so that the process may use it again
        (outside the group's turns: the caller decides); an owned one is then
        closed, unless it is still out."""
        entry = self._handles.pop(group, None)
        if entry is None:
            return
        workload, handle = entry
        owned = group in self._owned
        self._owned.discard(group)
        handle.close()  # a command under way is finished first
        if restore and _state(workload) == SAVED:
            restore_fn = getattr(workload, "restore", None)
            if callable(restore_fn):
                restore_fn([])  # no tags: everything
        if owned and _state(workload) != SAVED:
            close = getattr(workload, "close", None)
            if callable(close):
                close()  # its guards come off the model (a saved one keeps them)

    def close(self, *, restore: bool = True) -> None:
        """Ends every registration (see `remove`). Idempotent."""
        for group in list(self._handles):
            try:
                self.remove(group, restore=restore)
            except Exception:
                log.exception("job %s: ending the registration in %s failed", self.job_id, group)


def _state(workload: Any) -> str | None:
    state = getattr(workload, "state", None)
    return state if isinstance(state, str) else None
