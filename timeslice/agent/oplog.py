"""What the agent logs of its work: each snapshot and restore as it starts and
ends, and each workload channel as it opens and closes.

One line each, with the fields of `timeslice.logs.decision_fields` (`decision`,
`group`, `job`, `token`, `node`) and those of its kind:

- `operation` lines: `phase` (start, end), `kind` (snapshot, restore), `op_id`,
  `backend`; at the end `outcome` (ok, failed), `seconds`, `device_bytes`,
  `storage_bytes` and `error`;
- `channel` lines: `phase` (open, close), `owner`, `peer`, and at the close `reason`.

The job table stays pure: these are written where the engine acts on its effects
(`Run`, `Done`) and where channels attach and detach.
"""

from __future__ import annotations

import logging
from timeslice.agent.events import Operation, OpStatus
from timeslice.logs import decision_fields

log = logging.getLogger("timeslice.agent.operations")


def operation_started(op: Operation, node: str) -> None:
    """Operation `op` is handed to its backend."""
    if not log.isEnabledFor(logging.INFO):
        return
    fields = decision_fields(
        "operation",
        group=op.group,
        job=op.job,
        token=op.token,
        node=node,
        phase="start",
        kind=str(op.kind),
        op_id=op.op_id,
        backend=op.backend,
    )
    log.info(
        "%s of %s/%s started (%s, %s)",
        op.kind,
        op.group,
        op.job,
        op.backend,
        op.op_id,
        extra=fields,
    )


def operation_ended(op: Operation, node: str) -> None:
    """Operation `op` ended (done, failed, or past its deadline)."""
    ok = op.status is OpStatus.COMPLETE
    level = logging.INFO if ok else logging.WARNING
    if not log.isEnabledFor(level):
        return
    seconds = (op.finished - op.started) if op.finished is not None else None
    fields = decision_fields(
        "operation",
        group=op.group,
        job=op.job,
        token=op.token,
        node=node,
        phase="end",
        kind=str(op.kind),
        op_id=op.op_id,
        backend=op.backend,
        outcome="ok" if ok else "failed",
        seconds=seconds,
        device_bytes=op.device_bytes,
        storage_bytes=op.storage_bytes,
        error=op.error,
    )
    took = f" in {seconds:.3f} s" if seconds is not None else ""
    moved = f", {op.device_bytes} bytes" if op.device_bytes is not None else ""
    log.log(
        level,
        "%s of %s/%s %s%s (%s%s)%s",
        op.kind,
        op.group,
        op.job,
        "done" if ok else "failed",
        took,
        op.backend,
        moved,
        f": {op.error}" if op.error else "",
        extra=fields,
    )


def channel_opened(*, group: str, job: str, owner: str, peer: str, node: str) -> None:
    """A workload registered: its channel is open."""
    fields = decision_fields(
        "channel", group=group, job=job, node=node, phase="open", owner=owner, peer=peer
    )
    log.info(
        "workload channel of %s/%s opened by %s",
        group,
        job,
        owner or "an anonymous caller",
        extra=fields,
    )


def channel_closed(*, group: str, job: str, owner: str, peer: str, node: str, reason: str) -> None:
    """A workload's channel is gone (its stream ended, or a newer one replaced it)."""
    reason = reason or "its stream ended"
    fields = decision_fields(
        "channel",
        group=group,
        job=job,
        node=node,
        phase="close",
        owner=owner,
        peer=peer,
        reason=reason,
    )
    log.info("workload channel of %s/%s closed: %s", group, job, reason, extra=fields)
