"""The small vocabularies both services and the clients share: what moves a job's
context and how, and what a node sees of a job's workload. Standard library only."""

from __future__ import annotations

import enum


class OpKind(enum.StrEnum):
    """What an operation does to a job's context, named as on the wire."""

    SNAPSHOT = "snapshot"  # from the accelerators to host storage
    RESTORE = "restore"  # back onto the accelerators


class Liveness(enum.StrEnum):
    """What a node sees of a job's workload, named as on the wire."""

    UNKNOWN = ""  # nothing to watch, or a workload not back since the agent started
    ALIVE = "ALIVE"  # its channel is open, or one of its processes runs
    GONE = "GONE"  # every one of them ended


class SuspendMode(enum.StrEnum):
    """What a snapshot does with the memory it frees."""

    OFFLOAD = "offload"  # copied to host memory, restored as it was
    DISCARD = "discard"  # dropped; a restore brings it back empty
