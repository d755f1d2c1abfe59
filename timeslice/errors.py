"""The exceptions of timeslice, and their mapping to and from gRPC statuses.

Domain code raises these; the servicers turn them into `GRPCError` with
`to_grpc_error`, and the clients turn a `GRPCError` back into the same class
with `from_grpc_error`. Nothing else in the package translates errors.
"""

from __future__ import annotations

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from timeslice.api.bounds import cap


class TimeSliceError(Exception):
    """Base of every error timeslice raises."""

    status: Status = Status.UNKNOWN

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message


class InvalidArgumentError(TimeSliceError, ValueError):
    """The request is malformed or names something invalid (an empty id, say)."""

    status = Status.INVALID_ARGUMENT


class NotFoundError(TimeSliceError, LookupError):
    """The group, job, lease or operation named does not exist."""

    status = Status.NOT_FOUND


class AlreadyExistsError(TimeSliceError):
    """The thing to create exists already."""

    status = Status.ALREADY_EXISTS


class PermissionDeniedError(TimeSliceError, PermissionError):
    """The caller may not do this."""

    status = Status.PERMISSION_DENIED


class ConflictError(TimeSliceError):
    """The request conflicts with the current state."""

    status = Status.FAILED_PRECONDITION


class NotHolderError(ConflictError):
    """The job does not hold the lock it tried to use (a `Yield` by a non-holder)."""

    status = Status.FAILED_PRECONDITION


class LeaseLostError(ConflictError):
    """The caller's grant is no longer current: its lease expired, was revoked, or
    its fencing token is stale."""

    status = Status.ABORTED


class ResourceExhaustedError(TimeSliceError):
    """A limit was reached: a message too large, too many waiters."""

    status = Status.RESOURCE_EXHAUSTED


class DeadlineExceededError(TimeSliceError, TimeoutError):
    """A wait limit or the call's deadline ran out (an `Acquire` not granted in time)."""

    status = Status.DEADLINE_EXCEEDED


class UnavailableError(TimeSliceError, ConnectionError):
    """The server cannot be reached, or is shutting down."""

    status = Status.UNAVAILABLE


class CancelledError(TimeSliceError):
    """The call was cancelled."""

    status = Status.CANCELLED


class UnimplementedError(TimeSliceError, NotImplementedError):
    """The server does not know this call (an older server, or a v1alpha1 one)."""

    status = Status.UNIMPLEMENTED


class InternalError(TimeSliceError):
    """The server failed in a way it did not expect."""

    status = Status.INTERNAL


# The class a client raises for each status. Statuses not listed map to the base.
_BY_STATUS: dict[Status, type[TimeSliceError]] = {
    Status.INVALID_ARGUMENT: InvalidArgumentError,
    Status.OUT_OF_RANGE: InvalidArgumentError,
    Status.NOT_FOUND: NotFoundError,
    Status.ALREADY_EXISTS: AlreadyExistsError,
    Status.PERMISSION_DENIED: PermissionDeniedError,
    Status.UNAUTHENTICATED: PermissionDeniedError,
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
    return GRPCError(error.status, cap(error.message or type(error).__name__))


def from_grpc_error(
    error: GRPCError, conflict: type[ConflictError] = ConflictError
) -> TimeSliceError:
    """The timeslice exception a client raises for a `GRPCError`; `conflict` is the
    class for FAILED_PRECONDITION (the orchestrator's client says `NotHolderError`)."""
    if error.status is Status.FAILED_PRECONDITION:
        cls: type[TimeSliceError] = conflict
    else:
        cls = _BY_STATUS.get(error.status, TimeSliceError)
    result = cls(error.message or error.status.name)
    result.status = error.status
    return result


# The names the v1alpha1 Python client raises, so that code written for it keeps
# catching the same errors.
OrchestratorError = TimeSliceError
OrchestratorConnectionError = UnavailableError
OrchestratorTimeoutError = DeadlineExceededError
OrchestratorInvalidArgumentError = InvalidArgumentError
OrchestratorInternalError = InternalError


class JournalError(TimeSliceError):
    """A journal (the orchestrator's, or the job table an agent saves) cannot be opened
    or written: not an SQLite file, another application's database, a newer schema,
    a full disk. The message is one line that says what to fix."""

    status = Status.FAILED_PRECONDITION


class JournalInUseError(JournalError):
    """Another orchestrator writes this journal; the message names it."""


class JournalClaimLostError(JournalError):
    """The journal's writer lost its claim (the connection that held it went away):
    another orchestrator may write the journal now, so this one must stop."""

    status = Status.UNAVAILABLE
