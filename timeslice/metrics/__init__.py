"""Prometheus metrics of the orchestrator and the agent, and the HTTP port that
serves them with the probes (`/metrics`, `/healthz`, `/readyz`).

- `labels`: the buckets and the bound on per-job label values;
- `orchestrator`: `OrchestratorMetrics`, derived from the lock table's events and
  effects as the journal engine acts on them, and read from the table at a scrape;
- `agent`: `AgentMetrics`, from the operations the agent's engine finishes, and
  its job table and channels at a scrape;
- `http`: `MetricsServer`, the bounded HTTP/1.1 endpoint (h11) on the event loop.

Each server builds its own `CollectorRegistry`, only when its `metrics_port` is
set: with metrics off nothing here is imported.
"""
