"""Errors across the wire: a domain error becomes a `GRPCError` in the servicers
(`to_grpc_error`), and a `GRPCError` becomes the same timeslice exception in the
clients (`from_grpc_error`). Nothing else in the package translates errors."""

from __future__ import annotations

from typing import Final

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from timeslice.api.bounds import cap
from timeslice.errors import (
    AlreadyExistsError,
    CancelledError,
    Code,
    ConflictError,
    DeadlineExceededError,
    InternalError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    TimeSliceError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
)

# The class a client raises for each status. Statuses not listed map to the base.
_BY_STATUS: Final[dict[Status, type[TimeSliceError]]] = {
    Status.INVALID_ARGUMENT: InvalidArgumentError,
    Status.OUT_OF_RANGE: InvalidArgumentError,
    Status.NOT_FOUND: NotFoundError,
    Status.ALREADY_EXISTS: AlreadyExistsError,
    Status.PERMISSION_DENIED: PermissionDeniedError,
    Status.UNAUTHENTICATED: UnauthenticatedError,
    Status.FAILED_PRECONDITION: ConflictError,
    Status.ABORTED: LeaseLostError,
    Status.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    Status.DEADLINE_EXCEEDED: DeadlineExceededError,
    Status.UNAVAILABLE: UnavailableError,
    Status.CANCELLED: CancelledError,
    Status.UNIMPLEMENTED: UnimplementedError,
    Status.INTERNAL: InternalError,
    Status.DATA_LOSS: InternalError,
    Status.UNKNOWN: InternalError,
}


def to_grpc_error(error: TimeSliceError) -> GRPCError:
    """The `GRPCError` a servicer raises for a domain error, its message capped
    (see `timeslice.api.bounds`)."""
    return GRPCError(Status(error.code.value), cap(error.message or type(error).__name__))


def from_grpc_error(
    error: GRPCError,
    conflict: type[ConflictError] = ConflictError,
    denied: type[TimeSliceError] = PermissionDeniedError,
) -> TimeSliceError:
    """The timeslice exception a client raises for a `GRPCError`; `conflict` is the
    class for FAILED_PRECONDITION (the orchestrator's client says `NotHolderError`),
    `denied` the one for PERMISSION_DENIED (a Yield by a non-holder: `NotHolderError`).
    The exception's `code` is the status received."""
    if error.status is Status.FAILED_PRECONDITION:
        cls: type[TimeSliceError] = conflict
    elif error.status is Status.PERMISSION_DENIED:
        cls = denied
    else:
        cls = _BY_STATUS.get(error.status, TimeSliceError)
    result = cls(error.message or error.status.name)
    result.code = Code(error.status.value)
    return result
