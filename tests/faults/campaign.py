"""The fault campaign: runs of a real orchestrator, two agents and four jobs, each
process of its own, under a seeded schedule of faults, each run then checked.

One run:

1. `timeslice serve orchestrator` (an SQLite journal in the run's folder, a
   snapshot every few dozen events, a short switch timeout) and two `timeslice
   serve agent` (nodes node-a and node-b, each with a job table on disk, the
   `app_channel` backend), both joining group `g`, which then spans both nodes.
2. Four jobs (`tests.faults.job`), two per node, each registered with its
   node's agent: every grant that changes hands moves the previous holder's
   host-memory context out on its node and the next one's in on its own.
3. Once every job has held the group, the faults of the run's plan (see
   `schedule`) strike one after the other: SIGKILL and restart of the
   orchestrator or of an agent, SIGSTOP of the holder past its lease (then
   SIGCONT), SIGKILL of a job (restarted or not). Meanwhile the campaign acts
   as an operator would: it resets a job quarantined by a failed snapshot once
   the job runs again (a frozen holder's snapshot cannot finish).
4. A calm period: every live job must complete a confirmed hold.
5. SIGTERM to every job, then to every server, which must exit 0 in time; then
   the checker reads the journal and the jobs' logs (see `checker`).

Every process is killed at the end whatever happens, and the run's folder is
removed unless it is kept for a failed run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import sqlalchemy as sa

from tests.faults import checker, schedule
from tests.faults.processes import PYTHON, Code, Process, port_open, timeslice
from tests.faults.proxy import Proxy
from tests.faults.schedule import Fault, Plan
from tests.ports import free_port
from tests.postgres import create_database, database_url, drop_database
from timeslice.client import AsyncTimeSliceOrchestratorClient, GroupLockState
from timeslice.errors import TimeSliceError

GROUP: Final = "g"
NODES: Final = ("node-a", "node-b")
POLL: Final = 0.25


@dataclass(frozen=True)
class Settings:
    """How each run is shaped."""

    duration: float = 25.0  # the fault phase, seconds
    min_faults: int = 3
    max_faults: int = 8
    jobs: int = 4
    lease: float = 2.0
    mib: int = 4
    # Short, so that a switch waiting on a frozen holder's snapshot ends soon.
    switch_timeout: float = 5.0
    recovery_grace: float = 10.0
    # Small, so that restarts start from a snapshot of the table, not only events.
    snapshot_every: int = 40
    ready_timeout: float = 30.0
    warmup_timeout: float = 60.0
    calm_timeout: float = 60.0
    shutdown_timeout: float = 20.0
    # Several orchestrators: candidates on one PostgreSQL journal (a database of
    # its own per run, made on the server of `postgres_url`), each reaching it
    # through a proxy the campaign can cut, with this leader lease.
    orchestrators: int = 1
    postgres_url: str = ""
    leader_lease: float = 2.0

    def __post_init__(self) -> None:
        if self.orchestrators > 1 and not self.postgres_url:
            raise ValueError("several orchestrators need a PostgreSQL server (postgres_url)")

    @property
    def ha(self) -> bool:
        """Whether the run has active and standby orchestrators."""
        return self.orchestrators > 1

    def job_names(self) -> tuple[str, ...]:
        return tuple(f"job-{i}" for i in range(self.jobs))


@dataclass(frozen=True)
class Failover:
    """One fault of the active: when it struck, and when another candidate said it
    was active (the first grant after it is read from the journal)."""

    kind: str
    struck: float
    took_over: float | None


@dataclass
class RunResult:
    """One run: its plan, what was done, what the checker found."""

    seed: int
    plan: Plan
    done: list[str] = field(default_factory=list)  # each fault as it was carried out
    faults: Counter[str] = field(default_factory=Counter)
    counts: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    stale_seconds: float = 0.0
    seconds: float = 0.0
    kept: str = ""  # the run's folder, when kept
    # Per fault of the active: its kind, seconds to the takeover and to the first
    # grant by the new active (None: not seen).
    failovers: list[tuple[str, float | None, float | None]] = field(default_factory=list)


class Run:
    """The processes of one run and the faults done to them."""

    def __init__(self, root: Path, seed: int, settings: Settings, code: Code) -> None:
        self.root, self.seed, self.settings, self.code = root, seed, settings, code
        self.rng = random.Random(f"{seed}/run")
        self.database = f"timeslice_faults_{seed}_{os.getpid()}"
        self.journal_url = (
            database_url(settings.postgres_url, self.database)
            if settings.ha
            else f"sqlite:///{root / 'journal.db'}"
        )
        self.ports = [free_port() for _ in range(settings.orchestrators)]
        self.address = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        self.agent_ports = {node: free_port() for node in NODES}
        # The candidates' commands are known once their proxies listen (`start`).
        self.candidates = [
            Process(name, [], root / f"{name}.log", root, code)
            for name in (
                [f"orchestrator-{i}" for i in range(len(self.ports))]
                if settings.ha
                else ["orchestrator"]
            )
        ]
        self.proxies: list[Proxy] = []
        self.failovers: list[Failover] = []
        self.agents = {
            node: Process(node, self._agent_command(node), root / f"{node}.log", root, code)
            for node in NODES
        }
        names = settings.job_names()
        self.job_nodes = {job: NODES[i * len(NODES) // len(names)] for i, job in enumerate(names)}
        self.jobs = {job: Process(job, self._job_command(job), root / f"{job}.out", root, code)
                     for job in names}  # fmt: skip
        self.violations: list[str] = []
        self.resets = 0
        self._client = AsyncTimeSliceOrchestratorClient(
            self.address,
            group_id=GROUP,
            lease_ttl_sec=None,
            call_timeout_sec=2.0,
            reconnect_timeout_sec=0.0,
        )
        # One client per candidate, to ask each where it stands.
        self._asking = [
            AsyncTimeSliceOrchestratorClient(
                f"127.0.0.1:{port}", lease_ttl_sec=None, call_timeout_sec=1.0,
                reconnect_timeout_sec=0.0,
            )
            for port in self.ports
        ]  # fmt: skip

    # --- commands -----------------------------------------------------------------------

    @property
    def orchestrator(self) -> Process:
        """The orchestrator of a run with one."""
        [only] = self.candidates
        return only

    def _orchestrator_command(self, i: int) -> list[str]:
        config = self.root / "orchestrator.toml"
        lines = [f"snapshot_every = {self.settings.snapshot_every}"]
        if "revoked_snapshot_timeout" in self.code.orchestrator_settings:
            # Where the orchestrator has it: a frozen holder's snapshot gives up
            # sooner than the whole switch.
            lines.append(f"revoked_snapshot_timeout = {self.settings.switch_timeout / 2}")
        config.write_text("\n".join(lines) + "\n")
        db, lease = self.journal_url, []
        if self.settings.ha:
            db = database_url(self.journal_url, self.database, port=self.proxies[i].port)
            lease = ["--leader-lease", str(self.settings.leader_lease)]
        return timeslice(
            "serve", "orchestrator", "--port", str(self.ports[i]), "--db", db,
            "--config", str(config), "--switch-timeout", str(self.settings.switch_timeout),
            "--recovery-grace", str(self.settings.recovery_grace), *lease,
        )  # fmt: skip

    def _agent_command(self, node: str) -> list[str]:
        return timeslice(
            "serve", "agent", "--port", str(self.agent_ports[node]), "--node-name", node,
            "--db", f"sqlite:///{self.root / (node + '.db')}", "--backend", "app_channel",
            "--orchestrator", self.address, "--group", GROUP,
        )  # fmt: skip

    def _job_command(self, job: str) -> list[str]:
        node = self.job_nodes[job]
        return [
            PYTHON, "-m", "tests.faults.job", "--orchestrator", self.address,
            "--agent", f"127.0.0.1:{self.agent_ports[node]}", "--job", job, "--group", GROUP,
            "--log", str(self.log_of(job)), "--store", str(self.root / f"{job}.store"),
            "--mib", str(self.settings.mib), "--lease", str(self.settings.lease),
            "--seed", str(self.seed),
        ]  # fmt: skip

    def log_of(self, job: str) -> Path:
        return self.root / f"{job}.jsonl"

    @property
    def servers(self) -> list[Process]:
        return [*self.candidates, *self.agents.values()]

    @property
    def processes(self) -> list[Process]:
        return [*self.servers, *self.jobs.values()]

    def live_jobs(self) -> list[str]:
        return [job for job, p in self.jobs.items() if not p.retired]

    # --- the run ------------------------------------------------------------------------

    async def start(self) -> None:
        if self.settings.ha:
            await create_database(self.settings.postgres_url, self.database)
            target = sa.engine.make_url(self.settings.postgres_url)
            for _ in self.candidates:
                proxy = Proxy(target.host or "127.0.0.1", target.port or 5432)
                await proxy.start()
                self.proxies.append(proxy)
        for i, candidate in enumerate(self.candidates):
            candidate.argv = self._orchestrator_command(i)
            candidate.start()
        for agent in self.agents.values():
            agent.start()
        await self._orchestrator_ready()
        await self.until(self._group_spans_nodes, self.settings.ready_timeout, "group nodes")
        for job in self.jobs.values():
            job.start()

    async def _group_spans_nodes(self) -> bool:
        with contextlib.suppress(TimeSliceError):
            status = await self._client.get_status(timeout_sec=2.0)
            return set(status.group.nodes) == set(NODES)
        return False

    async def _orchestrator_ready(self) -> None:
        async def answers() -> bool:
            with contextlib.suppress(TimeSliceError):
                await self._client.list_groups(timeout_sec=1.0)
                return True
            return False

        await self.until(answers, self.settings.ready_timeout, "the orchestrator answering")

    async def until(self, done: Callable[[], object], timeout: float, what: str) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            outcome = done()
            if asyncio.iscoroutine(outcome):
                outcome = await outcome
            if outcome:
                return True
            await asyncio.sleep(POLL)
        self.violations.append(f"waited {timeout:g} s for {what} in vain")
        return False

    def held_since(self, since: float) -> bool:
        """Whether every live job has a confirmed hold that began at `since` or later."""
        for job in self.live_jobs():
            records, _ = checker.read_log(self.log_of(job))
            if not any(r["kind"] == "hold" and r["confirmed"] and r["start"] >= since
                       for r in records):  # fmt: skip
                return False
        return True

    async def supervise(self) -> None:
        """What an operator does while the faults run: notice a process that died on
        its own, and reset a job quarantined by a failed snapshot once it runs again."""
        while True:
            await asyncio.sleep(POLL)
            self.check_exits()
            try:
                status = await self._client.get_status(timeout_sec=2.0)
            except TimeSliceError:
                continue
            for job in status.group.quarantined_jobs:
                process = self.jobs.get(job)
                if process is None or not process.alive or process.stopped:
                    continue
                with contextlib.suppress(TimeSliceError):
                    if await self._client.reset_job(job_id=job, timeout_sec=2.0):
                        self.resets += 1

    def check_exits(self) -> None:
        for process in self.processes:
            if process.popen is None or process.alive or process.expected_exit:
                continue
            process.expected_exit = process.retired = True  # reported once
            self.violations.append(
                f"{process.name} exited on its own with status {process.returncode}:\n"
                f"{process.tail()}"
            )

    async def inject(self, fault: Fault) -> str:
        """Carry out one fault; say what was done."""
        if fault.kind in schedule.ACTIVE_KINDS:
            return await self._fault_active(fault)
        if fault.kind == schedule.KILL_ORCHESTRATOR:
            await self.orchestrator.kill()
            await asyncio.sleep(fault.down)
            self.orchestrator.start()
            await self._orchestrator_ready()
            return fault.kind
        if fault.kind == schedule.KILL_AGENT:
            agent = self.agents[fault.target]
            await agent.kill()
            await asyncio.sleep(fault.down)
            agent.start()
            await port_open(self.agent_ports[fault.target], self.settings.ready_timeout)
            return f"{fault.kind} {fault.target}"
        job = await self._target(fault.target)
        if job is None:
            return f"{fault.kind}: no live job to aim at"
        process = self.jobs[job]
        if fault.kind == schedule.STOP_HOLDER:
            process.signal(signal.SIGSTOP)
            await asyncio.sleep(fault.down)
            process.signal(signal.SIGCONT)
            return f"{fault.kind} {job}"
        await process.kill()
        if not fault.restart and len(self.live_jobs()) > 2:
            process.retired = True
            return f"{fault.kind} {job} for good"
        await asyncio.sleep(fault.down)
        process.start()
        return f"{fault.kind} {job}"

    async def active(self, timeout: float, besides: int | None = None) -> int | None:
        """The candidate that says it is active (other than `besides`), asked every
        few hundredths of a second for up to `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            for i, (process, client) in enumerate(zip(self.candidates, self._asking, strict=True)):
                if i == besides or not process.alive or process.stopped:
                    continue
                with contextlib.suppress(TimeSliceError):
                    if (await client.get_leadership(timeout_sec=0.5)).role == "active":
                        return i
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.02)

    async def _fault_active(self, fault: Fault) -> str:
        """SIGKILL, SIGSTOP or cut the active off from PostgreSQL; wait for another
        candidate to take over; bring the struck one back as its supervisor would
        (it must have exited non-zero on its own after a stop or a cut)."""
        lease, wait = self.settings.leader_lease, self.settings.leader_lease + 10.0
        i = await self.active(self.settings.ready_timeout)
        if i is None:
            self.violations.append(f"{fault.kind}: no orchestrator is active")
            return f"{fault.kind}: no active"
        before = await self._token()
        process, struck = self.candidates[i], time.time()
        if fault.kind == schedule.KILL_ACTIVE:
            await process.kill()
        elif fault.kind == schedule.STOP_ACTIVE:
            process.signal(signal.SIGSTOP)
        else:
            process.expected_exit = True  # it steps down, and exits non-zero
            self.proxies[i].cut()
        new = await self.active(wait, besides=i)
        took = time.time() if new is not None else None
        self.failovers.append(Failover(fault.kind, struck, took))
        if new is None:
            self.violations.append(f"{fault.kind}: no candidate took over in {wait:g} s")
        if fault.kind == schedule.CUT_ACTIVE:
            await self._stepped_down(process, lease + 5.0, "cut off from PostgreSQL")
        await asyncio.sleep(max(0.0, struck + fault.down - time.time()))
        if fault.kind == schedule.STOP_ACTIVE:
            process.expected_exit = True
            process.signal(signal.SIGCONT)
            await self._stepped_down(process, lease + 5.0, "woken past its lease")
        elif fault.kind == schedule.CUT_ACTIVE:
            self.proxies[i].heal()
        process.start()
        # Back once it listens (as a standby), as a supervisor's probe would say.
        if not await port_open(self.ports[i], self.settings.ready_timeout):
            self.violations.append(f"{process.name} did not listen again after {fault.kind}")
        # The next fault only once the new active has granted: each failover is timed
        # on its own (the journal says when; the bound is checked after the run).
        await self.until(self._granted_above(before), lease + 10.0, f"a grant after {fault.kind}")
        after = f" -> {self.candidates[new].name}" if new is not None else ""
        return f"{fault.kind} {process.name}{after}"

    async def _token(self) -> int:
        """The group's newest fencing token, as the active says (0: no answer)."""
        with contextlib.suppress(TimeSliceError):
            status = await self._client.get_status(timeout_sec=2.0, lock_only=True)
            return status.group.fencing_token
        return 0

    def _granted_above(self, token: int) -> Callable[[], Awaitable[bool]]:
        async def granted() -> bool:
            return await self._token() > token

        return granted

    async def _stepped_down(self, process: Process, timeout: float, why: str) -> None:
        code = await process.wait(timeout)
        if code is None:
            self.violations.append(f"{process.name}, {why}, still runs after {timeout:g} s")
            await process.kill()
        elif code == 0:
            self.violations.append(f"{process.name}, {why}, exited 0: it must fail")

    async def _target(self, target: str) -> str | None:
        """The job a fault aims at: the holder (asked of the orchestrator), or one named."""
        runnable = [j for j in self.live_jobs() if self.jobs[j].alive and not self.jobs[j].stopped]
        if not runnable:
            return None
        if target != schedule.HOLDER:
            return target if target in runnable else self.rng.choice(runnable)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            with contextlib.suppress(TimeSliceError):
                group = (await self._client.get_status(timeout_sec=2.0)).group
                if group.locking_job in runnable and group.group_state != GroupLockState.SWITCHING:
                    return group.locking_job
            await asyncio.sleep(0.05)
        return self.rng.choice(runnable)

    async def stop(self) -> None:
        """SIGTERM to the jobs, then to the servers: each server must exit 0 in time."""
        await asyncio.gather(*(job.terminate(5.0) for job in self.jobs.values()))
        codes = await asyncio.gather(
            *(server.terminate(self.settings.shutdown_timeout) for server in self.servers)
        )
        for server, code in zip(self.servers, codes, strict=True):
            if code != 0:
                what = "did not exit in time" if code is None else f"exited with {code}"
                self.violations.append(f"{server.name} {what} on SIGTERM:\n{server.tail()}")

    async def close(self) -> None:
        for process in self.processes:
            if process.alive:
                await process.kill()
        for client in (self._client, *self._asking):
            with contextlib.suppress(Exception):
                await client.close()
        for proxy in self.proxies:
            await proxy.close()


async def run_once(seed: int, settings: Settings, code: Code, keep: str = "failed") -> RunResult:
    """One run under seed `seed`'s plan, of the code at `code` (see `code_snapshot`).
    `keep`: "always", "failed" or "never" keep the run's folder (logs, journal)."""
    began = time.monotonic()
    nodes, jobs = NODES, settings.job_names()
    plan = schedule.plan_faults(
        seed, duration=settings.duration, nodes=nodes, jobs=jobs, lease=settings.lease,
        min_faults=settings.min_faults, max_faults=settings.max_faults,
        leader_lease=settings.leader_lease if settings.ha else None,
    )  # fmt: skip
    result = RunResult(seed, plan)
    root = Path(tempfile.mkdtemp(prefix=f"timeslice-faults-{seed}-"))
    run = Run(root, seed, settings, code)
    supervisor: asyncio.Task[None] | None = None
    try:
        await run.start()
        supervisor = asyncio.ensure_future(run.supervise())
        warm = await run.until(
            lambda: run.held_since(0.0), settings.warmup_timeout, "every job's first hold"
        )
        if warm:
            await _faults(run, plan, result)
            calm_start = time.time()
            await run.until(
                lambda: run.held_since(calm_start),
                settings.calm_timeout,
                "a confirmed hold of every live job after the last fault",
            )
        else:
            calm_start = time.time()
        supervisor.cancel()
        await asyncio.gather(supervisor, return_exceptions=True)
        run.check_exits()
        await run.stop()
        evidence = checker.Evidence(
            journal_url=run.journal_url,
            job_logs={job: run.log_of(job) for job in run.jobs},
            calm_start=calm_start,
            live_jobs=tuple(run.live_jobs()),
            epochs=_epochs(run),
        )
        report = await checker.check_run(evidence, GROUP)
        result.failovers = _failover_times(run.failovers, report.recovered, report.grants)
        bound = settings.leader_lease + 2.0
        for kind, _, first_grant in result.failovers:
            if first_grant is None or first_grant > bound:
                seen = "none" if first_grant is None else f"{first_grant:.2f} s"
                report.violations.append(
                    f"{kind}: the first grant of the new active came {seen} after the fault,"
                    f" over the leader lease plus 2 s ({bound:g} s)"
                )
        # The campaign's own waits already say when the jobs did not progress.
        result.violations = _unique([*run.violations, *report.violations])
        result.counts = report.counts
        result.counts["jobs reset"] = run.resets
        result.stale_seconds = report.stale_seconds
    except BaseException as exc:
        result.violations.append(f"the run failed: {exc!r}")
        if not isinstance(exc, Exception):
            raise
    finally:
        if supervisor is not None:
            supervisor.cancel()
            await asyncio.gather(supervisor, return_exceptions=True)
        await run.close()
        result.seconds = time.monotonic() - began
        if keep == "always" or (keep == "failed" and result.violations):
            result.kept = str(root)
            if settings.ha:
                result.kept += f" (journal: database {run.database})"
        else:
            shutil.rmtree(root, ignore_errors=True)
            if settings.ha:
                await drop_database(settings.postgres_url, run.database)
    return result


def _epochs(run: Run) -> tuple[int, int]:
    """How many epochs the journal may hold. One orchestrator: one per start. Several:
    the first active's, one per takeover after a fault of the active, and at most one
    per start of any candidate (a standby may also take over as the active stops)."""
    starts = sum(c.starts for c in run.candidates)
    if not run.settings.ha:
        return starts, starts
    return 1 + sum(f.took_over is not None for f in run.failovers), starts


def _failover_times(
    failovers: list[Failover], recovered: list[float], grants: list[float]
) -> list[tuple[str, float | None, float | None]]:
    """Per fault of the active: seconds from the fault to the journal's next epoch
    (the takeover) and to the first grant decided in it (announced to its job)."""
    times: list[tuple[str, float | None, float | None]] = []
    for f in failovers:
        began = next((t for t in sorted(recovered) if t >= f.struck), None)
        if began is None:
            times.append((f.kind, None, None))
            continue
        first = min((t for t in grants if t >= began), default=None)
        times.append((f.kind, began - f.struck, None if first is None else first - f.struck))
    return times


async def _faults(run: Run, plan: Plan, result: RunResult) -> None:
    began = time.monotonic()
    for fault in plan.faults:
        await asyncio.sleep(max(0.0, began + fault.at - time.monotonic()))
        at = time.monotonic() - began
        done = await run.inject(fault)
        result.done.append(f"{at:5.1f}s-{time.monotonic() - began:4.1f}s {done}")
        result.faults[fault.kind] += 1


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
