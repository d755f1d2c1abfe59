"""What an agent in session has said of its jobs' states, newest word first.

An agent's word on its jobs comes three ways: its session reports (whole, at
the session's start and whenever a job appears, leaves or changes state), its
answers to SwitchGroup (the group's jobs as the switch leaves them) and to
ResetJob (one job). They travel on different connections and may arrive out of
order, so each carries the version of the agent's job table it reflects (the
events the table has handled since the agent started), and `NodeView` keeps,
job by job, the word of the highest version. `GetGroupStatus` is answered from
it: no question to the agent per call.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

#: (group, job) -> state as named on the wire without its prefix ("SAVED", ...).
JobKey = tuple[str, str]


@dataclass
class NodeView:
    """One agent's jobs, as its newest words say, for one session."""

    # (group, job) -> (the table version that said it, the state).
    jobs: dict[JobKey, tuple[int, str]] = field(default_factory=dict)

    def report(self, version: int, jobs: Iterable[tuple[str, str, str]]) -> None:
        """A whole report of `version`: (group, job, state) of every job."""
        said = {(group, job): state for group, job, state in jobs}
        kept = {key: seen for key, seen in self.jobs.items() if seen[0] > version}
        for key, state in said.items():
            if key not in kept:
                kept[key] = (version, state)
        self.jobs = kept

    def group(self, group: str, version: int, jobs: Iterable[tuple[str, str]]) -> None:
        """What `version` says of every job of `group`: (job, state)."""
        said = {(group, job): state for job, state in jobs}
        for key, seen in list(self.jobs.items()):
            if key[0] == group and key not in said and seen[0] < version:
                del self.jobs[key]  # gone from the table since
        for key, state in said.items():
            self.job(key, version, state)

    def job(self, key: JobKey, version: int, state: str) -> None:
        """What `version` says of one job."""
        seen = self.jobs.get(key)
        if seen is None or seen[0] < version:
            self.jobs[key] = (version, state)

    def states(self, group: str) -> list[tuple[str, str]]:
        """(job, state) of the group's jobs, and of jobs of no group, by job."""
        return sorted(
            (job, state) for (g, job), (_, state) in self.jobs.items() if g in (group, "")
        )
