"""The values the agent clients return, and the backend configurations they send.

The result classes keep the shape of the v1alpha1 Python client: statuses and
states are the proto names as strings (``"OPERATION_STATUS_COMPLETE"``,
``"JOB_STATE_SAVED"``, ``"SERVING"``), and what timeslice adds comes as fields
with defaults after the original ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

import betterproto2

from timeslice.api.gen.grpc.health import v1 as health_pb
from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
from timeslice.errors import InvalidArgumentError

E = TypeVar("E", bound=betterproto2.Enum)
Request = TypeVar("Request", pb.SnapshotRequest, pb.RestoreRequest)

OPERATION_PENDING: Final = "OPERATION_STATUS_PENDING"
OPERATION_COMPLETE: Final = "OPERATION_STATUS_COMPLETE"
OPERATION_FAILED: Final = "OPERATION_STATUS_FAILED"

# What `backend=` accepts: the deprecated Backend enum as a value, a member, or
# a name such as "cuda" or "BACKEND_CUDA".
BackendLike = str | int
# What `mode=` accepts: "offload", "discard", a SuspendMode name or value, or None.
SuspendModeLike = str | int | None


@dataclass(frozen=True)
class SnapshotResponse:
    """The answer to `snapshot()`: the operation to wait for."""

    operation_id: str


@dataclass(frozen=True)
class RestoreResponse:
    """The answer to `restore()`: the operation to wait for."""

    operation_id: str


@dataclass(frozen=True)
class HealthResponse:
    """The answer to `check_health()`: ``"SERVING"``, ``"NOT_SERVING"`` or ``"UNKNOWN"``."""

    status: str


@dataclass(frozen=True)
class GetOperationResponse:
    """A snapshot or restore operation: its status and, once finished, what it moved.

    ``storage_bytes`` and ``snapshot_device_bytes`` are set when it is COMPLETE,
    ``error`` when it FAILED. ``kind`` is ``"snapshot"`` or ``"restore"``;
    ``backend`` names the backend that ran it.
    """

    status: str
    elapsed_ms: int
    storage_bytes: int | None = None
    snapshot_device_bytes: int | None = None
    error: str | None = None
    job_id: str = ""
    group: str = ""
    kind: str = ""
    backend: str = ""

    @property
    def finished(self) -> bool:
        """Whether the operation is over: COMPLETE or FAILED."""
        return self.status in (OPERATION_COMPLETE, OPERATION_FAILED)


@dataclass(frozen=True)
class JobStatus:
    """One job on the node. ``fault`` says why it is FAULTED; ``operation_id`` is the
    operation running now, or the last one."""

    job_id: str
    state: str
    group: str = ""
    backend: str = ""
    fault: str = ""
    operation_id: str = ""
    # What the agent sees of the job's workload: "ALIVE", "GONE" or "UNSPECIFIED".
    liveness: str = "UNSPECIFIED"
    # Where its workload keeps an offloaded context, as it registered ("memory",
    # "file"); "" when not said, or with no workload channel open.
    store: str = ""


@dataclass(frozen=True)
class AcceleratorStatus:
    """One accelerator's memory."""

    id: str
    memory_used_bytes: int
    memory_total_bytes: int


@dataclass(frozen=True)
class StatusResponse:
    """The answer to `status()`: every job and accelerator of the node."""

    job_statuses: list[JobStatus]
    accelerator_statuses: list[AcceleratorStatus]
    node_name: str = ""
    # The agent's version ("" from an agent too old to say).
    version: str = ""


@dataclass(frozen=True)
class ResetJobResponse:
    """The answer to `reset_job()`: the job's state once its fault is cleared, and
    the version of the agent's job table that says so (0: an agent too old to say)."""

    state: str
    table_version: int = 0


# --- from the wire --------------------------------------------------------------------


def enum_name(value: betterproto2.Enum) -> str:
    """The proto name of an enum value; ``UNKNOWN(n)`` for one this client does not know."""
    # Not `value.proto_name`: a value unknown to the enum has none.
    names = type(value).betterproto_value_to_renamed_proto_names()
    return names.get(int(value)) or str(value)


