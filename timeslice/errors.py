"""The exceptions of timeslice, each with the gRPC status code it travels as.

Domain code raises these. Only the edges translate: the servicers turn them
into `GRPCError`s and the clients turn a `GRPCError` back into the same class
(`timeslice.api.status`). Standard library only: the pure tables raise them, and
importing this module loads no gRPC.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any


class Code(enum.IntEnum):
    """A gRPC status code, numbered as on the wire."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16

    # Equal to grpcio's `grpc.StatusCode` of the same number, so that code written for
    # the v1alpha1 client (`error.code == grpc.StatusCode.NOT_FOUND`) keeps working
    # without this module importing grpcio.
    def __eq__(self, other: object) -> bool:
        number = _grpcio_status_number(other)
        return int(self) == number if number is not None else int.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        number = _grpcio_status_number(other)
        return int(self) != number if number is not None else int.__ne__(self, other)

    def __hash__(self) -> int:
        return int.__hash__(self)


def _grpcio_status_number(value: object) -> int | None:
    """The number of a grpcio `StatusCode` member (its value is ``(number, name)``);
    None for anything else."""
    if type(value).__name__ != "StatusCode" or isinstance(value, int):
        return None
    number = getattr(value, "value", None)
    if isinstance(number, tuple) and number and isinstance(number[0], int):
        return number[0]
    return None


def as_code(value: Code | int | object) -> Code:
    """A `Code` from a `Code`, its number, or a grpcio `StatusCode`."""
    if isinstance(value, int):
        return Code(value)
    number = _grpcio_status_number(value)
    if number is None:
        raise ValueError(f"not a gRPC status code: {value!r}")
    return Code(number)


class _GrpcStatus:
    """`error.status`: grpclib's `Status` for the error's `code`. grpclib is imported
    when this is first read, by code that speaks gRPC already."""

    def __get__(self, obj: Any, owner: type[TimeSliceError]) -> Status:
        from grpclib.const import Status

        return Status((owner if obj is None else obj).code.value)


if TYPE_CHECKING:
    from grpclib.const import Status


class TimeSliceError(Exception):
    """Base of every error timeslice raises."""

    code: Code = Code.UNKNOWN
    status = _GrpcStatus()

    def __init__(
        self, message: str = "", code: Code | int | object = None, details: str | None = None
    ) -> None:
        """``code`` and ``details`` as the v1alpha1 client's `SnapshotAgentError` takes
        them: the status (a `Code`, its number or a grpcio `StatusCode`; default the
        class's) and the server's own words (default ``message``)."""
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = as_code(code)
        # What the server said, as the v1alpha1 client's errors carry it.
        self.details: str | None = message if details is None else details


class InvalidArgumentError(TimeSliceError, ValueError):
    """The request is malformed or names something invalid (an empty id, say)."""

    code = Code.INVALID_ARGUMENT


class NotFoundError(TimeSliceError, LookupError):
    """The group, job, lease or operation named does not exist."""

    code = Code.NOT_FOUND


class AlreadyExistsError(TimeSliceError):
    """The thing to create exists already."""

    code = Code.ALREADY_EXISTS


class PermissionDeniedError(TimeSliceError, PermissionError):
    """The caller may not do this."""

    code = Code.PERMISSION_DENIED


class UnauthenticatedError(TimeSliceError, PermissionError):
    """The call carries no credentials, or credentials the server does not know."""

    code = Code.UNAUTHENTICATED


class ConflictError(TimeSliceError):
    """The request conflicts with the current state."""

    code = Code.FAILED_PRECONDITION


class NotHolderError(ConflictError):
    """The job does not hold the lock it tried to use (a `Yield` by a non-holder)."""

    code = Code.FAILED_PRECONDITION


class YieldNotHeldError(NotHolderError, PermissionDeniedError):
    """A `Yield` by a job that does not hold the lock: PERMISSION_DENIED on the wire,
    as the v1alpha1 server answers it. Clients raise `NotHolderError` for it."""

    code = Code.PERMISSION_DENIED


class LeaseLostError(ConflictError):
    """The caller's grant is no longer current: its lease expired, was revoked, or
    its fencing token is stale."""

    code = Code.ABORTED


class ResourceExhaustedError(TimeSliceError):
    """A limit was reached: a message too large, too many waiters."""

    code = Code.RESOURCE_EXHAUSTED


class DeadlineExceededError(TimeSliceError, TimeoutError):
    """A wait limit or the call's deadline ran out (an `Acquire` not granted in time)."""

    code = Code.DEADLINE_EXCEEDED


class UnavailableError(TimeSliceError, ConnectionError):
    """The server cannot be reached, or is shutting down."""

    code = Code.UNAVAILABLE


class CancelledError(TimeSliceError):
    """The call was cancelled."""

    code = Code.CANCELLED


class UnimplementedError(TimeSliceError, NotImplementedError):
    """The server does not know this call (an older server, or a v1alpha1 one)."""

    code = Code.UNIMPLEMENTED


class InternalError(TimeSliceError):
    """The server failed in a way it did not expect."""

    code = Code.INTERNAL


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

    code = Code.FAILED_PRECONDITION


class JournalInUseError(JournalError):
    """Another orchestrator writes this journal; the message names it."""


class JournalClaimLostError(JournalError):
    """The journal's writer lost its claim (the connection that held it went away):
    another orchestrator may write the journal now, so this one must stop."""

    code = Code.UNAVAILABLE
