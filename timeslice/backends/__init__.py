"""Backends: what moves a job's accelerator context to host memory and back.

Every backend is a small class behind the `Backend` protocol, found by name in
the `timeslice.backends` entry-point group, so that a package of its own can add
one. Built in: `noop` (moves nothing, for tests and control-plane benchmarks),
`app_channel` (the workload does its own offload, told over the agent's
workload channel), `app_endpoint` (vLLM and SGLang servers through their HTTP
sleep APIs) and `cuda` (the CUDA driver's process checkpoint API).

A job's backend config is a JSON-ready dict that the backend checks itself
(`check`); an operation's own parameters (suspend mode, region tags) come with
each call.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, cast, runtime_checkable

from timeslice.agent.channels import WorkloadChannels
from timeslice.agent.pipeline import Pace
from timeslice.errors import ConflictError, InvalidArgumentError
from timeslice.kinds import SuspendMode

ENTRY_POINT_GROUP: Final = "timeslice.backends"

# Suspend modes, as backends and workloads name them.
OFFLOAD: Final[str] = SuspendMode.OFFLOAD.value
DISCARD: Final[str] = SuspendMode.DISCARD.value


@dataclass(frozen=True)
class JobRef:
    """Which job an operation is for, and its backend config."""

    group: str
    job: str
    config: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Moved:
    """What an operation moved, as measured; None where the backend cannot know."""

    storage_bytes: int | None = None
    device_bytes: int | None = None


@dataclass(frozen=True)
class AcceleratorMemory:
    """One accelerator's memory, as the node reports it."""

    id: str
    used_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class BackendContext:
    """What the agent lends its backends."""

    node_name: str
    channels: WorkloadChannels
    options: Mapping[str, str] = field(default_factory=dict)
    # URL prefixes beyond this node's loopback that backends may call (see
    # `timeslice.backends.endpoints`).
    allowed_urls: tuple[str, ...] = ()
    # Where the node's cgroups are mounted: the `cuda` backend finds a pod's
    # processes there (see `timeslice.backends._cgroups`).
    cgroup_root: str = "/sys/fs/cgroup"


@runtime_checkable
class Backend(Protocol):
    """Moves one job's accelerator context out to host memory and back."""

    name: str

    async def check(self, job: JobRef) -> tuple[str, ...]:
        """Refuse a config this backend cannot act on; return the resources it claims."""
        ...

    async def check_operation(self, job: JobRef, kind: str, params: Mapping[str, Any]) -> None:
        """Refuse an operation's parameters (mode, tags) before it starts."""
        ...

    async def snapshot(self, job: JobRef, params: Mapping[str, Any]) -> Moved:
        """Move the job's context off the accelerators."""
        ...

    async def restore(self, job: JobRef, params: Mapping[str, Any]) -> Moved:
        """Bring the job's context back onto the accelerators."""
        ...

    async def state(self, job: JobRef) -> str | None:
        """Where the job's context is now: "RUNNING", "SAVED", or None if unknown."""
        ...

    async def accelerators(self) -> list[AcceleratorMemory]:
        """Memory of the accelerators this backend can see (none, if it sees none)."""
        ...

    async def close(self) -> None:
        """Release what the backend holds."""
        ...


class Pipelined(Protocol):
    """A backend that can move a job's context step by step, so that a switch's
    restore runs while its snapshots are still under way (see
    `timeslice.agent.pipeline`)."""

    def pipelines(self, job: JobRef) -> bool:
        """Whether the job's saved context can come back step by step now, each step
        once `Pace` lets its bytes in."""
        ...

    async def snapshot_paced(self, job: JobRef, params: Mapping[str, Any], pace: Pace) -> Moved:
        """`snapshot`, telling `pace` the accelerator memory each step frees."""
        ...

    async def restore_paced(self, job: JobRef, params: Mapping[str, Any], pace: Pace) -> Moved:
        """`restore`, each step once `pace` lets it in."""
        ...


_PIPELINED: Final = ("pipelines", "snapshot_paced", "restore_paced")


def pipelined(backend: Backend) -> Pipelined | None:
    """`backend` as a `Pipelined` one, or None if it is not one."""
    return cast(Pipelined, backend) if _pipelines(type(backend)) else None


@functools.cache
def _pipelines(kind: type) -> bool:
    # A runtime-checkable protocol's isinstance reads every attribute it names:
    # asked once per class, not on every operation.
    return all(callable(getattr(kind, name, None)) for name in _PIPELINED)


BackendFactory = Callable[[BackendContext], Backend]

# Extras that bring what a built-in backend imports.
_EXTRAS: Final = {"cuda": "cuda"}


def known_backends() -> dict[str, importlib.metadata.EntryPoint]:
    """Every installed backend, by name."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def load_backend(name: str) -> BackendFactory:
    """The factory of backend `name`; a clear error if it is unknown or cannot load."""
    known = known_backends()
    entry = known.get(name)
    if entry is None:
        raise InvalidArgumentError(
            f"unknown backend {name!r}; installed: {', '.join(sorted(known)) or 'none'}"
        )
    try:
        factory: BackendFactory = entry.load()
    except ImportError as exc:
        extra = _EXTRAS.get(name)
        hint = f": pip install 'timeslice[{extra}]'" if extra else ""
        raise ConflictError(f"backend {name!r} cannot be loaded ({exc}){hint}") from exc
    return factory


def parse_mode(name: str) -> str:
    """A suspend mode's name, checked."""
    if name not in (OFFLOAD, DISCARD):
        raise InvalidArgumentError(f"unknown suspend mode {name!r}; expected offload or discard")
    return name