def get_operation_response(message: pb.GetOperationResponse) -> GetOperationResponse:
    """A `GetOperationResponse` from the wire message."""
    return GetOperationResponse(
        status=enum_name(message.status),
        elapsed_ms=message.elapsed_ms,
        storage_bytes=message.storage_bytes,
        snapshot_device_bytes=message.snapshot_device_bytes,
        error=message.error,
        job_id=message.job_id,
        group=message.group,
        kind=message.kind,
        backend=message.backend,
    )


def status_response(message: pb.StatusResponse) -> StatusResponse:
    """A `StatusResponse` from the wire message."""
    return StatusResponse(
        job_statuses=[
            JobStatus(
                job_id=job.job_id,
                state=enum_name(job.state),
                group=job.group,
                backend=job.backend,
                fault=job.fault,
                operation_id=job.operation_id,
                liveness=enum_name(job.liveness).removeprefix("LIVENESS_"),
                store=job.store,
            )
            for job in message.job_statuses
        ],
        accelerator_statuses=[
            AcceleratorStatus(
                id=accelerator.id,
                memory_used_bytes=accelerator.memory_used_bytes,
                memory_total_bytes=accelerator.memory_total_bytes,
            )
            for accelerator in message.accelerator_statuses
        ],
        node_name=message.node_name,
        version=message.version,
    )


def health_response(message: health_pb.HealthCheckResponse) -> HealthResponse:
    """A `HealthResponse` from the wire message."""
    return HealthResponse(status=enum_name(message.status))


# --- to the wire ----------------------------------------------------------------------


def operation_request(
    cls: type[Request],
    job_id: str,
    group: str,
    backend: BackendLike,
    backend_config: pb.BackendConfig | None,
    fencing_token: int,
    timeout_sec: float | None,
) -> Request:
    """A Snapshot or Restore request, checked before it is sent."""
    if backend_config is not None and not isinstance(backend_config, pb.BackendConfig):
        # Such as the deprecated backend enum passed where it stood before backend_config.
        raise InvalidArgumentError(
            "backend_config must be a BackendConfig (see cuda_config, app_channel_config,"
            f" named_backend), not {type(backend_config).__name__}; pass backend= by name"
        )
    if isinstance(fencing_token, bool) or not isinstance(fencing_token, int):
        raise InvalidArgumentError(f"fencing_token must be an int: {fencing_token!r}")
    if not 0 <= fencing_token < 2**64:
        raise InvalidArgumentError(f"fencing_token must fit in 64 unsigned bits: {fencing_token}")
    if timeout_sec is not None and not timeout_sec > 0:
        raise InvalidArgumentError(f"timeout_sec must be positive: {timeout_sec}")
    request = cls(
        job_id=check_job_id(job_id),
        group=group,
        backend_config=backend_config,
        fencing_token=fencing_token,
        # Never rounded down to 0, which would mean "the agent's default".
        timeout_ms=None if timeout_sec is None else max(1, round(timeout_sec * 1000)),
    )
    value = backend_enum(backend)
    if backend_config is not None:
        # An agent that reads only the enum still learns that CUDA is meant.
        value = pb.Backend.CUDA if backend_config.cuda is not None else pb.Backend.UNSPECIFIED
    if value != pb.Backend.UNSPECIFIED:
        # Set after construction: the message warns when built with a deprecated field.
        request.backend = value
    return request


def check_job_id(job_id: str) -> str:
    """``job_id``, if it is a non-empty string."""
    if not isinstance(job_id, str) or not job_id:
        raise InvalidArgumentError(f"job_id must be a non-empty string: {job_id!r}")
    return job_id


def backend_enum(backend: BackendLike) -> pb.Backend:
    """The deprecated Backend enum from ``"cuda"``, ``"CUDA"``, ``"BACKEND_CUDA"`` or 1."""
    return _enum_value(pb.Backend, backend, "backend", "BACKEND_")


def cuda_config(pids: Sequence[int] | None = None) -> pb.BackendConfig:
    """The CUDA checkpoint backend, for the given processes.

    Without ``pids`` the agent finds the job's processes itself, where it can.
    """
    target = None if pids is None else pb.ProcessTarget(pids=_pids(pids))
    return pb.BackendConfig(cuda=pb.CudaBackendConfig(explicit_target=target))


