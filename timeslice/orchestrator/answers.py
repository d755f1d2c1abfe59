"""What the lock table remembers of its answers, so that a retried call (the same
request id) is answered as the first one was instead of acting twice.

A call's request id is remembered per kind of call, group and job: a job
retries only its latest call of a kind, so one answer each is enough, and
another job's ids never match. Answers older than `ANSWER_MEMORY_SEC` are
forgotten (clients give up retrying well before), and never more than
`MAX_ANSWERS` are kept: a snapshot of the table carries no more.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, Final

from timeslice.orchestrator import events as ev

ANSWER_MEMORY_SEC: Final = 120.0
MAX_ANSWERS: Final = 100_000


class CallKind(enum.StrEnum):
    """The calls whose answers are remembered, as snapshots spell them."""

    ACQUIRE = "acquire"
    YIELD = "yield"


@dataclass(frozen=True, kw_only=True)
class AcquireOutcome:
    """The grant an Acquire was answered with."""

    group: str
    job: str
    token: int


Outcome = AcquireOutcome | ev.Yielded


@dataclass(frozen=True, kw_only=True)
class Answer:
    """The answer to a job's latest call of a kind on a group, for its retries."""

    request_id: str
    at: float
    outcome: Outcome


# As snapshots name the outcomes' types.
_OUTCOME_TYPES: Final[dict[str, type[Outcome]]] = {
    "_AcquireOutcome": AcquireOutcome,
    "Yielded": ev.Yielded,
}


class Answers:
    """The latest answer per (kind of call, group, job), the oldest first."""

    def __init__(self) -> None:
        self.latest: OrderedDict[tuple[CallKind, str, str], Answer] = OrderedDict()

    def __len__(self) -> int:
        return len(self.latest)

    def __iter__(self) -> Iterator[tuple[CallKind, str, str]]:
        return iter(self.latest)

    def find(self, kind: CallKind, group: str, job: str, request_id: str) -> Outcome | None:
        """What the job's call of `kind` on `group` with this request id was
        answered, if it is the latest one remembered."""
        answer = self.latest.get((kind, group, job)) if request_id else None
        return answer.outcome if answer is not None and answer.request_id == request_id else None

    def remember(
        self, kind: CallKind, group: str, job: str, request_id: str, now: float, outcome: Outcome
    ) -> None:
        """Remember `outcome` as the answer to this call (none without a request id),
        forgetting what is too old or too many."""
        if not request_id:
            return
        key = (kind, group, job)
        self.latest.pop(key, None)
        self.latest[key] = Answer(request_id=request_id, at=now, outcome=outcome)
        while self.latest:
            oldest = next(iter(self.latest.values()))
            if len(self.latest) <= MAX_ANSWERS and oldest.at >= now - ANSWER_MEMORY_SEC:
                break
            self.latest.popitem(last=False)

    def to_list(self) -> list[list[Any]]:
        """A JSON-ready snapshot."""
        return [
            [*key, a.request_id, a.at, _outcome_name(a.outcome), asdict(a.outcome)]
            for key, a in self.latest.items()
        ]

    @classmethod
    def from_list(cls, rows: list[list[Any]]) -> Answers:
        """The inverse of `to_list`."""
        answers = cls()
        for kind, group, job, rid, at, outcome, fields in rows:
            answer = Answer(request_id=rid, at=at, outcome=_OUTCOME_TYPES[outcome](**fields))
            answers.latest[(CallKind(kind), group, job)] = answer
        return answers


def _outcome_name(outcome: Outcome) -> str:
    return "_AcquireOutcome" if isinstance(outcome, AcquireOutcome) else type(outcome).__name__
