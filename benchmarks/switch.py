"""Switch latency: what the agents add to a handoff, and what moving contexts costs.

    python benchmarks/switch.py --json OUT [--rounds 200] [--mib 256] [--switches 5] [--quick]

In one run, side by side, every server in a process of its own:

  echo       a plain grpclib unary round trip (benchmarks/common.py's echo server):
             back to back (a share of them in each block below), and after the
             same pause as each Yield below (paced).
  handoff    an orchestrator whose group has no nodes: from job A sending Yield to
             job B's blocked Acquire returning (benchmarks/handoff.py's loop; B is
             another process and stamps the time itself).
  switch     the same loop on a second orchestrator whose group spans two nodes,
             each with its own agent process (noop backend, SQLite job table on
             disk), A and B registered with the noop backend: before B's Acquire
             returns, both agents snapshot A and restore B. Each round also
             switches back to A (A's next Acquire), unmeasured. A and B call
             through grpclib stubs, and in loops of their own through timeslice's
             client.
  hostmem    two host-memory workload processes (tests/workloads/hostmem_worker.py,
             --mib each) registered with one agent, on a group of that node;
             this process alternates them as holders: Yield sent -> the other's
             Acquire returned, against the bytes moved per switch (one workload
             written out to files, the other read back) and a plain numpy copy
             of as many bytes in this process.

The groups name their nodes by the agents' addresses (SetGroupNodes), so that no
switch waits for an agent to register; each agent is also in session with the
orchestrator, as in a deployment (`--orchestrator`).

Back-to-back echoes, plain handoffs and noop switches (both ways of calling) are
measured in interleaved blocks, so that all of them share the machine's
background load: each ratio divides figures of the same minutes. Both
orchestrators journal to SQLite files in a temporary directory with their
defaults (WAL, synchronous=FULL). The switching orchestrator's journal, read
after the loops, splits every measured switch where the orchestrator dated it:
A's Yield decided, the agents asked, their answers in (`split_switches`).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the benchmarks are imported as a package
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from benchmarks.common import (  # noqa: E402
    Child,
    Row,
    ServerProcess,
    add_common_arguments,
    describe,
    machine,
    measure_echo,
    memcpy_gbps,
    ms,
    now,
    receive,
    run_main,
    stats,
)
from benchmarks.handoff import (  # noqa: E402
    HANDOFF_GROUP,
    JOB_A,
    JOB_B,
    Handoffs,
    measure_handoffs,
)
from tests.workloads.worker_process import hostmem_worker  # noqa: E402
from timeslice.api.gen.snapshot_agent.v1alpha1 import SwitchJob  # noqa: E402
from timeslice.client import (  # noqa: E402
    AsyncSnapshotAgentClient,
    AsyncTimeSliceOrchestratorClient,
    WatchEvent,
    WatchEventKind,
    named_backend,
)
from timeslice.orchestrator import events as ev  # noqa: E402
from timeslice.orchestrator.events import Event  # noqa: E402
from timeslice.replay.source import read_journal  # noqa: E402

MiB = 1024**2
NODES = ("n1", "n2")
HOSTMEM_GROUP = "hostmem"
HOSTMEM_JOBS = ("w1", "w2")
DIRECT_GROUP = "direct"
DIRECT_JOBS = ("da", "db")
TARGET_ECHO_RTTS = 5.0


# --- servers, each in its own process ---------------------------------------------------


def serve_agent(conn: Connection, node: str, orchestrator: str, db: str) -> None:
    """Process entry point: the agent of `node`, in session with `orchestrator` (it
    registers and reports its jobs; the groups name it by its address)."""

    async def main() -> None:
        from timeslice.agent.server import Agent

        async with Agent(
            node_name=node,
            orchestrator=orchestrator,
            backends=("noop", "app_channel"),
            db=f"sqlite:///{db}",
        ) as agent:
            conn.send(agent.address)
            await receive(conn)

    asyncio.run(main())


# --- the measurements ---------------------------------------------------------------------


async def set_up_groups(
    address: str, nodes: Mapping[str, list[str]], noop: Mapping[str, tuple[str, ...]]
) -> None:
    """Name each group's nodes (agent addresses), and register the noop backend for
    the `noop` jobs of each group: the agents then snapshot and restore them."""
    async with AsyncTimeSliceOrchestratorClient(address, lease_ttl_sec=None) as client:
        for group, agents in nodes.items():
            await client.set_group_nodes(agents, group_id=group)
        for group, jobs in noop.items():
            for job in jobs:
                await client.register_job(named_backend("noop"), job_id=job, group_id=group)


@dataclass
class Split:
    """Each measured switch cut where the orchestrator's journal says it turned, in
    seconds (the table prints the p50 of each part)."""

    decided: list[float] = field(default_factory=list)  # A's Yield sent -> its Yield event
    asked: list[float] = field(default_factory=list)  # -> the agents asked (grant journaled)
    answered: list[float] = field(default_factory=list)  # -> every agent answered
    returned: list[float] = field(default_factory=list)  # -> B's Acquire returned


async def collect(address: str, group: str, into: list[WatchEvent]) -> None:
    """Every event of `group` until cancelled."""
    async with AsyncTimeSliceOrchestratorClient(address, lease_ttl_sec=None) as client:
        async for event in client.watch(group):
            into.append(event)


def split_switches(events: Iterable[Event], runs: Iterable[Handoffs], offset: float) -> Split:
    """Cut each sample of `runs` (switches of the handoff group from A to B) at the
    times the orchestrator journaled: A's Yield decided (`Yield.now`), the agents
    asked (`SwitchDone.began`: the grant and the switch's start written and acted
    on) and every agent's answer in (`SwitchDone.now`); B's Acquire returns once the
    switch's end is written too. `offset` maps the orchestrator's wall clock onto
    this process's `now()` (its time.time() - now()). Read after the run, the
    journal splits the very switches measured, at no cost to them; a sample whose
    events are not found is left out."""
    yields = sorted(
        e.now - offset
        for e in events
        if isinstance(e, ev.Yield) and e.group == HANDOFF_GROUP and e.job == JOB_A
    )
    switches = sorted(
        (e.began - offset, e.now - offset)
        for e in events
        if isinstance(e, ev.SwitchDone) and e.group == HANDOFF_GROUP and e.began and not e.error
    )
    split = Split()
    for run in runs:
        for sent, latency in zip(run.sent_at, run.latency, strict=True):
            returned = sent + latency
            at = bisect.bisect_left(yields, sent - _SLACK)
            if at == len(yields) or (decided := yields[at]) > returned:
                continue
            at = bisect.bisect_left(switches, (decided,))
            if at == len(switches) or (answered := switches[at][1]) > returned:
                continue
            asked = switches[at][0]
            split.decided.append(decided - sent)
            split.asked.append(asked - decided)
            split.answered.append(answered - asked)
            split.returned.append(returned - answered)
    return split


# Seconds a journaled time may seem to precede the moment it follows: this process
# maps the orchestrator's time.time() onto time.monotonic() with one reading of both.
_SLACK = 1e-4
# The parts of a switch `split_switches` tells apart, as the table names them.
SPLIT_PARTS = {
    "decided": "A's Yield sent -> the orchestrator's Yield event",
    "asked": "-> the agents asked (the grant and the switch's start written)",
    "answered": "-> every agent answered (both snapshot A and restore B)",
    "returned": "-> B's Acquire returned (the switch's end written, B answered)",
}


async def measure_agent_switches(
    orchestrator: str, agents: list[str], samples: int, warmup: int, settle: float
) -> list[float]:
    """The agents' part alone: this process sends SwitchGroup to every agent at once,
    as the orchestrator does, alternating two noop jobs of a group of their own;
    each sample after the same pause as a Yield. Seconds, sent -> every answer.

    The agents take only fencing tokens their orchestrator issued: the group's
    tokens are drawn from it first (a grant each, on a group without nodes
    there), so the samples do not include the agents' question to the
    orchestrator that a real switch's new token costs."""
    jobs = [SwitchJob(job_id=job, backend_config=named_backend("noop")) for job in DIRECT_JOBS]
    times = []
    async with AsyncTimeSliceOrchestratorClient(
        orchestrator, "direct-tokens", DIRECT_GROUP, lease_ttl_sec=None
    ) as issuer:
        for _ in range(warmup + samples):
            await issuer.acquire()
            await issuer.release()
    tokens = iter(range(1, warmup + samples + 1))
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(AsyncSnapshotAgentClient(address)) for address in agents
        ]
        for i in range(warmup + samples):
            await asyncio.sleep(settle)
            target, token = DIRECT_JOBS[i % 2], next(tokens)
            t0 = now()
            answers = await asyncio.gather(
                *(
                    c.switch_group(DIRECT_GROUP, target, token, jobs=jobs, timeout_sec=30)
                    for c in clients
                )
            )
            took = now() - t0
            if any(not a.restored and i > 0 for a in answers):
                raise RuntimeError(f"SwitchGroup to {target} did not restore it: {answers}")
            if i >= warmup:
                times.append(took)
    return times


