"""The orchestrator's metrics, derived from what the lock table decides.

Nothing in the table or the shells counts anything: the journal engine hands
each event with its effects to `OrchestratorMetrics.observe` once they are acted
on (durable), and the time of each journal commit to `committed`. Everything
else is read when Prometheus scrapes: the queue depths from the table, the
agents in session from the directory, and the holds still open from what
`observe` saw begin. So the cost on a decision's path is a few dictionary
updates, and with metrics off (`metrics_port` 0) this module is never imported.

A switch is timed as the replay times it (`timeslice.replay.from_journal`): from the
decision that started it (the event whose effects hold `SwitchStarted`) to its
`SwitchDone`; its snapshot phase lasts as long as the slowest job's snapshot on
the slowest node, then its restore phase, and the control overhead is the rest
(journal writes, dispatch, answers). A grant's queue wait is its Acquire's wait
less the switch it waited through.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from timeslice.metrics.labels import (
    COMMIT_BUCKETS,
    DURATION_BUCKETS,
    V1ALPHA1_BUCKETS,
    JobLabels,
)
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.events import Effect, Event
from timeslice.orchestrator.leadership import Leadership, Role

SNAPSHOT, RESTORE = "snapshot", "restore"


class OrchestratorMetrics:
    """Every metric family of one orchestrator, in a registry of its own.

    `queue_depths()` gives (group, waiters) for every group, `agents()` the
    number of agents in session and `leadership()` where the orchestrator stands
    among the candidates on its journal, all read at each scrape."""

    def __init__(
        self,
        queue_depths: Callable[[], Iterable[tuple[str, int]]],
        agents: Callable[[], int],
        leadership: Callable[[], Leadership] = lambda: Leadership(role=Role.ACTIVE),
        *,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self.jobs = JobLabels()
        self._clock = clock
        self._children: dict[tuple[Any, ...], Any] = {}
        # group -> (token, job, since) of each live hold; group -> (token, decided)
        # of each switch under way.
        self._holds: dict[str, tuple[int, str, float]] = {}
        self._switches: dict[str, tuple[int, float]] = {}
        # Seconds of ended holds per group and per (group, job label); seconds
        # waited and switched per (group, job label).
        self._busy: dict[str, float] = {}
        self._held: dict[tuple[str, str], float] = {}
        self._waited: dict[tuple[str, str], float] = {}
        self._switching: dict[tuple[str, str], float] = {}
        self._switched: dict[tuple[str, int], float] = {}  # (group, token) -> its switch
        r = self.registry
        # The v1alpha1 system's four (same names, labels and buckets).
        self.acquire_wait = Histogram(
            "timeslice_orchestrator_acquire_wait_duration_seconds",
            "From an Acquire's arrival to its grant, with the context restored.",
            ["group_id"],
            buckets=V1ALPHA1_BUCKETS,
            registry=r,
        )
        self.agent_operation = Histogram(
            "timeslice_orchestrator_agent_operation_duration_seconds",
            "A snapshot or restore of a switch, as its agent reported it.",
            ["group_id", "job_id", "node", "operation"],
            buckets=V1ALPHA1_BUCKETS,
            registry=r,
        )
        self.deferred = Counter(
            "timeslice_orchestrator_deferred_snapshots",
            "Yields with nobody waiting: the context stays in place.",
            ["group_id"],
            registry=r,
        )
        # Ours.
        self.switch = Histogram(
            "timeslice_switch_duration_seconds",
            "A switch of contexts, from the decision to the next holder's context live"
            " (outcome ok) or the switch failing (failed).",
            ["group_id", "outcome"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.phase = Histogram(
            "timeslice_switch_phase_duration_seconds",
            "The parts of a handoff through a switch: queue_wait (queued before the"
            " decision), snapshot, restore, overhead (no agent working on it).",
            ["group_id", "phase"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.moved = Counter(
            "timeslice_switch_moved_bytes",
            "Bytes the agents moved in switches, by operation.",
            ["group_id", "operation"],
            registry=r,
        )
        self.grants = Counter(
            "timeslice_grants",
            "Grants; context restored (a switch brought it back) or live (it was loaded).",
            ["group_id", "context"],
            registry=r,
        )
        self.yields = Counter("timeslice_yields", "Yields.", ["group_id"], registry=r)
        self.revocations = Counter(
            "timeslice_revocations",
            "Grants that ended without a yield, by reason.",
            ["group_id", "reason"],
            registry=r,
        )
        self.departures = Counter(
            "timeslice_queue_departures",
            "Waiters that left a queue without a grant, by reason.",
            ["group_id", "reason"],
            registry=r,
        )
        self.quarantines = Counter(
            "timeslice_quarantines",
            "Jobs quarantined on a group (a failed snapshot or restore).",
            ["group_id"],
            registry=r,
        )
        self.commit = Histogram(
            "timeslice_journal_commit_duration_seconds",
            "One durable journal write (a batch of events).",
            buckets=COMMIT_BUCKETS,
            registry=r,
        )
        self.journaled = Counter(
            "timeslice_journal_events", "Events written to the journal.", registry=r
        )
        r.register(_Live(self, queue_depths, agents, leadership))

    # --- what the journal engine hands over -----------------------------------------

    def committed(self, seconds: float, events: int) -> None:
        """A journal write of `events` events took `seconds`."""
        self.commit.observe(seconds)
        self.journaled.inc(events)

    def observe(self, event: Event, effects: list[Effect]) -> None:
        """`event` was handled with `effects`, now durable and acted on."""
        if isinstance(event, ev.SwitchDone):
            self._switch_done(event, effects)
        for effect in effects:
            match effect:
                case ev.Granted():
                    self._granted(effect, event.now)
                case ev.Yielded(again=False):
                    self._ended(effect.group, effect.token, event.now)
                    self._child(self.yields, effect.group).inc()
                    if effect.snapshot_deferred:
                        self._child(self.deferred, effect.group).inc()
                case ev.Revoked():
                    self._ended(effect.group, effect.token, event.now)
                    reason = effect.reason.name.lower()
                    self._child(self.revocations, effect.group, reason).inc()
                case ev.SwitchStarted():
                    self._switches[effect.group] = (effect.token, event.now)
                case ev.LeftQueue():
                    reason = effect.reason.name.lower()
                    self._child(self.departures, effect.group, reason).inc()
                case ev.Quarantined():
                    self._child(self.quarantines, effect.group).inc()
                case _:
                    pass

    def seed(self, holders: Iterable[tuple[str, int, str, float]]) -> None:
        """The live holds a start finds in the journal: (group, token, job, since)."""
        for group, token, job, since in holders:
            self._holds[group] = (token, job, since)

    # --- the parts ----------------------------------------------------------------------

    def _child(self, family: Any, *labels: str) -> Any:
        """`family.labels(*labels)`, kept: the hot path pays a dict lookup."""
        key = (id(family), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = family.labels(*labels)
        return child

    def _granted(self, g: ev.Granted, now: float) -> None:
        if not g.must_deliver:
            return  # a holder asking again for a grant it took: nothing new
        held = self._holds.get(g.group)
        if held is not None and held[0] == g.token:
            return  # a grant made before a restart, claimed now: counted already
        if held is not None:  # a grant replacing one that ended unseen
            self._ended(g.group, held[0], now)
        self._holds[g.group] = (g.token, g.job, now)
        self._child(self.acquire_wait, g.group).observe(g.waited)
        switched = self._switched.pop((g.group, g.token), 0.0)
        key = (g.group, self.jobs(g.job))
        self._waited[key] = self._waited.get(key, 0.0) + max(0.0, g.waited - switched)
        context = "restored" if g.context_restored else "live"
        self._child(self.grants, g.group, context).inc()

    def _ended(self, group: str, token: int, now: float) -> None:
        held = self._holds.get(group)
        if held is None or held[0] != token:
            return
        del self._holds[group]
        seconds = max(0.0, now - held[2])
        self._busy[group] = self._busy.get(group, 0.0) + seconds
        key = (group, self.jobs(held[1]))
        self._held[key] = self._held.get(key, 0.0) + seconds

    def _switch_done(self, e: ev.SwitchDone, effects: list[Effect]) -> None:
        started = self._switches.get(e.group)
        if started is not None and started[0] == e.token:
            del self._switches[e.group]
            decided = started[1]
        elif e.began:
            decided = e.began  # a switch run again after a start: no decision seen
        else:
            return
        granted = next(
            (x for x in effects if isinstance(x, ev.Granted) and x.token == e.token), None
        )
        if not effects:
            return  # the table ignored it: that grant ended already
        total = max(0.0, e.now - decided)
        self._child(self.switch, e.group, "ok" if granted else "failed").observe(total)
        snapshots: dict[str, float] = {}
        restore = 0.0
        for node, job, kind, seconds, moved in e.steps:
            self._child(self.agent_operation, e.group, self.jobs(job), node, kind).observe(seconds)
            self._child(self.moved, e.group, kind).inc(moved)
            if kind == SNAPSHOT:
                snapshots[job] = max(snapshots.get(job, 0.0), seconds)
            elif kind == RESTORE:
                restore = max(restore, seconds)
        if granted is None:
            return
        snapshot = max(snapshots.values(), default=0.0)
        queued = max(0.0, granted.waited - total)
        for phase, seconds in (
            ("queue_wait", queued),
            (SNAPSHOT, snapshot),
            (RESTORE, restore),
            ("overhead", max(0.0, total - snapshot - restore)),
        ):
            self._child(self.phase, e.group, phase).observe(seconds)
        key = (e.group, self.jobs(granted.job))
        self._switching[key] = self._switching.get(key, 0.0) + total
        # `_granted` (next, from the same effects) counts the wait less this switch.
        self._switched[(e.group, e.token)] = total

    def collect_live(self) -> Iterator[tuple[str, str, float]]:
        """(group, job label, seconds) of every hold open now."""
        now = self._clock()
        for group, (_, job, since) in self._holds.items():
            yield group, self.jobs(job), max(0.0, now - since)


class _Live(Collector):
    """What a scrape reads now: the orchestrator's role, queue depths, agents in
    session, and the seconds held, waited and switched (ended holds with those
    still open)."""

    def __init__(
        self,
        metrics: OrchestratorMetrics,
        queue_depths: Callable[[], Iterable[tuple[str, int]]],
        agents: Callable[[], int],
        leadership: Callable[[], Leadership],
    ) -> None:
        self.metrics = metrics
        self.queue_depths = queue_depths
        self.agents = agents
        self.leadership = leadership

    def collect(self) -> Iterator[Any]:
        m = self.metrics
        standing = self.leadership()
        role = GaugeMetricFamily(
            "timeslice_orchestrator_role",
            "1 for this orchestrator's role among the candidates on its journal.",
            labels=["role"],
        )
        for each in Role:
            role.add_metric([each.value], 1.0 if each is standing.role else 0.0)
        yield role
        yield GaugeMetricFamily(
            "timeslice_orchestrator_lease_epoch",
            "The leader lease's epoch (0: no lease, the only writer).",
            value=standing.epoch,
        )
        yield GaugeMetricFamily(
            "timeslice_orchestrator_lease_left_seconds",
            "What the leader lease has left as last known (0: none).",
            value=standing.left,
        )
        depth = GaugeMetricFamily(
            "timeslice_orchestrator_queue_depth", "Jobs waiting for a group.", labels=["group_id"]
        )
        for group, waiting in self.queue_depths():
            depth.add_metric([group], waiting)
        yield depth
        yield GaugeMetricFamily(
            "timeslice_agents_connected", "Agents in session now.", value=self.agents()
        )
        busy = dict(m._busy)
        held = dict(m._held)
        for group, job, seconds in m.collect_live():
            busy[group] = busy.get(group, 0.0) + seconds
            held[(group, job)] = held.get((group, job), 0.0) + seconds
        family = CounterMetricFamily(
            "timeslice_group_busy_seconds",
            "Seconds a group was held with the holder's context live: its rate is the"
            " accelerators' busy share.",
            labels=["group_id"],
        )
        for group, seconds in busy.items():
            family.add_metric([group], seconds)
        yield family
        for name, doc, values in (
            ("timeslice_job_held_seconds", "Seconds a job held a group, context live.", held),
            (
                "timeslice_job_waited_seconds",
                "Seconds a job waited in a group's queue before its grants (switches aside).",
                m._waited,
            ),
            (
                "timeslice_job_switching_seconds",
                "Seconds a job waited for switches that brought its context in.",
                m._switching,
            ),
        ):
            family = CounterMetricFamily(name, doc, labels=["group_id", "job_id"])
            for (group, job), seconds in values.items():
                family.add_metric([group, job], seconds)
            yield family
