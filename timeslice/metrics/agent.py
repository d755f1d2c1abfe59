"""The agent's metrics: its operations as they finish, and at each scrape its
jobs by state and the workload channels open.

The engine hands every operation that ends (`Done`: complete, failed, timed
out, interrupted) to `AgentMetrics.finished`; nothing else on an operation's
path counts anything. Labels are bounded: backends (those installed), kinds
(snapshot, restore), outcomes (complete, failed) and job states (five).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from timeslice.agent.state import JobState, Operation, OpStatus
from timeslice.metrics.labels import DURATION_BUCKETS


class AgentMetrics:
    """Every metric family of one agent, in a registry of its own.

    `job_states()` gives every job's state, `channels()` the workload channels
    open, both read at each scrape."""

    def __init__(
        self,
        job_states: Callable[[], Iterable[JobState]],
        channels: Callable[[], int],
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self._children: dict[tuple[str, str, str], tuple[Any, Any, Any, Any]] = {}
        labels = ["backend", "kind", "outcome"]
        r = self.registry
        self.operations = Counter(
            "timeslice_agent_operations",
            "Snapshots and restores that ended, by backend, kind and outcome.",
            labels,
            registry=r,
        )
        self.duration = Histogram(
            "timeslice_agent_operation_duration_seconds",
            "How long a snapshot or restore took, from its start to its end.",
            labels,
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.moved = Counter(
            "timeslice_agent_moved_bytes",
            "Bytes a snapshot or restore moved (what its backend reported).",
            labels,
            registry=r,
        )
        self.device = Counter(
            "timeslice_agent_device_bytes",
            "Accelerator memory a snapshot freed or a restore filled (as reported).",
            labels,
            registry=r,
        )
        r.register(_Live(job_states, channels))

    def finished(self, op: Operation) -> None:
        """`op` ended (its status, end and bytes are set)."""
        outcome = "complete" if op.status is OpStatus.COMPLETE else "failed"
        key = (op.backend, str(op.kind), outcome)
        children = self._children.get(key)
        if children is None:
            children = (
                self.operations.labels(*key),
                self.duration.labels(*key),
                self.moved.labels(*key),
                self.device.labels(*key),
            )
            self._children[key] = children
        count, duration, moved, device = children
        count.inc()
        duration.observe(max(0.0, (op.finished or op.started) - op.started))
        moved.inc(op.storage_bytes or 0)
        device.inc(op.device_bytes or 0)


class _Live(Collector):
    def __init__(
        self, job_states: Callable[[], Iterable[JobState]], channels: Callable[[], int]
    ) -> None:
        self.job_states = job_states
        self.channels = channels

    def collect(self) -> Iterator[Any]:
        counts = dict.fromkeys(JobState, 0)
        for state in self.job_states():
            counts[state] += 1
        jobs = GaugeMetricFamily(
            "timeslice_agent_jobs", "Jobs the agent knows, by state.", labels=["state"]
        )
        for state, count in counts.items():
            jobs.add_metric([state.value], count)
        yield jobs
        yield GaugeMetricFamily(
            "timeslice_agent_workload_channels_open",
            "Workload channels registered and open now.",
            value=self.channels(),
        )
