"""What the fuzzer sends, made from a seed: a body for each request of every route,
and the frames that carry it.

Request `index` of seed `seed` is drawn from `random.Random(f"{seed}/{index}")`
and the ids earlier answers named (`Pools`), so that a run reads the same at any
concurrency but for the state it reaches. A body is valid (built with the
generated classes), valid but for one hostile field, hostile throughout, a valid
or hostile body with random edits, or random bytes; about one in seven is sent
in malformed frames instead (`_malformed`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import betterproto2
from grpclib.const import Cardinality

from timeslice.api.gen.grpc.health import v1 as hpb
from timeslice.api.gen.snapshot_agent import v1alpha1 as apb
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as opb

from .hostile import SERVICES, MiB, Pools, frame, hostile_body, mutate, one_hostile_field, pick

ORCHESTRATOR, AGENT = "orchestrator", "agent"


@dataclass(frozen=True)
class Route:
    """One RPC as its server's mapping lists it."""

    path: str
    server: str  # ORCHESTRATOR or AGENT: who serves it
    cardinality: Cardinality
    request_type: type[betterproto2.Message]
    reply_type: type[betterproto2.Message]

    @property
    def method(self) -> str:
        return self.path.rsplit("/", 1)[1]

    @property
    def name(self) -> str:
        """`Service/Method`, the service without its package."""
        service = self.path.split("/")[1].rsplit(".", 1)[1]
        return f"{service}/{self.method}"

    @property
    def streams_replies(self) -> bool:
        return self.cardinality in (Cardinality.UNARY_STREAM, Cardinality.STREAM_STREAM)

    @property
    def streams_requests(self) -> bool:
        return self.cardinality in (Cardinality.STREAM_UNARY, Cardinality.STREAM_STREAM)


def routes() -> list[Route]:
    """Every route of both services and the agent's health service, read from the
    generated servicer bases (what the servers' `edge_mapping` wraps)."""
    bases: list[tuple[type[Any], str]] = [
        (opb.TimeSliceOrchestratorServiceBase, ORCHESTRATOR),
        (apb.SnapshotAgentServiceBase, AGENT),
        (hpb.HealthBase, AGENT),
    ]
    return [
        Route(path, server, handler.cardinality, handler.request_type, handler.reply_type)
        for base, server in bases
        for path, handler in base().__mapping__().items()
    ]


# A route no server has: answered UNIMPLEMENTED by grpclib before our edge.
UNKNOWN_ROUTE: Final = Route(
    "/timeslice_orchestrator.v1alpha1.TimeSliceOrchestratorService/NoSuchMethod",
    ORCHESTRATOR,
    Cardinality.UNARY_UNARY,
    opb.ListGroupsRequest,
    opb.ListGroupsResponse,
)


@dataclass(frozen=True)
class Request:
    """One call: what goes on its stream after the headers, and how long to wait."""

    index: int
    route: Route
    # How it was made: "valid", "one-field", "hostile", "mutated", "random",
    # "frame:<how>", "unknown-method", or "sequence" (a step of a valid sequence).
    kind: str
    data: bytes
    end: bool = True  # the stream is ended after `data`
    chunk: int = 0  # when > 0, `data` leaves in DATA frames of this many bytes
    timeout: float = 1.5  # the client's deadline (sent as grpc-timeout too)
    window: float = 0.0  # a stream that may stay open: read it this long, then cancel

    def hex(self, limit: int = 4096) -> str:
        text = self.data.hex()
        return text if len(text) <= limit else f"{text[:limit]}...({len(self.data)} bytes)"


# --- valid requests -----------------------------------------------------------------


def _backend(rng: random.Random) -> apb.BackendConfig | None:
    pick = rng.randrange(4)
    if pick == 0:
        return None
    if pick == 1:
        return apb.BackendConfig(app_channel=apb.AppChannelConfig(tags=["weights"]))
    return apb.BackendConfig(named=apb.NamedBackendConfig(name="noop"))


def _request_id(rng: random.Random) -> str:
    return f"r{rng.randrange(50)}" if rng.random() < 0.5 else ""


def _acquire(rng: random.Random, p: Pools) -> opb.AcquireRequest:
    group = rng.choice(p.groups)
    more = [g for g in p.groups if g != group and rng.random() < 0.15]
    return opb.AcquireRequest(
        job_id=rng.choice(p.jobs),
        group_id=group,
        request_id=_request_id(rng),
        lease_ttl_ms=rng.choice((None, 300, 1000, 5000)),
        wait_timeout_ms=rng.choice((0, 10, 50, 100)),
        priority=rng.randrange(-3, 4),
        more_group_ids=more,
    )


def _yield(rng: random.Random, p: Pools) -> opb.YieldRequest:
    group = rng.choice(p.groups)
    token = p.token(rng, group) if rng.random() < 0.5 else None
    return opb.YieldRequest(rng.choice(p.jobs), group, _request_id(rng), token)


