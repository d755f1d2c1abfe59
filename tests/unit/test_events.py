"""Events to dicts and back: what the journal writes is what a restart reads."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from timeslice.kinds import Liveness
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.state import LockTable

# Every event type, with every optional field set away from its default.
EVENTS: list[ev.Event] = [
    ev.Acquire(
        now=1.5,
        group="g",
        job="job",
        call_id="0.1",
        request_id="req-1",
        lease_ttl=30.0,
        wait_deadline=9.25,
    ),
    ev.Acquire(now=1.5, group="g", job="job", call_id="0.2", priority=-3),
    ev.Acquire(now=0.0, group="g", job="job", call_id="0.2"),
    ev.Yield(now=2.0, group="g", job="job", request_id="req-2", token=7),
    ev.Yield(now=2.0, group="g", job="job"),
    ev.KeepAlive(now=3.0, group="g", job="job", lease_id="lease-7"),
    ev.DropWaiter(now=4.0, group="g", job="job", call_id="0.3", reason=ev.Reason.CANCELLED),
    ev.DropWaiter(now=4.0, group="g", job="job", call_id="", reason=ev.Reason.NOT_RECLAIMED),
    ev.Revoke(now=5.0, group="g", token=7, reason=ev.Reason.NOT_DELIVERED, call_id="0.4"),
    ev.Revoke(now=5.0, group="g", token=7, reason=ev.Reason.LEASE_EXPIRED),
    ev.ForceRelease(now=6.0, group="g", job="job", reason="stuck"),
    ev.ForceRelease(now=6.0, group="g"),
    ev.SetHoldLimit(now=7.0, group="", max_hold=60.0),
    ev.SetHoldLimit(now=7.0, group="g", max_hold=None),
    ev.SetPolicy(now=7.5, group="", policy=ev.Policy.LRS),
    ev.SetHoldLimit(now=7.0, group="h", max_hold=30.0, grace=5.0),
    ev.RequestYield(now=8.0, group="g", token=3),
    ev.SetPolicy(now=7.5, group="g", policy=ev.Policy.PRIORITY, aging=2.5),
    ev.Recover(now=8.0, grace=15.0),
    ev.SetGroupNodes(now=8.5, group="g", nodes=("n1", "127.0.0.1:9001")),
    ev.SetGroupNodes(now=8.5, group="g", nodes=()),
    ev.RegisterAgent(now=8.6, node="n1", address="10.0.0.1:9001"),
    ev.SetJobBackend(
        now=8.7,
        group="g",
        job="job",
        node="n1",
        backend={"cuda": {"explicitTarget": {"pids": [12]}}},
    ),
    ev.SetJobBackend(now=8.7, group="g", job="job", node="", backend=None),
    ev.SwitchDone(
        now=8.8,
        group="g",
        token=4,
        restored=True,
        faults=(("other", "snapshot failed"),),
        error="",
        moved_bytes=1 << 20,
        began=8.1,
        steps=(("n1", "other", "snapshot", 0.25, 1 << 19), ("n1", "job", "restore", 0.5, 1 << 19)),
    ),  # fmt: skip
    ev.SwitchDone(now=8.8, group="g", token=4, restored=False, error="agent n2 unreachable"),
    ev.ResetJob(now=8.9, group="g", job="other"),
    ev.WorkloadSeen(now=8.95, group="g", job="job", seen=(Liveness.GONE, Liveness.UNKNOWN)),
    ev.Acquire(now=9.0, group="gröup ✓", job="jöb", call_id="1.1", request_id="ré"),
    ev.Acquire(
        now=9.5, group="g", job="job", call_id="1.2", principal="trainer-a", lease_secret="Zm9v-_x"
    ),
    ev.Yield(now=9.6, group="g", job="job", token=8, principal="trainer-a"),
    ev.KeepAlive(now=9.7, group="g", job="job", lease_id="lease-8-Zm9v-_x", principal="trainer-a"),
]


def test_every_event_type_is_covered() -> None:
    assert {type(e).__name__ for e in EVENTS} == set(ev.EVENT_TYPES)


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_an_event_round_trips_through_a_dict(event: ev.Event) -> None:
    data = ev.event_to_dict(event)
    assert data["kind"] == type(event).__name__
    assert ev.event_from_dict(data) == event


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_an_event_round_trips_through_json(event: ev.Event) -> None:
    data = json.loads(json.dumps(ev.event_to_dict(event)))
    back = ev.event_from_dict(data)
    assert back == event
    assert type(back) is type(event)


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_the_dict_holds_every_field_by_name(event: ev.Event) -> None:
    data = ev.event_to_dict(event)
    fields = {f.name for f in dataclasses.fields(event)}
    assert set(data) == fields | {"kind"}
    for name in fields:
        assert data[name] == getattr(event, name)


def test_from_dict_leaves_its_argument_alone() -> None:
    data = ev.event_to_dict(EVENTS[0])
    copy = dict(data)
    ev.event_from_dict(data)
    assert data == copy


@pytest.mark.parametrize(
    "data",
    [
        {"kind": "Explode", "now": 1.0},
        {"kind": "", "now": 1.0},
        {"now": 1.0, "grace": 5.0},  # no kind at all
        {"kind": "Granted", "group": "g"},  # an effect, not an event
        {"kind": "acquire", "now": 0.0, "group": "g", "job": "j", "call_id": "c"},
    ],
)
def test_an_unknown_kind_is_refused(data: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="unknown event kind"):
        ev.event_from_dict(data)


def test_a_dict_with_a_missing_or_extra_field_is_refused() -> None:
    with pytest.raises(TypeError):
        ev.event_from_dict({"kind": "Recover", "now": 1.0})
    with pytest.raises(TypeError):
        ev.event_from_dict({"kind": "Recover", "now": 1.0, "grace": 2.0, "extra": 1})


def test_events_are_frozen() -> None:
    event = ev.Recover(now=1.0, grace=2.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.grace = 3.0  # type: ignore[misc]


def test_a_table_fed_round_tripped_events_ends_where_the_original_did() -> None:
    history: list[ev.Event] = [
        ev.SetHoldLimit(now=0, group="", max_hold=100.0),
        ev.Acquire(now=0, group="g", job="a", call_id="0.1", request_id="ra", lease_ttl=10.0),
        ev.Acquire(now=1, group="g", job="b", call_id="0.2", request_id="rb", wait_deadline=50.0),
        ev.Acquire(now=2, group="g", job="c", call_id="0.3"),
        ev.DropWaiter(now=3, group="g", job="c", call_id="0.3", reason=ev.Reason.CANCELLED),
        ev.Revoke(now=10, group="g", token=1, reason=ev.Reason.LEASE_EXPIRED),
        ev.Recover(now=11, grace=5.0),
        ev.Yield(now=12, group="g", job="b", request_id="yb", token=2),
        ev.Acquire(now=13, group="g", job="a", call_id="1.1"),
        ev.ForceRelease(now=14, group="g", job="a", reason="test"),
    ]
    original, replayed = LockTable(), LockTable()
    for event in history:
        original.handle(event)
        replayed.handle(ev.event_from_dict(json.loads(json.dumps(ev.event_to_dict(event)))))
        replayed.validate()
    assert replayed.to_dict() == original.to_dict()
    assert replayed.groups["g"].token == 3  # a, b, then a again
    assert replayed.groups["g"].holder is None and replayed.epoch == 1


def test_an_acquire_journaled_before_priorities_existed_reads_as_priority_0() -> None:
    data = ev.event_to_dict(ev.Acquire(now=1.0, group="g", job="job", call_id="0.1"))
    del data["priority"]
    assert ev.event_from_dict(data) == ev.Acquire(
        now=1.0, group="g", job="job", call_id="0.1", priority=0
    )
