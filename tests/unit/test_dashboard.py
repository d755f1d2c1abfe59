"""The Grafana dashboard (deploy/grafana/timeslice.json) reads only metrics that
the servers export, by their exposed names."""

from __future__ import annotations

import json
import re
from pathlib import Path

from timeslice.metrics.agent import AgentMetrics
from timeslice.metrics.orchestrator import OrchestratorMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "timeslice.json"


def exported() -> set[str]:
    """Every sample name the two servers can expose (histogram and counter
    suffixes included)."""
    registries = [
        OrchestratorMetrics(lambda: [("g", 1)], lambda: 1).registry,
        AgentMetrics(lambda: [], lambda: 0).registry,
    ]
    names: set[str] = set()
    for registry in registries:
        for family in registry.collect():
            names.add(family.name)
            suffixes = {
                "counter": ("_total",),
                "histogram": ("_bucket", "_sum", "_count"),
            }.get(family.type, ("",))
            names |= {family.name + suffix for suffix in suffixes}
    return names


def test_every_expression_reads_an_exported_metric() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {name for e in expressions for name in re.findall(r"timeslice_[a-z_]+", e)}
    assert used, "the dashboard reads no metric"
    assert used <= exported(), sorted(used - exported())
    # the v1alpha1 system's four are on it, so its users find them
    for name in (
        "timeslice_orchestrator_queue_depth",
        "timeslice_orchestrator_acquire_wait_duration_seconds_bucket",
        "timeslice_orchestrator_agent_operation_duration_seconds_bucket",
        "timeslice_orchestrator_deferred_snapshots_total",
    ):
        assert name in used, name
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