def _keep_alive(rng: random.Random, p: Pools) -> opb.KeepAliveRequest:
    fallback = (rng.choice(p.groups), rng.choice(p.jobs)), (0, "lease-1")
    (group, job), (_, lease) = pick(rng, list(p.grants.items()), fallback)
    if rng.random() < 0.3:
        (group, job), (_, lease) = fallback
    return opb.KeepAliveRequest(group_id=group, job_id=job, lease_id=lease)


def _report(rng: random.Random, p: Pools) -> opb.AgentReport:
    node = rng.choice(("fz-node", "fz-node-2", p.node))
    jobs = [apb.JobStatus(job_id=rng.choice(p.jobs), state=apb.JobState.RUNNING,
                          group=rng.choice(p.groups), liveness=rng.choice(list(apb.Liveness)))
            for _ in range(rng.randrange(3))]  # fmt: skip
    return opb.AgentReport(
        node_name=node,
        address=p.agent_address if node == p.node else "127.0.0.1:1",
        groups=[g for g in p.groups if rng.random() < 0.3],
        jobs=jobs,
        accelerators=[apb.AcceleratorStatus("gpu0", 1, 2)] if rng.random() < 0.5 else [],
    )


def _workload(rng: random.Random, p: Pools) -> apb.WorkloadMessage:
    if rng.random() < 0.8:
        register = apb.RegisterWorkload(
            job_id=rng.choice(p.jobs),
            group=rng.choice(p.groups),
            capabilities=apb.WorkloadCapabilities(
                supported_modes=[apb.SuspendMode.OFFLOAD], tags=["weights"]
            ),
            state=rng.choice((apb.JobState.UNSPECIFIED, apb.JobState.RUNNING, apb.JobState.SAVED)),
        )
        return apb.WorkloadMessage(register=register)
    return apb.WorkloadMessage(result=apb.CommandResult(f"c{rng.randrange(9)}", ok=True))


def _switch(rng: random.Random, p: Pools) -> apb.SwitchGroupRequest:
    group = rng.choice(p.groups)
    return apb.SwitchGroupRequest(
        group=group,
        next_job_id=rng.choice(("", *p.jobs)),
        fencing_token=p.token(rng, group),
        timeout_ms=rng.choice((50, 200)),
        jobs=[apb.SwitchJob(job_id=j, backend_config=_backend(rng)) for j in p.jobs[:2]],
        orchestrator_epoch=_epoch(rng),
    )


def _epoch(rng: random.Random) -> int:
    """An orchestrator epoch: mostly none or small, sometimes one from the far future."""
    return rng.choice((0, 0, 1, 2, 3, 2**40, 2**64 - 1))


def _operation(kind: type[Any]) -> Callable[[random.Random, Pools], betterproto2.Message]:
    def build(rng: random.Random, p: Pools) -> betterproto2.Message:
        group = rng.choice(p.groups)
        token = p.token(rng, group) if rng.random() < 0.3 else 0
        message: betterproto2.Message = kind(
            job_id=rng.choice(p.jobs), group=group, backend_config=_backend(rng),
            fencing_token=token, timeout_ms=rng.choice((None, 500)),
        )  # fmt: skip
        return message

    return build


_Builder = Callable[[random.Random, Pools], betterproto2.Message]
VALID: Final[dict[str, _Builder]] = {
    "TimeSliceOrchestratorService/Acquire": _acquire,
    "TimeSliceOrchestratorService/Yield": _yield,
    "TimeSliceOrchestratorService/ListGroups": lambda r, p: opb.ListGroupsRequest(),
    "TimeSliceOrchestratorService/GetGroupStatus": lambda r, p: opb.GetGroupStatusRequest(
        r.choice(p.groups)
    ),
    "TimeSliceOrchestratorService/KeepAlive": _keep_alive,
    "TimeSliceOrchestratorService/Watch": lambda r, p: opb.WatchRequest(r.choice(("", *p.groups))),
    "TimeSliceOrchestratorService/ForceRelease": lambda r, p: opb.ForceReleaseRequest(
        r.choice(p.groups), r.choice(("", *p.jobs)), "fuzz"
    ),
    "TimeSliceOrchestratorService/RegisterJob": lambda r, p: opb.RegisterJobRequest(
        r.choice(p.groups), r.choice(p.jobs), r.choice(("", p.node)), _backend(r)
    ),
    "TimeSliceOrchestratorService/ResetJob": lambda r, p: opb.ResetJobRequest(
        r.choice(p.groups), r.choice(p.jobs)
    ),
    "TimeSliceOrchestratorService/SetGroupNodes": lambda r, p: opb.SetGroupNodesRequest(
        r.choice(p.groups), [n for n in p.nodes if r.random() < 0.3]
    ),
    "TimeSliceOrchestratorService/AgentSession": _report,
    "TimeSliceOrchestratorService/ListAgents": lambda r, p: opb.ListAgentsRequest(),
    "TimeSliceOrchestratorService/GetLeadership": lambda r, p: opb.GetLeadershipRequest(),
    "SnapshotAgentService/Snapshot": _operation(apb.SnapshotRequest),
    "SnapshotAgentService/Restore": _operation(apb.RestoreRequest),
    "SnapshotAgentService/GetOperation": lambda r, p: apb.GetOperationRequest(
        pick(r, p.operations, "op-1"), r.choice((None, 0, 20, 100))
    ),
    "SnapshotAgentService/Status": lambda r, p: apb.StatusRequest(),
    "SnapshotAgentService/WorkloadChannel": _workload,
    "SnapshotAgentService/ResetJob": lambda r, p: apb.ResetJobRequest(
        r.choice(p.jobs), r.choice(p.groups), _epoch(r)
    ),
    "SnapshotAgentService/SwitchGroup": _switch,
    "Health/Check": lambda r, p: hpb.HealthCheckRequest(r.choice(SERVICES)),
    "Health/Watch": lambda r, p: hpb.HealthCheckRequest(r.choice(SERVICES)),
}


