"""The v1alpha1 client's `timeslice.orchestrator.exceptions`: its names for our
exceptions (`timeslice.errors`), so that code written for it catches the same
errors. Each is the class of one gRPC status, and `OrchestratorError` is the base
of every error timeslice raises."""

from timeslice.errors import (
    OrchestratorConnectionError,
    OrchestratorError,
    OrchestratorInternalError,
    OrchestratorInvalidArgumentError,
    OrchestratorTimeoutError,
)

__all__ = [
    "OrchestratorConnectionError",
    "OrchestratorError",
    "OrchestratorInternalError",
    "OrchestratorInvalidArgumentError",
    "OrchestratorTimeoutError",
]
