"""The orchestrator's decision log: one line per decision of the lock table.

Derived in one place from what the table already answers: `DecisionLog.observe`
sees each event with its effects once they are durable (the engine calls it
right after acting on them) and writes a line per decision, with the fields of
`timeslice.logs.decision_fields` (`decision`, `group`, `job`, `token`, `node`)
and those of its kind:

- `grant`: `waited_s`, `restored`, `lease_ttl_s`, `switch_bytes`;
- `switch` (a switch of contexts ended): `outcome` (ok, failed), `error`,
  `seconds` (decision to end), `queued_s` (the job's wait before the switch
  began), `snapshot_s`, `restore_s`, `overhead_s` (control: no agent working on
  it), `bytes` moved, `restored`, `saved` (the jobs snapshotted), `previous`;
- `yield`: `pending_waiters`, `next_job`, `snapshot_deferred`;
- `revoke`: `reason` (as the wire spells it: lease expired, hold limit reached,
  released by operator, ...), `detail`;
- `yield-requested`: `revoke_at`; `quarantine`: `reason`; `reset`;
  `left-queue`: `reason`, `detail`.

The table itself logs nothing (it stays pure); the agents in session are logged
by `agent_joined` and `agent_lost`, called where sessions begin and end. A group
decision's `node` names the group's nodes, comma-separated.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from timeslice.logs import decision_fields
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.events import Effect, Event, Reason

log = logging.getLogger("timeslice.decisions")

#: Revocations that are routine, not a warning: a grant nobody took back.
_QUIET_REVOCATIONS = frozenset({Reason.NOT_DELIVERED})


def switch_parts(done: ev.SwitchDone, decided: float) -> dict[str, float]:
    """A switch's parts, in seconds: each node's snapshots run at once, then its
    restore, and the nodes work in parallel (a phase lasts as long as its slowest
    node); the control overhead is the rest of the switch, from the decision
    (`decided`) to its end."""
    snapshots: dict[str, float] = {}
    restore = 0.0
    for _node, job, kind, seconds, _moved in done.steps:
        if kind == "snapshot":
            snapshots[job] = max(snapshots.get(job, 0.0), seconds)
        elif kind == "restore":
            restore = max(restore, seconds)
    snapshot = max(snapshots.values(), default=0.0)
    start = min(decided, done.began) if done.began else decided
    total = max(0.0, done.now - start)
    return {
        "seconds": total,
        "snapshot_s": snapshot,
        "restore_s": restore,
        "overhead_s": max(0.0, total - snapshot - restore),
    }


class DecisionLog:
    """Writes the decision lines of the events the orchestrator handles.
    `nodes(group)`: the nodes a group spans now."""

    def __init__(self, nodes: Callable[[str], Sequence[str]]) -> None:
        self._nodes = nodes
        # group -> (token, when it was decided, the live job then) of the switch under
        # way: at most one per group.
        self._switches: dict[str, tuple[int, float, str]] = {}

    def observe(self, event: Event, effects: Sequence[Effect]) -> None:
        """Log the decisions `event` made (its `effects`, now durable)."""
        for effect in effects:
            if isinstance(effect, ev.SwitchStarted):
                self._switches[effect.group] = (effect.token, event.now, effect.previous)
        # The warnings are the highest lines here: below that level nothing is written.
        if not effects or not log.isEnabledFor(logging.WARNING):
            return
        switch = self._switch(event) if isinstance(event, ev.SwitchDone) else None
        info = log.isEnabledFor(logging.INFO)
        for effect in effects:
            self._line(effect, switch, info)

    def _switch(self, done: ev.SwitchDone) -> dict[str, Any] | None:
        started = self._switches.get(done.group)
        if started is None or started[0] != done.token:
            return None
        del self._switches[done.group]
        _, decided, previous = started
        parts = switch_parts(done, decided)
        return {
            **parts,
            "bytes": done.moved_bytes,
            "restored": done.restored,
            "saved": sorted({job for _n, job, kind, _s, _b in done.steps if kind == "snapshot"}),
            "previous": previous,
            "error": done.error,
        }

    def _fields(
        self, decision: str, group: str, job: str, token: int | None, **more: Any
    ) -> dict[str, Any]:
        return decision_fields(
            decision, group=group, job=job, token=token, node=",".join(self._nodes(group)), **more
        )

    def _line(self, effect: Effect, switch: dict[str, Any] | None, info: bool) -> None:
        """The line of `effect` (`switch`: the parts of the switch it ends; `info`:
        whether INFO lines are written)."""
        if isinstance(effect, ev.Granted | ev.Revoked) and switch is not None:
            granted = effect if isinstance(effect, ev.Granted) else None
            if info or granted is None:
                self._switch_line(effect.group, effect.job, effect.token, switch, granted)
        if not info and not isinstance(effect, ev.Revoked | ev.Quarantined):
            return
        match effect:
            case ev.Granted(must_deliver=False):
                pass  # a holder asked again for the grant it has: no new decision
            case ev.Granted():
                fields = self._fields(
                    "grant",
                    effect.group,
                    effect.job,
                    effect.token,
                    waited_s=effect.waited,
                    restored=effect.context_restored,
                    lease_ttl_s=effect.lease.ttl or None,
                    switch_bytes=effect.switch_bytes,
                )
                log.info(
                    "grant: %s holds %s (token %d, waited %.3f s%s)",
                    effect.job,
                    effect.group,
                    effect.token,
                    effect.waited,
                    ", context restored" if effect.context_restored else "",
                    extra=fields,
                )
            case ev.Yielded(again=False):
                fields = self._fields(
                    "yield",
                    effect.group,
                    effect.job,
                    effect.token,
                    pending_waiters=effect.pending_waiters,
                    next_job=effect.next_job,
                    snapshot_deferred=effect.snapshot_deferred,
                )
                log.info(
                    "yield: %s released %s (token %d; next %s)",
                    effect.job,
                    effect.group,
                    effect.token,
                    effect.next_job or "nobody",
                    extra=fields,
                )
            case ev.Revoked():
                fields = self._fields(
                    "revoke",
                    effect.group,
                    effect.job,
                    effect.token,
                    reason=str(effect.reason),
                    detail=effect.detail,
                )
                level = logging.INFO if effect.reason in _QUIET_REVOCATIONS else logging.WARNING
                log.log(
                    level,
                    "revoke: %s lost %s (token %d): %s",
                    effect.job,
                    effect.group,
                    effect.token,
                    effect.why,
                    extra=fields,
                )
            case ev.YieldRequested():
                fields = self._fields(
                    "yield-requested",
                    effect.group,
                    effect.job,
                    effect.token,
                    revoke_at=effect.revoke_at,
                )
                log.info(
                    "yield-requested: %s reached its hold limit on %s (token %d)",
                    effect.job,
                    effect.group,
                    effect.token,
                    extra=fields,
                )
            case ev.Quarantined():
                fields = self._fields(
                    "quarantine", effect.group, effect.job, None, reason=effect.reason
                )
                log.warning(
                    "quarantine: %s may not hold %s until reset: %s",
                    effect.job,
                    effect.group,
                    effect.reason,
                    extra=fields,
                )
            case ev.JobReset():
                fields = self._fields("reset", effect.group, effect.job, None)
                log.info("reset: %s may hold %s again", effect.job, effect.group, extra=fields)
            case ev.LeftQueue():
                fields = self._fields(
                    "left-queue",
                    effect.group,
                    effect.job,
                    None,
                    reason=str(effect.reason),
                    detail=effect.detail,
                )
                log.info(
                    "left-queue: %s no longer waits for %s: %s",
                    effect.job,
                    effect.group,
                    effect.why,
                    extra=fields,
                )
            case ev.Queued() | ev.SwitchStarted() | ev.Superseded() | ev.LeaseRenewed():
                pass  # steps on the way to a decision above, or a lease's renewal
            case _:
                raise TypeError(f"not an effect: {effect!r}")

    def _switch_line(
        self,
        group: str,
        job: str,
        token: int,
        switch: dict[str, Any],
        granted: ev.Granted | None,
    ) -> None:
        total = switch["seconds"]
        queued = max(0.0, granted.waited - total) if granted is not None else None
        error = str(switch["error"] or ("" if granted is not None else "the switch failed"))
        fields = self._fields(
            "switch",
            group,
            job,
            token,
            outcome="ok" if granted is not None else "failed",
            queued_s=queued,
            **{**switch, "error": error},
        )
        log.log(
            logging.INFO if granted is not None else logging.WARNING,
            "switch: %s to %s in %.3f s (snapshot %.3f s, restore %.3f s, overhead %.3f s,"
            " %d bytes)%s",
            group,
            job,
            total,
            switch["snapshot_s"],
            switch["restore_s"],
            switch["overhead_s"],
            switch["bytes"],
            f": failed: {error}" if error else "",
            extra=fields,
        )


def agent_joined(node: str, address: str) -> None:
    """An agent's session began (or a newer one of the same node took over)."""
    fields = decision_fields("agent-joined", node=node, address=address)
    log.info("agent-joined: %s at %s", node, address, extra=fields)


def agent_lost(node: str, address: str, closed: bool = False) -> None:
    """An agent's session ended: `closed` by either side (an agent stopping, the
    orchestrator closing: INFO), or else broken off (WARNING)."""
    fields = decision_fields("agent-lost", node=node, address=address, closed=closed)
    how = "its session was closed" if closed else "its session broke off"
    log.log(
        logging.INFO if closed else logging.WARNING,
        "agent-lost: %s at %s: %s",
        node,
        address,
        how,
        extra=fields,
    )