def app_channel_config(
    mode: SuspendModeLike = None, tags: Sequence[str] | None = None
) -> pb.BackendConfig:
    """The backend that asks a workload registered on the agent's workload channel.

    ``mode``: ``"offload"`` (state kept in host memory), ``"discard"`` (the
    application provisions it again), or None for the workload's default.
    ``tags`` selects regions (``["weights", "kv_cache"]``); none: the default set.
    """
    return pb.BackendConfig(
        app_channel=pb.AppChannelConfig(mode=_suspend_mode(mode), tags=_tags(tags))
    )


def app_endpoint_config(
    app: str | int,
    endpoints: Sequence[str],
    mode: SuspendModeLike = None,
    tags: Sequence[str] | None = None,
) -> pb.BackendConfig:
    """The backend that calls an application's HTTP API to sleep and wake it.

    ``app``: ``"vllm"`` or ``"sglang"`` (or the App enum); ``endpoints``: base
    URLs such as ``"http://localhost:8000"``. ``mode`` and ``tags`` as in
    `app_channel_config`.
    """
    app_value = _enum_value(pb.App, app, "app", "APP_")
    if app_value == pb.App.UNSPECIFIED:
        raise InvalidArgumentError(f"app must be one of {_known(pb.App)}")
    if isinstance(endpoints, str):
        raise InvalidArgumentError("endpoints must be a list of URLs, not one string")
    urls = list(endpoints)
    if not urls or not all(isinstance(url, str) and url for url in urls):
        raise InvalidArgumentError(f"endpoints must be non-empty URLs: {urls!r}")
    return pb.BackendConfig(
        app_endpoint=pb.AppEndpointConfig(
            app=app_value, endpoints=urls, mode=_suspend_mode(mode), tags=_tags(tags)
        )
    )


def named_backend(name: str, **options: str) -> pb.BackendConfig:
    """A backend installed on the agent, found by name (``"noop"``, say), with its options."""
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"the backend name must be a non-empty string: {name!r}")
    for key, value in options.items():
        if not isinstance(value, str):
            raise InvalidArgumentError(
                f"backend option {key!r} must be a string, not {type(value).__name__}"
            )
    return pb.BackendConfig(named=pb.NamedBackendConfig(name=name, options=dict(options)))


def _pids(pids: Sequence[int]) -> list[int]:
    result = list(pids)
    if not result:
        raise InvalidArgumentError("at least one process id is required")
    for pid in result:
        if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < 2**31:
            raise InvalidArgumentError(f"a process id must be a positive int32: {pid!r}")
    return result


def _tags(tags: Sequence[str] | None) -> list[str]:
    if isinstance(tags, str):
        raise InvalidArgumentError("tags must be a list of strings, not one string")
    result = list(tags or ())
    if not all(isinstance(tag, str) and tag for tag in result):
        raise InvalidArgumentError(f"tags must be non-empty strings: {result!r}")
    return result


def _suspend_mode(mode: SuspendModeLike) -> pb.SuspendMode:
    if mode is None:
        return pb.SuspendMode.UNSPECIFIED
    return _enum_value(pb.SuspendMode, mode, "suspend mode", "SUSPEND_MODE_")


def _enum_value(cls: type[E], value: str | int, what: str, prefix: str) -> E:
    """A member of ``cls`` from its value, or its name with or without ``prefix``, in any case."""
    if isinstance(value, bool):
        raise InvalidArgumentError(f"unknown {what} {value!r}")
    if isinstance(value, int):
        if value in cls._value2member_map_:
            return cls(value)
    elif isinstance(value, str):
        name = value.strip().upper().removeprefix(prefix)
        if name in cls.__members__:
            return cls.__members__[name]
    raise InvalidArgumentError(f"unknown {what} {value!r}; expected one of {_known(cls)}")


def _known(cls: type[betterproto2.Enum]) -> list[str]:
    return [name.lower() for name in cls.__members__ if name != "UNSPECIFIED"]