@dataclass
class HostMemSwitches:
    latency: list[float]  # Yield sent -> the other's Acquire returned
    reported_bytes: list[int]  # switch_bytes of each measured GRANTED event
    first_grant: float  # the first Acquire: the other workload written out only
    verified: dict[str, bool]


async def measure_hostmem(
    address: str,
    agent: str,
    mib: int,
    switches: int,
    settle: float,
    store: str,
    *options: str,
) -> HostMemSwitches:
    """Two workloads on one agent (tests/workloads/hostmem_worker.py processes, with
    `options`), alternating as the holder of their group; each writes its arrays
    under `store`."""
    events: list[WatchEvent] = []
    async with contextlib.AsyncExitStack() as stack:
        workers = {
            job: await stack.enter_async_context(
                hostmem_worker(agent, job, HOSTMEM_GROUP, mib, seed, Path(store), *options)
            )
            for seed, job in enumerate(HOSTMEM_JOBS)
        }
        clients = {
            job: await stack.enter_async_context(
                AsyncTimeSliceOrchestratorClient(
                    address, job, HOSTMEM_GROUP, lease_ttl_sec=None, call_timeout_sec=60
                )
            )
            for job in HOSTMEM_JOBS
        }
        watcher = asyncio.create_task(collect(address, HOSTMEM_GROUP, events))
        stack.push_async_callback(_cancel, watcher)
        await asyncio.sleep(0.2)  # the watch is open
        holder, waiter = HOSTMEM_JOBS
        t0 = now()
        await clients[holder].acquire()
        first = now() - t0
        latency, tokens = [], []
        verified = {}
        for i in range(switches + 1):
            call = asyncio.ensure_future(_acquire(clients[waiter]))
            while waiter not in (await clients[holder].get_status()).group.waiting_jobs:
                if call.done():
                    call.result()
                await asyncio.sleep(0.002)
            await asyncio.sleep(settle)
            t0 = now()
            await clients[holder].release()
            token = await call
            took = now() - t0
            if i < switches:
                latency.append(took)
                tokens.append(token)
            holder, waiter = waiter, holder
            if i >= switches - 1:  # each workload, once it holds the group again
                verified[holder] = bool((await workers[holder].ask("verify")).get("ok"))
        await clients[holder].release()
        await asyncio.sleep(0.2)  # the last events arrive
    moved = {e.fencing_token: e.switch_bytes for e in events if e.kind == WatchEventKind.GRANTED}
    return HostMemSwitches(latency, [moved.get(t, 0) for t in tokens], first, verified)


