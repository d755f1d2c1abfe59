"""An orchestrator that speaks only the v1alpha1 protocol, as the reference server
does: what our client meets when its server is an older one.

grpcio serves `TimeSliceOrchestratorService` from tests/compat/v1alpha1_orchestrator.proto
(compiled at test time): the fields and RPCs we add are unknown to it, so it
reads only the first group of an Acquire, never answers a wait limit (an Acquire
waits until granted or until its caller leaves), answers UNIMPLEMENTED to
KeepAlive, and PERMISSION_DENIED to a Yield by a job that does not hold the lock.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import Any

import grpc


class FakeV1alpha1Orchestrator:
    """One lock per group; `calls` lists what was asked, in order."""

    def __init__(self, pb2: ModuleType, pb2_grpc: ModuleType) -> None:
        self.pb2 = pb2
        self.holders: dict[str, str] = {}
        self.calls: list[tuple[str, str, str]] = []
        self._changed = threading.Condition()
        fake = self

        class Servicer(pb2_grpc.TimeSliceOrchestratorServiceServicer):  # type: ignore[misc]
            def Acquire(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
                return fake.acquire(request, context)

            def Yield(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
                return fake.yield_(request, context)

            def ListGroups(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
                with fake._changed:
                    return pb2.ListGroupsResponse(group_ids=sorted(fake.holders))

        self._server = grpc.server(ThreadPoolExecutor(8))
        pb2_grpc.add_TimeSliceOrchestratorServiceServicer_to_server(Servicer(), self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        self._server.start()

    def acquire(self, request: Any, context: grpc.ServicerContext) -> Any:
        started = time.monotonic()
        job, group = request.job_id, request.group_id
        with self._changed:
            self.calls.append(("acquire", job, group))
            while self.holders.get(group, job) != job:
                if not context.is_active():
                    self.calls.append(("left", job, group))
                    return self.pb2.AcquireResponse()
                self._changed.wait(0.02)
            self.holders[group] = job
            self.calls.append(("granted", job, group))
        waited = round((time.monotonic() - started) * 1000)
        return self.pb2.AcquireResponse(success=True, waited_ms=waited, context_restored=True)

    def yield_(self, request: Any, context: grpc.ServicerContext) -> Any:
        job, group = request.job_id, request.group_id
        with self._changed:
            self.calls.append(("yield", job, group))
            if self.holders.get(group) != job:
                context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{job} does not hold {group}")
            del self.holders[group]
            self._changed.notify_all()
        return self.pb2.YieldResponse(success=True, pending_waiters=0, snapshot_deferred=True)

    def hold(self, group: str, job: str) -> None:
        """Give `group` to `job`, as if it had acquired it."""
        with self._changed:
            self.holders[group] = job

    def stop(self) -> None:
        self._server.stop(0).wait(5)
