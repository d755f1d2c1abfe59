"""What the metric families share: their buckets, and the bound on how many
distinct jobs get series of their own.

Label values come from bounded sets: groups (at most the orchestrator's
`max_groups`), nodes (the agents in the journal), reasons, kinds, outcomes and
backends (enums and installed backends). Jobs are bounded too (`max_groups` x
`max_waiters_per_group`), but that product is far more series than a Prometheus
server should take: `JobLabels` gives the first `MAX_JOB_SERIES` jobs seen a
series each and folds every later one into `OTHER_JOBS` (with a job of that very
name, should one come after the limit).
"""

from __future__ import annotations

from typing import Final

# The v1alpha1 system's buckets, kept for its four families so that its
# dashboards read ours unchanged.
V1ALPHA1_BUCKETS: Final = (0.001, 0.01, 0.1, 1.0, 10.0, 60.0, 300.0, 600.0)
# Ours: finer below a second, where a switch's control overhead lives.
DURATION_BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    600.0,
)
# A journal commit: a durable SQLite write is about a millisecond, PostgreSQL a few.
COMMIT_BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0)

MAX_JOB_SERIES: Final = 1000
OTHER_JOBS: Final = "_other"


class JobLabels:
    """The `job_id` label value of each job: its own id for the first `limit`
    distinct jobs, `OTHER_JOBS` for the rest."""

    def __init__(self, limit: int = MAX_JOB_SERIES) -> None:
        self.limit = limit
        self._known: set[str] = set()

    def __call__(self, job: str) -> str:
        if job in self._known:
            return job
        if len(self._known) < self.limit:
            self._known.add(job)
            return job
        return OTHER_JOBS
