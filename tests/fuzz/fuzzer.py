"""The fuzzer's run: an Orchestrator and an Agent in this process, workers that send
them `generate`'s requests on raw gRPC streams, and the checks of what came back.

A call ends as a gRPC status by name ("OK", "INVALID_ARGUMENT"...) or as an
outcome the caller alone sees (`caller`: its deadline ran out, it stopped reading
an open stream). A finding is what a caller or an operator would call a bug: an
INTERNAL or UNKNOWN status, a status message over 1 KiB, a reply that does not
parse, a call that outlives its deadline, a traceback in a server's log, a table
whose invariants break, a server that no longer answers.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Final

import grpclib.client
from grpclib.exceptions import GRPCError

from timeslice import Agent, Orchestrator
from timeslice.api.bounds import MAX_STATUS_BYTES
from timeslice.api.gen.grpc.health import v1 as hpb
from timeslice.api.gen.snapshot_agent import v1alpha1 as apb
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as opb

from .caller import (
    CLIENT_DEADLINE,
    CLIENT_ERROR,
    HANG,
    READ_WINDOW,
    Caller,
    Outcome,
    host_port,
)
from .generate import AGENT, ORCHESTRATOR, Generator, Request, Route, routes
from .hostile import Pools, frame

# Methods whose answer may rightly wait until the caller's deadline: a queued
# Acquire, an operation or a switch still running. (A stream left open is read
# for its window only; every other call must be answered within its deadline.)
MAY_WAIT: Final = frozenset({"Acquire", "GetOperation", "SwitchGroup"})
_ORCH, _AGENT = "TimeSliceOrchestratorService", "SnapshotAgentService"
_BAD_STATUSES: Final = frozenset({"INTERNAL", "UNKNOWN"})
_WATCHED_LOGGERS: Final = ("timeslice", "grpclib")


@dataclass(frozen=True)
class Finding:
    """Something a caller or an operator would call a bug, with what caused it."""

    what: str
    route: str = ""
    kind: str = ""
    index: int = -1
    detail: str = ""
    request_hex: str = ""
    # False for an error grpclib itself logged: reported, but a race of the event
    # loop can cause one (see judge_logs), so a test does not fail on it.
    asserted: bool = True

    def key(self) -> tuple[str, str, str, str]:
        return (self.what, self.route, self.kind.split(":")[0], self.detail[:120])

    def describe(self, count: int = 1) -> str:
        where = f" on {self.route} ({self.kind} request {self.index})" if self.route else ""
        sent = f"\n  request: {self.request_hex[:600]}" if self.request_hex else ""
        return f"{self.what} x{count}{where}\n  {self.detail[:2000]}{sent}"


@dataclass
class Report:
    """What a run sent, how each call ended, and what it found."""

    seed: int
    requests: int = 0
    wall_s: float = 0.0  # sending the requests
    total_s: float = 0.0  # starting the servers, sending, the checks, closing
    statuses: Counter[str] = field(default_factory=Counter)
    by_route: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    by_kind: Counter[str] = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)
    occurrences: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)
    warnings: Counter[str] = field(default_factory=Counter)
    slowest: tuple[float, str, int] = (0.0, "", -1)
    # The first status message of each route and status: what the codes stand for.
    examples: dict[str, dict[str, str]] = field(default_factory=lambda: defaultdict(dict))
    commands: int = 0  # commands the agent sent to the fuzzer's workloads
    groups: int = 0

    def find(self, finding: Finding) -> None:
        """Keep the first finding of each sort; count every one."""
        if not self.occurrences[finding.key()]:
            self.findings.append(finding)
        self.occurrences[finding.key()] += 1

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "requests": self.requests,
            "wall_s": round(self.wall_s, 2),
            "total_s": round(self.total_s, 2),
            "statuses": dict(self.statuses.most_common()),
            "by_route": {r: dict(c.most_common()) for r, c in sorted(self.by_route.items())},
            "by_kind": dict(self.by_kind.most_common()),
            "slowest_call": dict(zip(("seconds", "route", "index"), self.slowest, strict=True)),
            "groups_at_end": self.groups,
            "workload_commands": self.commands,
            "examples": {r: dict(sorted(e.items())) for r, e in sorted(self.examples.items())},
            "warnings_logged": dict(self.warnings.most_common()),
            "findings": [{**vars(f), "count": self.occurrences[f.key()]} for f in self.findings],
        }

    def table(self) -> str:
        codes = [code for code, _ in self.statuses.most_common()]
        width = max((len(r) for r in self.by_route), default=10)

        def row(name: str, counts: Counter[str]) -> str:
            return f"{name:<{width}} " + " ".join(f"{counts[c]:>{len(c)}}" for c in codes)

        lines = [f"{'route':<{width}} " + " ".join(codes)]
        lines += [row(name, counts) for name, counts in sorted(self.by_route.items())]
        lines.append(row("all", self.statuses))
        lines.append(
            f"{self.requests} requests in {self.wall_s:.1f} s, {len(self.findings)} finding(s)"
        )
        return "\n".join(lines)


class LogWatch(logging.Handler):
    """Keeps the warnings and errors the servers and grpclib log during a run."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.exc_info = None  # the traceback's frames would keep every local alive
        self.records.append(record)

    @asynccontextmanager
    async def attached(self) -> AsyncIterator[LogWatch]:
        loggers = [logging.getLogger(name) for name in _WATCHED_LOGGERS]
        for logger in loggers:
            logger.addHandler(self)
        try:
            yield self
        finally:
            for logger in loggers:
                logger.removeHandler(self)


