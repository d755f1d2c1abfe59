"""Events to dicts and back: what the journal writes is what a restart reads."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from timeslice.orchestrator import events as ev
from timeslice.orchestrator.state import LockTable

# Every event type, with every optional field set away from its default.
EVENTS: list[ev.Event] = [
    ev.Acquire(1.5, "g", "job", "0.1", "req-1", lease_ttl=30.0, wait_deadline=9.25),
    ev.Acquire(1.5, "g", "job", "0.2", priority=-3),
    ev.Acquire(0.0, "g", "job", "0.2"),
    ev.Yield(2.0, "g", "job", "req-2", token=7),
    ev.Yield(2.0, "g", "job"),
    ev.KeepAlive(3.0, "g", "job", "lease-7"),
    ev.DropWaiter(4.0, "g", "job", "0.3", ev.REASON_CANCELLED),
    ev.DropWaiter(4.0, "g", "job", "", ev.REASON_NOT_RECLAIMED),
    ev.Revoke(5.0, "g", 7, ev.REASON_NOT_DELIVERED, "0.4"),
    ev.Revoke(5.0, "g", 7, ev.REASON_LEASE_EXPIRED),
    ev.ForceRelease(6.0, "g", "job", "stuck"),
    ev.ForceRelease(6.0, "g"),
    ev.SetHoldLimit(7.0, "", 60.0),
    ev.SetHoldLimit(7.0, "g", None),
    ev.SetPolicy(7.5, "", "lrs"),
    ev.SetHoldLimit(7.0, "h", 30.0, grace=5.0),
    ev.RequestYield(8.0, "g", 3),
    ev.SetPolicy(7.5, "g", "priority", aging=2.5),
    ev.Recover(8.0, 15.0),
    ev.SetGroupNodes(8.5, "g", ("n1", "127.0.0.1:9001")),
    ev.SetGroupNodes(8.5, "g", ()),
    ev.RegisterAgent(8.6, "n1", "10.0.0.1:9001"),
    ev.SetJobBackend(8.7, "g", "job", "n1", {"cuda": {"explicitTarget": {"pids": [12]}}}),
    ev.SetJobBackend(8.7, "g", "job", "", None),
    ev.SwitchDone(
        8.8,
        "g",
        4,
        True,
        (("other", "snapshot failed"),),
        "",
        1 << 20,
        8.1,
        (("n1", "other", "snapshot", 0.25, 1 << 19), ("n1", "job", "restore", 0.5, 1 << 19)),
    ),  # fmt: skip
    ev.SwitchDone(8.8, "g", 4, False, error="agent n2 unreachable"),
    ev.ResetJob(8.9, "g", "other"),
    ev.Acquire(9.0, "gröup ✓", "jöb", "1.1", "ré"),
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
    event = ev.Recover(1.0, 2.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.grace = 3.0  # type: ignore[misc]


def test_a_table_fed_round_tripped_events_ends_where_the_original_did() -> None:
    history: list[ev.Event] = [
        ev.SetHoldLimit(0, "", 100.0),
        ev.Acquire(0, "g", "a", "0.1", "ra", lease_ttl=10.0),
        ev.Acquire(1, "g", "b", "0.2", "rb", wait_deadline=50.0),
        ev.Acquire(2, "g", "c", "0.3"),
        ev.DropWaiter(3, "g", "c", "0.3", ev.REASON_CANCELLED),
        ev.Revoke(10, "g", 1, ev.REASON_LEASE_EXPIRED),
        ev.Recover(11, 5.0),
        ev.Yield(12, "g", "b", "yb", token=2),
        ev.Acquire(13, "g", "a", "1.1"),
        ev.ForceRelease(14, "g", "a", "test"),
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
    data = ev.event_to_dict(ev.Acquire(1.0, "g", "job", "0.1"))
    del data["priority"]
    assert ev.event_from_dict(data) == ev.Acquire(1.0, "g", "job", "0.1", priority=0)
