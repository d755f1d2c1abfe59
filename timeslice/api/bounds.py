"""How large and of what characters each thing a caller sends may be.

Both services check every request against these bounds once, as it is decoded
(`timeslice.api.wire.decode_strict`), before any code of theirs sees it, and
no status message carries more than `MAX_STATUS_BYTES` of text: grpclib
encodes a `grpc-message` in time quadratic in its length, so one long id
echoed into an error would hold a server's event loop for minutes.

Standard library only: the pure tables use it too.
"""

from __future__ import annotations

import unicodedata
from typing import Final

# Ids and names: job, group, node, lease, operation, request, command, tag...
MAX_ID_BYTES: Final = 256
# Free text a caller may send: a force-release reason, a workload's error.
MAX_TEXT_BYTES: Final = 1024
# What a status message carries at most.
MAX_STATUS_BYTES: Final = 1024
# Items of a repeated field, unless the field is named below.
MAX_ITEMS: Final = 256
MAX_ITEMS_BY_FIELD: Final[dict[str, int]] = {
    "pids": 4096,
    "regions": 4096,
    "jobs": 4096,  # an agent's jobs in its report, a switch's jobs on a node
    # An agent's answers about its jobs, as many as it may hold (AgentConfig.max_jobs).
    "job_statuses": 4096,
    "steps": 4096,
    "faulted": 4096,
}
# Fencing tokens are uint64 on the wire; none beyond int64 is ever issued.
MAX_FENCING_TOKEN: Final = 2**63 - 1
# Orchestrator epochs too (one per start or takeover of a journal).
MAX_ORCHESTRATOR_EPOCH: Final = 2**63 - 1
# Fields of free text; every other string field is an id or a name.
TEXT_FIELDS: Final = frozenset({"reason", "fault", "error", "endpoints", "address"})

# Control characters (Cc) and format characters (Cf: bidirectional overrides,
# zero-width marks) have no place in a name, and make logs lie.
_FORBIDDEN_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs"})


def id_problem(value: str) -> str | None:
    """Why `value` cannot be an id (without repeating it), or None if it can."""
    if len(value) > MAX_ID_BYTES or len(value.encode()) > MAX_ID_BYTES:
        return f"is longer than {MAX_ID_BYTES} bytes"
    if not value.isascii() or not value.isprintable():
        if any(unicodedata.category(c) in _FORBIDDEN_CATEGORIES for c in value):
            return "contains control or format characters"
    return None


def text_problem(value: str) -> str | None:
    """Why `value` cannot be free text, or None if it can."""
    if len(value) > MAX_TEXT_BYTES or len(value.encode()) > MAX_TEXT_BYTES:
        return f"is longer than {MAX_TEXT_BYTES} bytes"
    return None


def cap(text: str, limit: int = MAX_STATUS_BYTES) -> str:
    """`text`, cut to at most `limit` bytes of UTF-8 (ending in "...")."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode(errors="ignore") + "..."
