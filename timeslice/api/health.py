"""The standard gRPC health service (`grpc.health.v1.Health`), as both servers
answer it: `Check` says whether a service name is SERVING now; `Watch` says so
once, then NOT_SERVING when the server starts closing, and ends.

Each server says what SERVING means for each of its names (`serving(name)`:
True, False, or NotFoundError for a name it does not know) and sets `stopping`
when it starts to close. The routes go through the server's `CallGate` as its
other services do (bounded reads, error translation, refused once closed).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import grpclib.const

from timeslice.api.gen.grpc.health import v1 as health
from timeslice.api.serving import CallGate, edge_mapping

SERVING = health.HealthCheckResponseServingStatus.SERVING
NOT_SERVING = health.HealthCheckResponseServingStatus.NOT_SERVING


class HealthService(health.HealthBase):
    """`grpc.health.v1.Health` over `serving(name)`, ended by `stopping`."""

    def __init__(
        self, gate: CallGate, stopping: asyncio.Event, serving: Callable[[str], bool]
    ) -> None:
        self.gate = gate
        self.stopping = stopping
        self.serving = serving

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return edge_mapping(super().__mapping__(), self, self.gate)

    def status(self, service: str) -> health.HealthCheckResponseServingStatus:
        """SERVING or NOT_SERVING for `service` now (NotFoundError: unknown)."""
        return SERVING if self.serving(service) and not self.stopping.is_set() else NOT_SERVING

    async def check(self, message: health.HealthCheckRequest) -> health.HealthCheckResponse:
        return health.HealthCheckResponse(status=self.status(message.service))

    async def watch(
        self, message: health.HealthCheckRequest
    ) -> AsyncIterator[health.HealthCheckResponse]:
        """The status now, then NOT_SERVING when the server starts closing (the
        stream ends then, as the server stops)."""
        status = self.status(message.service)
        yield health.HealthCheckResponse(status=status)
        await self.stopping.wait()
        if status != NOT_SERVING:
            yield health.HealthCheckResponse(status=NOT_SERVING)