def route_named(name: str) -> Route:
    return next(r for r in routes() if r.name == name)


# --- the run ------------------------------------------------------------------------


@asynccontextmanager
async def serving(node: str = "fuzz-node") -> AsyncIterator[tuple[Orchestrator, Agent]]:
    """An Orchestrator (memory journal) and an Agent registered with it, on port 0.

    Switches and operations are given a few seconds, not minutes: a switch through
    a workload that never answers must not hold a group past the run."""
    async with Orchestrator(switch_timeout=2.0, revoked_snapshot_timeout=1.0) as orch:
        async with Agent(node_name=node, backends=("noop", "app_channel"),
                         orchestrator=orch.address, operation_timeout=2.0) as agent:  # fmt: skip
            yield orch, agent


class Run:
    """`total` requests from `concurrency` workers against `orch` and `agent`."""

    def __init__(
        self, orch: Orchestrator, agent: Agent, seed: int, total: int, concurrency: int
    ) -> None:
        self.orch, self.agent = orch, agent
        self.seed, self.total, self.concurrency = seed, total, concurrency
        self.pools = Pools(node=agent.config.node_name, agent_address=agent.address)
        self.generator = Generator(seed, self.pools, routes())
        self.report = Report(seed)
        self._indices = itertools.count()
        self._routes = {route.name: route for route in routes()}

    async def run(self) -> Report:
        await self._setup()
        started = time.monotonic()
        checker = asyncio.ensure_future(self._check_tables_every(0.2))
        try:
            await asyncio.gather(*(self._worker() for _ in range(self.concurrency)))
        finally:
            checker.cancel()
            await asyncio.gather(checker, return_exceptions=True)
        self.report.wall_s = time.monotonic() - started
        await self._check_still_serving()
        self._check_tables()
        return self.report

    # --- workers --------------------------------------------------------------------

    def _take(self) -> int | None:
        index = next(self._indices)
        return index if index < self.total else None

    async def _worker(self) -> None:
        caller = Caller({ORCHESTRATOR: self.orch.address, AGENT: self.agent.address})
        try:
            while (index := self._take()) is not None:
                rng = random.Random(f"{self.seed}/{index}/sequence")
                if rng.random() < 0.08:
                    await self._sequence(caller, index, rng)
                else:
                    await self.send(caller, self.generator.request(index))
        finally:
            caller.close()

    async def send(self, caller: Caller, request: Request) -> Outcome:
        outcome = await caller.call(request)
        self._judge(request, outcome)
        return outcome

    def _valid(self, index: int, name: str, message: Any, timeout: float = 1.5) -> Request:
        return Request(index, self._routes[name], "sequence", frame(bytes(message)),
                       timeout=timeout)  # fmt: skip

    # --- valid sequences: state for the hostile requests to meet ---------------------

    async def _sequence(self, caller: Caller, index: int, rng: random.Random) -> None:
        job, group = rng.choice(self.pools.jobs), rng.choice(self.pools.groups)
        match rng.randrange(3):
            case 0:
                await self._holder(caller, index, rng, job, group)
            case 1:
                await self._operations(caller, index, rng, job, group)
            case _:
                await self._workload(caller, index, rng, job, group)

    async def _holder(
        self, caller: Caller, index: int, rng: random.Random, job: str, group: str
    ) -> None:
        """Acquire, keep alive a few times, yield with the grant's token."""
        acquire = opb.AcquireRequest(job_id=job, group_id=group, request_id=f"s{index}",
                                     lease_ttl_ms=rng.choice((500, 2000)),
                                     wait_timeout_ms=rng.choice((20, 100, 300)))  # fmt: skip
        outcome = await self.send(caller, self._valid(index, f"{_ORCH}/Acquire", acquire))
        if outcome.code != "OK" or not outcome.replies:
            return
        grant = opb.AcquireResponse.FromString(outcome.replies[0])
        lease = grant.lease.lease_id if grant.lease else ""
        for _ in range(rng.randrange(3)):
            if (i := self._take()) is None:
                return
            await asyncio.sleep(rng.choice((0.0, 0.02, 0.1)))
            keep = opb.KeepAliveRequest(group_id=group, job_id=job, lease_id=lease)
            await self.send(caller, self._valid(i, f"{_ORCH}/KeepAlive", keep))
        if (i := self._take()) is not None:
            done = opb.YieldRequest(job, group, f"y{index}", grant.fencing_token)
            await self.send(caller, self._valid(i, f"{_ORCH}/Yield", done))

    async def _operations(
        self, caller: Caller, index: int, rng: random.Random, job: str, group: str
    ) -> None:
        """Snapshot with the noop backend, wait for it, restore, wait for that."""
        noop = apb.BackendConfig(named=apb.NamedBackendConfig(name="noop"))
        i: int | None = index
        for kind in (apb.SnapshotRequest, apb.RestoreRequest):
            if kind is apb.RestoreRequest and (i := self._take()) is None:
                return
            assert i is not None
            name = f"{_AGENT}/{kind.__name__.removesuffix('Request')}"
            started = await self.send(
                caller, self._valid(i, name, kind(job, group, backend_config=noop))
            )
            if started.code != "OK" or not started.replies or (i := self._take()) is None:
                return
            op = apb.SnapshotResponse.FromString(started.replies[0]).operation_id
            wait = apb.GetOperationRequest(op, wait_ms=rng.choice((50, 200)))
            await self.send(caller, self._valid(i, f"{_AGENT}/GetOperation", wait))

    async def _workload(
        self, caller: Caller, index: int, rng: random.Random, job: str, group: str
    ) -> None:
        """A workload on an app_channel backend that answers the agent's commands,
        while the same job acquires and yields its group."""
        config = apb.BackendConfig(app_channel=apb.AppChannelConfig())
        register = opb.RegisterJobRequest(group, job, "", config)
        await self.send(caller, self._valid(index, f"{_ORCH}/RegisterJob", register))
        if (i := self._take()) is None:
            return
        hello = apb.WorkloadMessage(register=apb.RegisterWorkload(job_id=job, group=group))
        route = self._routes[f"{_AGENT}/WorkloadChannel"]
        request = Request(i, route, "sequence", frame(bytes(hello)), end=False, timeout=3.0,
                          window=rng.choice((0.2, 0.5, 1.0)))  # fmt: skip

        def answer(reply: bytes) -> bytes:
            command = apb.AgentCommand.FromString(reply)
            self.report.commands += 1
            ok = rng.random() < 0.85
            result = apb.CommandResult(command.command_id, ok, "" if ok else "fuzz failure",
                                       storage_bytes=rng.choice((None, 0, 4096)))  # fmt: skip
            return frame(bytes(apb.WorkloadMessage(result=result)))

        # The same job asks for its group meanwhile: a switch there sends commands.
        j = self._take()
        holder = self._holder(caller, j, rng, job, group) if j is not None else asyncio.sleep(0)
        outcome, _ = await asyncio.gather(caller.converse(request, answer), holder)
        self._judge(request, outcome)

    # --- judging --------------------------------------------------------------------

    def _judge(self, request: Request, outcome: Outcome) -> None:
        report, route = self.report, request.route
        report.requests += 1
        report.statuses[outcome.code] += 1
        report.by_route[route.name][outcome.code] += 1
        report.by_kind[request.kind.split(":")[0]] += 1
        if outcome.message is not None:
            report.examples[route.name].setdefault(outcome.code, outcome.message[:160])
        if outcome.elapsed > report.slowest[0]:
            report.slowest = (outcome.elapsed, route.name, request.index)

        def find(what: str, detail: str = "") -> None:
            report.find(Finding(what, route.name, request.kind, request.index,
                                detail or (outcome.message or ""), request.hex()))  # fmt: skip

        if outcome.code in _BAD_STATUSES:
            find(f"status {outcome.code}")
        if len((outcome.message or "").encode()) > MAX_STATUS_BYTES:
            find("status message over 1 KiB", f"{len(outcome.message or '')} characters")
        if outcome.code == HANG:
            find("call outlived its deadline", f"deadline {request.timeout} s")
        if outcome.code == CLIENT_ERROR:
            find("the fuzzer's client failed")
        waited = outcome.code in (CLIENT_DEADLINE, "DEADLINE_EXCEEDED")
        if waited and request.end and route.method not in MAY_WAIT:
            find("no answer within the deadline", f"deadline {request.timeout} s")
        if outcome.code in ("OK", READ_WINDOW):
            self._harvest(request, outcome, find)

    def _harvest(
        self, request: Request, outcome: Outcome, find: Callable[[str, str], None]
    ) -> None:
        """Parse every reply (one that does not parse is a finding); remember the ids
        later requests may use."""
        route = request.route
        try:
            replies = [route.reply_type.FromString(reply) for reply in outcome.replies]
        except Exception as exc:
            find("reply does not parse", f"{type(exc).__name__}: {exc}")
            return
        if not replies or request.kind not in ("valid", "sequence"):
            return
        if isinstance(replies[0], opb.AcquireResponse):
            asked = opb.AcquireRequest.FromString(request.data[5:])
            lease = replies[0].lease.lease_id if replies[0].lease else ""
            pools = self.pools
            if asked.job_id in pools.jobs and asked.group_id in pools.groups:
                pools.grants[(asked.group_id, asked.job_id)] = (replies[0].fencing_token, lease)
        elif isinstance(replies[0], (apb.SnapshotResponse, apb.RestoreResponse)):
            self.pools.remember_operation(replies[0].operation_id)

    # --- state checks ---------------------------------------------------------------

    async def _setup(self) -> None:
        """Groups that span the agent, so that grants there switch through it."""
        async with _stubs(self.orch.address, self.agent.address) as stubs:
            for group in self.pools.groups[:2]:
                nodes = opb.SetGroupNodesRequest(group, [self.pools.node])
                await stubs.orch.set_group_nodes(nodes)

    def _check_tables(self) -> None:
        for what, table in (("orchestrator", self.orch.table), ("agent", self.agent.table)):
            try:
                table.validate()
            except AssertionError as exc:
                self.report.find(Finding(f"{what} table invariant broken", detail=str(exc)))

    async def _check_tables_every(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self._check_tables()

    async def _check_still_serving(self) -> None:
        """Both servers answer their plain calls, and every group its status."""
        try:
            async with _stubs(self.orch.address, self.agent.address) as stubs:
                groups = (await stubs.orch.list_groups(opb.ListGroupsRequest())).group_ids
                await stubs.agent.status(apb.StatusRequest())
                await stubs.health.check(hpb.HealthCheckRequest())
                self.report.groups = len(groups)
                limit = asyncio.Semaphore(8)
                await asyncio.gather(*(self._group_status(stubs, g, limit) for g in groups))
        except (GRPCError, TimeoutError, OSError) as exc:
            self.report.find(Finding("a server stopped serving", detail=repr(exc)))

    async def _group_status(self, stubs: Stubs, group: str, limit: asyncio.Semaphore) -> None:
        async with limit:
            try:
                await stubs.orch.get_group_status(opb.GetGroupStatusRequest(group))
            except GRPCError as exc:
                detail = f"{group!r}: {exc.status.name} {exc.message}"
                self.report.find(Finding("a listed group has no status", detail=detail))


@dataclass(frozen=True)
class Stubs:
    """The generated stubs of both servers, for the plain calls around a run."""

    orch: opb.TimeSliceOrchestratorServiceStub
    agent: apb.SnapshotAgentServiceStub
    health: hpb.HealthStub


@asynccontextmanager
async def _stubs(orch_address: str, agent_address: str) -> AsyncIterator[Stubs]:
    """The stubs, on channels of their own, with a deadline on every call."""
    orch = grpclib.client.Channel(*host_port(orch_address))
    agent = grpclib.client.Channel(*host_port(agent_address))
    try:
        yield Stubs(
            opb.TimeSliceOrchestratorServiceStub(orch, timeout=5.0),
            apb.SnapshotAgentServiceStub(agent, timeout=5.0),
            hpb.HealthStub(agent, timeout=5.0),
        )
    finally:
        orch.close()
        agent.close()


def judge_logs(report: Report, records: list[logging.LogRecord]) -> None:
    """Errors and tracebacks the servers or grpclib logged are findings; warnings are
    counted by where they come from.

    An error grpclib's server logs is reported but not asserted: the one seen so far,
    "Failed to handle cancellation", comes of a handler that lost its cancellation
    at a deadline, which takes the deadline and a failure landing in the same turn
    of the event loop."""
    for record in records:
        text = record.getMessage()
        detail = f"{record.name}: {text}" + (f"\n{record.exc_text}" if record.exc_text else "")
        if record.levelno >= logging.ERROR or record.exc_text:
            what = ("internal error logged" if record.name == "timeslice.api.serving"
                    else f"{record.name} logged an error")  # fmt: skip
            asserted = not record.name.startswith("grpclib")
            report.find(Finding(what, detail=detail[:4000], asserted=asserted))
        else:
            report.warnings[f"{record.name}: {str(record.msg)[:80]}"] += 1


async def fuzz(requests: int = 10_000, seed: int = 0, concurrency: int = 16) -> Report:
    """Run `requests` requests of seed `seed` against fresh servers; the report.

    The whole run is bounded (at 50 ms a request, a minute at least): a run that
    does not end then is cut short, as a finding."""
    started = time.monotonic()
    watch = LogWatch()
    async with watch.attached():
        async with serving() as (orch, agent):
            run = Run(orch, agent, seed, requests, concurrency)
            limit = max(60.0, requests * 0.05)
            try:
                async with asyncio.timeout(limit):
                    await run.run()
            except TimeoutError:
                run.report.find(Finding("the run did not end in time", detail=f"{limit:g} s"))
            report = run.report
            closing = time.monotonic()
            try:
                async with asyncio.timeout(30.0):
                    await agent.close()
                    await orch.close()
            except TimeoutError:
                report.find(Finding("closing did not end in time", detail="30 s"))
            if (took := time.monotonic() - closing) > 20.0:
                report.find(Finding("closing took too long", detail=f"{took:.1f} s"))
    judge_logs(report, watch.records)
    report.total_s = time.monotonic() - started
    return report