# --- one request --------------------------------------------------------------------

# How bodies are made, and how often.
_KINDS: Final = ["valid", "one-field", "hostile", "mutated", "random", "frame"]
_KIND_WEIGHTS: Final = [24, 20, 24, 14, 4, 14]
_FRAMES: Final = ["cut-header", "cut-body", "oversized", "compressed", "two-messages",
                  "trailing-bytes", "empty-stream", "empty-message", "unended", "chunked"]  # fmt: skip


class Generator:
    """Request `index` of a seeded run, for any route."""

    def __init__(self, seed: int, pools: Pools, routes_: list[Route]) -> None:
        self.seed = seed
        self.pools = pools
        self.routes = routes_

    def body(self, route: Route, rng: random.Random, kind: str) -> bytes:
        if kind == "random":
            return rng.randbytes(rng.choice((1, 2, 5, 16, 64, 512, 4096)))
        if kind in ("valid", "one-field") or (kind == "mutated" and rng.random() < 0.6):
            data = bytes(VALID[route.name](rng, self.pools))
        else:
            data = hostile_body(route.request_type, rng, self.pools)
        if kind == "one-field":
            data += one_hostile_field(route.request_type, rng, self.pools)
        if kind == "mutated":
            data = mutate(data, rng)
        return data

    def request(self, index: int) -> Request:
        rng = random.Random(f"{self.seed}/{index}")
        route = UNKNOWN_ROUTE if rng.random() < 0.01 else rng.choice(self.routes)
        if route is UNKNOWN_ROUTE:
            return Request(index, route, "unknown-method", frame(b""))
        kind = rng.choices(_KINDS, _KIND_WEIGHTS)[0]
        made = "valid" if kind == "frame" else kind
        count = rng.choice((1, 1, 2, 3)) if route.streams_requests else 1
        bodies = [self.body(route, rng, made) for _ in range(count)]
        data = b"".join(frame(body) for body in bodies)
        end, chunk = True, 0
        if kind == "frame":
            kind = f"frame:{rng.choice(_FRAMES)}"
            data, end, chunk = _malformed(kind, bodies[0], data, rng)
        timeout, window = self._patience(route, kind, rng, end)
        return Request(index, route, kind, data, end, chunk, timeout, window)

    def _patience(
        self, route: Route, kind: str, rng: random.Random, end: bool
    ) -> tuple[float, float]:
        """A deadline short enough that a call that may wait (a queued Acquire, a
        switch, a stream) never holds a worker long."""
        if route.streams_replies or not end:
            return 1.5, rng.choice((0.05, 0.1, 0.2))
        if route.method == "Acquire" and kind != "valid":
            return 0.3, 0.0
        if route.method in ("GetOperation", "SwitchGroup"):
            return 0.6, 0.0
        return 1.5, 0.0


def _malformed(
    kind: str, body: bytes, framed: bytes, rng: random.Random
) -> tuple[bytes, bool, int]:
    """The frames of `kind` for `body` (`framed`: it framed as it should be), whether
    the stream ends after them, and the DATA frame size to send them in."""
    match kind:
        case "frame:cut-header":
            return frame(body)[: rng.randrange(5)], True, 0
        case "frame:cut-body":
            if body:
                return frame(body)[: 5 + rng.randrange(len(body))], True, 0
            return frame(b"", length=rng.randint(1, 100)), True, 0
        case "frame:oversized":
            size = rng.choice((4 * MiB + 1, 2**31, 2**32 - 1))
            return frame(body[: rng.randrange(64)], length=size), True, 0
        case "frame:compressed":
            return frame(body, flag=rng.choice((1, 2, 0x80, 0xFF))), True, 0
        case "frame:two-messages":
            return framed + frame(body), True, 0
        case "frame:trailing-bytes":
            return framed + rng.randbytes(rng.randint(1, 4)), True, 0
        case "frame:empty-stream":
            return b"", True, 0
        case "frame:empty-message":
            return frame(b""), True, 0
        case "frame:unended":
            return framed, False, 0
        case _:  # chunked: well formed, in DATA frames of a few bytes
            return framed, True, rng.randint(1, 7)