def merge_hostmem(runs: list[HostMemSwitches]) -> HostMemSwitches:
    """The switches of several runs as one; the first run's first grant, every
    run's workloads checked."""
    return HostMemSwitches(
        [t for r in runs for t in r.latency],
        [b for r in runs for b in r.reported_bytes],
        runs[0].first_grant,
        {f"{job} (run {i})": ok for i, r in enumerate(runs) for job, ok in r.verified.items()},
    )


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _acquire(client: AsyncTimeSliceOrchestratorClient) -> int:
    return (await client.acquire()).fencing_token


# --- the run --------------------------------------------------------------------------------


def merge(runs: list[Handoffs]) -> Handoffs:
    merged = Handoffs([], [], [], [])
    for run in runs:
        merged.latency += run.latency
        merged.yield_rtt += run.yield_rtt
        merged.sent_at += run.sent_at
        merged.echo += run.echo
    return merged


async def run(args: argparse.Namespace) -> dict[str, Any]:
    settle = args.settle_ms / 1000
    blocks = max(1, min(args.blocks, args.rounds))
    per_block = [args.rounds // blocks + (i < args.rounds % blocks) for i in range(blocks)]
    with tempfile.TemporaryDirectory(prefix="timeslice-bench-") as tmp:
        async with contextlib.AsyncExitStack() as stack:
            echo = await stack.enter_async_context(ServerProcess("echo"))
            plain = await stack.enter_async_context(
                ServerProcess("orchestrator", f"{tmp}/plain.db")
            )
            switching = (
                await stack.enter_async_context(ServerProcess("orchestrator", f"{tmp}/switch.db"))
            ).address
            agents = [
                (
                    await stack.enter_async_context(
                        Child(serve_agent, node, switching, f"{tmp}/agent-{node}.db",
                              name=f"bench-agent-{node}")
                    )
                ).address
                for node in NODES
            ]  # fmt: skip
            await set_up_groups(
                switching,
                {HANDOFF_GROUP: agents, HOSTMEM_GROUP: agents[:1]},
                {HANDOFF_GROUP: (JOB_A, JOB_B)},
            )

            back_to_back: list[float] = []
            handoffs, switches, client_switches = [], [], []
            for n in per_block:  # interleaved: all share the same background load
                back_to_back += await measure_echo(
                    echo.address, max(1, args.echoes // blocks), args.warmup
                )
                handoffs.append(
                    await measure_handoffs(plain.address, n, args.warmup, settle, echo.address)
                )
                switches.append(
                    await measure_handoffs(switching, n, args.warmup, settle, echo.address)
                )
                client_switches.append(
                    await measure_handoffs(
                        switching, n, args.warmup, settle, echo.address, through_client=True
                    )
                )
            direct = await measure_agent_switches(
                switching, agents, args.rounds, args.warmup, settle
            )
            # The switching orchestrator's journal, read as it runs, splits its switches.
            journal = await read_journal(f"sqlite:///{tmp}/switch.db")
            events = [event for _, _, event in journal.rows]
            offset = time.time() - now()
            splits = {
                "stubs": split_switches(events, switches, offset),
                "client": split_switches(events, client_switches, offset),
            }
            hostmem = whole = None
            if args.switches > 0:
                # Tag by tag (the next one in as the other goes out) and moved whole,
                # in the order ABBA, so that a drift of the machine falls on both alike.
                runs: dict[bool, list[HostMemSwitches]] = {True: [], False: []}
                for tagged in (True, False, False, True):
                    options = () if tagged else ("--one-step",)
                    runs[tagged].append(await measure_hostmem(
                        switching, agents[0], args.mib, args.switches, settle, tmp, *options
                    ))  # fmt: skip
                hostmem, whole = (merge_hostmem(runs[tagged]) for tagged in (True, False))
    handoff, switch, client = merge(handoffs), merge(switches), merge(client_switches)
    echo_p50 = statistics.median(back_to_back)
    paced = handoff.echo + switch.echo + client.echo
    paced_p50 = statistics.median(paced)
    handoff_p50 = statistics.median(handoff.latency)
    switch_p50 = statistics.median(switch.latency)
    added = switch_p50 - handoff_p50
    result: dict[str, Any] = {
        **stats("echo", back_to_back),
        **stats("echo_paced", paced),
        **stats("handoff", handoff.latency),
        **stats("switch_noop", switch.latency),
        **stats("switch_noop_client", client.latency),
        **stats("agents_switch_group", direct),
        **stats("yield_rtt_handoff", handoff.yield_rtt),
        **stats("yield_rtt_switch", switch.yield_rtt),
        "switch_noop_over_echo": switch_p50 / echo_p50,
        "switch_noop_client_over_echo": statistics.median(client.latency) / echo_p50,
        "switch_added_ms": added * ms,
        "switch_added_echo_rtts": added / echo_p50,
        "switch_noop_over_echo_paced": switch_p50 / paced_p50,
        "switch_added_echo_paced_rtts": added / paced_p50,
        "handoff_over_echo": handoff_p50 / echo_p50,
        "target_echo_rtts": TARGET_ECHO_RTTS,
    }
    result["target_met_switch_over_echo"] = result["switch_noop_over_echo"] <= TARGET_ECHO_RTTS
    result["target_met_added_over_echo"] = result["switch_added_echo_rtts"] <= TARGET_ECHO_RTTS
    for way, split in splits.items():
        if split.decided:
            result[f"switch_split_{way}_p50_ms"] = {
                part: statistics.median(getattr(split, part)) * ms for part in SPLIT_PARTS
            }
            result[f"switch_split_{way}_samples"] = len(split.decided)
    if hostmem is not None:
        workload_bytes = args.mib * MiB
        computed = 2 * workload_bytes  # one workload written out, the other read back
        reported = int(statistics.median(hostmem.reported_bytes))
        moved = reported if reported > 0 else computed
        switch_s = statistics.median(hostmem.latency)
        copy = memcpy_gbps(moved, max(5, args.switches))
        result.update(
            hostmem_switch_p50_ms=switch_s * ms,
            hostmem_switch_max_ms=max(hostmem.latency) * ms,
            hostmem_first_grant_ms=hostmem.first_grant * ms,
            switch_bytes=moved,
            switch_bytes_source=(
                "switch_bytes of the orchestrator's Watch GRANTED events (as the agents report)"
                if reported > 0
                else "computed: 2 x workload size (the Watch reported none)"
            ),
            switch_bytes_reported=hostmem.reported_bytes,
            switch_bytes_computed=computed,
            switch_gbps=moved / switch_s / 1e9,
            memcpy_gbps=copy,
            workloads_verified=hostmem.verified,
            hostmem_switches_measured=len(hostmem.latency),
        )
        result["switch_over_memcpy"] = result["switch_gbps"] / copy
    if whole is not None:
        result.update(
            hostmem_whole_switch_p50_ms=statistics.median(whole.latency) * ms,
            hostmem_whole_switch_max_ms=max(whole.latency) * ms,
            workloads_whole_verified=whole.verified,
        )
        result["pipelined_over_whole"] = (
            result["hostmem_switch_p50_ms"] / result["hostmem_whole_switch_p50_ms"]
        )
    result["parameters"] = {
        "rounds": args.rounds,
        "blocks": blocks,
        "warmup": args.warmup,
        "echoes_back_to_back": max(1, args.echoes // blocks) * blocks,
        "settle_ms": args.settle_ms,
        "mib": args.mib,
        "switches": args.switches,
        "quick": args.quick,
        "nodes": list(NODES),
        "journal": "sqlite file in a temp dir, WAL, synchronous=FULL (orchestrators)",
        "agent_job_table": "sqlite file in a temp dir, WAL, synchronous=NORMAL (each agent)",
        "transport": "grpclib over TCP loopback; every server in its own process",
    }
    result["machine"] = machine()
    return result


# --- report -----------------------------------------------------------------------------------


def print_table(r: dict[str, Any]) -> None:
    p = r["parameters"]
    print(f"timeslice switch benchmark: {describe(r['machine'])}")
    print(
        f"{p['rounds']} handoffs and {p['rounds']} noop switches in {p['blocks']} interleaved "
        f"blocks; pause before each Yield and paced echo: {p['settle_ms']:g} ms"
    )
    print()
    print(f"{'figure':56} {'ours':>10} {'baseline':>10} {'ratio':>8}")

    def row(label: str, ours: float, base: float, unit: str = "ms") -> None:
        ratio = ours / base if base else math.nan
        print(f"{label:56} {ours:8.3f}{unit:>2} {base:8.3f}{unit:>2} {ratio:7.2f}x")

    echo = r["echo_p50_ms"]
    print(f"{'grpclib echo p50 / p99 (back to back)':56} {echo:8.3f}ms {r['echo_p99_ms']:8.3f}ms")
    print(f"{'grpclib echo p50 / p99 (paced)':56} {r['echo_paced_p50_ms']:8.3f}ms {r['echo_paced_p99_ms']:8.3f}ms")  # fmt: skip
    row("handoff p50, no nodes  (vs echo)", r["handoff_p50_ms"], echo)
    row("switch p50, 2 agents, noop  (vs echo)", r["switch_noop_p50_ms"], echo)
    row("switch p99, 2 agents, noop  (vs echo p99)", r["switch_noop_p99_ms"], r["echo_p99_ms"])
    row("switch p50 through timeslice's client  (vs echo)", r["switch_noop_client_p50_ms"], echo)
    row("switch p50  (vs handoff p50)", r["switch_noop_p50_ms"], r["handoff_p50_ms"])
    row("agents alone: SwitchGroup to both, p50 (vs echo)", r["agents_switch_group_p50_ms"], echo)
    row("added by the agents: switch p50 - handoff p50 (vs echo)", r["switch_added_ms"], echo)
    row("switch p50  (vs paced echo)", r["switch_noop_p50_ms"], r["echo_paced_p50_ms"])
    row("added by the agents  (vs paced echo)", r["switch_added_ms"], r["echo_paced_p50_ms"])
    row("A's Yield round trip p50: switch (vs handoff)", r["yield_rtt_switch_p50_ms"], r["yield_rtt_handoff_p50_ms"])  # fmt: skip
    if "hostmem_switch_p50_ms" in r:
        gib = r["switch_bytes"] / 1024**3
        print(
            f"{'host-memory switch: ' + format(gib, '.2f') + ' GiB moved, GB/s (vs numpy copy)':56} "
            f"{r['switch_gbps']:8.3f}  {r['memcpy_gbps']:8.3f}   {r['switch_over_memcpy']:7.2f}x"
        )
    if "hostmem_whole_switch_p50_ms" in r:
        row("host-memory switch p50: tag by tag (vs moved whole)", r["hostmem_switch_p50_ms"],
            r["hostmem_whole_switch_p50_ms"])  # fmt: skip
    print()
    target = r["target_echo_rtts"]
    for label, key in [
        ("switch noop p50 / echo p50", "switch_noop_over_echo"),
        ("switch noop p50 through timeslice's client / echo p50", "switch_noop_client_over_echo"),
        ("(switch p50 - handoff p50) / echo p50", "switch_added_echo_rtts"),
    ]:
        verdict = "met" if r[key] <= target else "NOT met"
        print(f"target: {label} <= {target:g}: {r[key]:.2f} -> {verdict}")
    ways = [w for w in ("stubs", "client") if f"switch_split_{w}_p50_ms" in r]
    if ways:
        print()
        print("where a noop switch's time goes, p50 of each part, as the orchestrator's journal")
        print("dates each measured switch (through the stubs; through timeslice's client):")
        for part, label in SPLIT_PARTS.items():
            values = "  ".join(f"{r[f'switch_split_{w}_p50_ms'][part]:7.3f} ms" for w in ways)
            print(f"  {label:66} {values}")
        counted = ", ".join(str(r[f"switch_split_{w}_samples"]) for w in ways)
        print(f"  switches split: {counted}")
    if "hostmem_switch_p50_ms" in r:
        print()
        print(
            f"host memory: 2 workloads of {p['mib']} MiB on one agent, median of "
            f"{r['hostmem_switches_measured']} switches: {r['hostmem_switch_p50_ms']:.1f} ms (max {r['hostmem_switch_max_ms']:.1f}; "
            f"first grant {r['hostmem_first_grant_ms']:.1f} ms)"
        )
        print(f"  bytes per switch: {r['switch_bytes']} ({r['switch_bytes_source']}; "
              f"computed {r['switch_bytes_computed']})")  # fmt: skip
        print(f"  workloads byte-exact after switching: {r['workloads_verified']}")
    if "hostmem_whole_switch_p50_ms" in r:
        print(f"  moved whole instead: {r['hostmem_whole_switch_p50_ms']:.1f} ms (max "
              f"{r['hostmem_whole_switch_max_ms']:.1f}), byte-exact: "
              f"{r['workloads_whole_verified']}")  # fmt: skip


def summary(r: dict[str, Any]) -> list[Row]:
    """The suite's rows: a noop switch against the echo and the plain handoff, the
    agents' part, and host-memory switches against a copy."""
    p = r["parameters"]
    echo = "baseline: grpclib echo p50, back to back"
    rows = [
        Row("noop switch p50, 2 agents: Yield sent -> B's Acquire returned",
            r["switch_noop_p50_ms"], r["echo_p50_ms"], "ms",
            f"{echo}; {p['rounds']} switches"),
        Row("noop switch p50 through timeslice's client", r["switch_noop_client_p50_ms"],
            r["echo_p50_ms"], "ms", f"{echo}; {p['rounds']} switches, A and B through "
            "timeslice's client (above: through grpclib stubs)"),
        Row("noop switch p50 against a handoff without nodes", r["switch_noop_p50_ms"],
            r["handoff_p50_ms"], "ms", "baseline: the same loop on a group without nodes"),
        Row("added by the agents: switch p50 - handoff p50", r["switch_added_ms"],
            r["echo_p50_ms"], "ms", echo),
        Row("noop switch p50 against a paced echo", r["switch_noop_p50_ms"],
            r["echo_paced_p50_ms"], "ms", "baseline: grpclib echo after the same pause"),
    ]  # fmt: skip
    if "switch_gbps" in r:
        gib = r["switch_bytes"] / 1024**3
        rows.append(
            Row("host-memory switch bandwidth (one out, one back in)", r["switch_gbps"],
                r["memcpy_gbps"], "GB/s",
                f"baseline: a plain numpy copy of as many bytes ({gib:.2f} GiB); "
                f"median of {r['hostmem_switches_measured']}")
        )  # fmt: skip
    if "hostmem_whole_switch_p50_ms" in r:
        rows.append(
            Row("host-memory switch p50, pipelined tag by tag", r["hostmem_switch_p50_ms"],
                r["hostmem_whole_switch_p50_ms"], "ms",
                "baseline: the same workloads moved whole (the restore after the snapshot); "
                f"4 tags (1/2, 1/4, 3/16, 1/16 of the bytes); median of "
                f"{r['hostmem_switches_measured']} each, in runs ordered ABBA")
        )  # fmt: skip
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--rounds", type=int, default=200, help="measured handoffs and switches")
    parser.add_argument("--blocks", type=int, default=2, help="interleaved blocks of each")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured rounds per batch")
    parser.add_argument("--echoes", type=int, default=500, help="back-to-back echoes measured")
    parser.add_argument(
        "--settle-ms", type=float, default=5.0, help="pause after the waiter is queued"
    )
    parser.add_argument("--mib", type=int, default=256, help="size of each host-memory workload")
    parser.add_argument(
        "--switches", type=int, default=5, help="measured host-memory switches (0: none)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.warmup, args.echoes = min(args.rounds, 20), min(args.warmup, 5), 100
        args.mib = min(args.mib, 16)
        args.switches = min(args.switches, 3)
    if args.rounds < 1 or args.mib < 1 or args.switches < 0 or args.warmup < 0:
        parser.error("--rounds and --mib must be positive; --switches, --warmup not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    return run_main(parse_args(argv), run, print_table)


if __name__ == "__main__":
    sys.exit(main())
