"""Tracks over time (a group's utilisation in windows, its queue depth) and the data's
time resolution, on hand-made journals folded through the real lock table. Times are
binary fractions, so the shares are exact."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.replay.test_timeline import at, fold, two_node_handover
from timeslice.orchestrator import events as ev
from timeslice.replay.timeline import (
    Span,
    UsageWindow,
    queue_depth,
    time_resolution,
    tracks,
    utilisation,
    window_width,
)
from timeslice.replay.verl import timelines_from_document


def shares(windows: tuple[UsageWindow, ...]) -> list[tuple[float, float, float, float, float]]:
    return [(w.start, w.end, w.busy, w.switching, w.idle) for w in windows]


def test_utilisation_splits_each_window_into_work_switching_and_idle() -> None:
    # Switches 1..2 (to A) and 10..11 (A to B); A holds 2..10, B from 11 (open, to 11).
    tl = fold(*two_node_handover())
    assert shares(utilisation(tl, "g", 4.0)) == [
        (0.0, 4.0, 0.5, 0.25, 0.25),  # idle 0..1, switching 1..2, A works 2..4
        (4.0, 8.0, 1.0, 0.0, 0.0),
        (8.0, 11.0, 2 / 3, 1 / 3, 0.0),  # the last window is shorter: 8..11
    ]
    for w in utilisation(tl, "g", 0.5):
        assert w.busy + w.switching + w.idle == pytest.approx(1.0)
    assert utilisation(tl, "other", 4.0) == tuple(
        UsageWindow(start=w.start, end=w.end, busy=0.0, switching=0.0, idle=1.0)
        for w in utilisation(tl, "g", 4.0)
    )


def test_switching_wins_over_a_hold_recorded_at_the_same_time() -> None:
    tl = fold(*two_node_handover())
    # A hold over 0..4 that the switch at 1..2 overlaps.
    overlapping = replace(
        tl, end=4.0, spans=(Span("g", "A", "hold", 0.0, 4.0),), switches=tl.switches[:1]
    )
    assert shares(utilisation(overlapping, "g", 4.0)) == [(0.0, 4.0, 0.75, 0.25, 0.0)]


def test_queue_depth_counts_the_jobs_waiting() -> None:
    tl = fold(
        ev.Acquire(now=at(0), group="g", job="A", call_id="a1"),
        ev.Acquire(now=at(1), group="g", job="B", call_id="b1"),
        ev.Acquire(now=at(2), group="g", job="C", call_id="c1"),
        ev.Yield(now=at(4), group="g", job="A"),  # B is granted: C still waits
        ev.Yield(now=at(6), group="g", job="B"),  # C is granted
        ev.Acquire(now=at(7), group="g", job="A", call_id="a2"),  # waits to the end
        ev.Acquire(now=at(8), group="g", job="B", call_id="b2"),
    )
    assert queue_depth(tl, "g") == (
        (0.0, 0),
        (1.0, 1),
        (2.0, 2),
        (4.0, 1),
        (6.0, 0),
        (7.0, 1),
        (8.0, 2),
    )
    assert queue_depth(tl, "nobody") == ((0.0, 0),)


def test_a_wait_from_before_the_start_counts_from_the_start() -> None:
    doc = {
        "runs": [
            {
                "timeslice": {
                    "events": [
                        {"t": 0, "kind": "acquired", "job": "A", "pool": "p", "wait_ms": 2000},
                        {"t": 5, "kind": "yielded", "job": "A", "pool": "p"},
                    ]
                }
            }
        ]
    }
    (tl,) = timelines_from_document(doc)
    assert tl.start == -2.0
    assert queue_depth(tl, "p") == ((-2.0, 1), (0.0, 0))


@pytest.mark.parametrize(
    ("length", "resolution", "width"),
    [
        (11.0, 1e-6, 0.1),
        (1000.0, 1e-3, 5.0),
        (12267.0, 1e-3, 100.0),
        (1e-5, 1e-6, 1e-6),
        (0.0, 1e-3, 1e-3),
        (200.0, 1.0, 1.0),
        (201.0, 1.0, 2.0),
    ],
)
def test_windows_are_round_and_at_most_max_windows(
    length: float, resolution: float, width: float
) -> None:
    assert window_width(length, resolution) == width
    assert length / width <= 200


def test_every_group_has_its_tracks() -> None:
    tl = fold(*two_node_handover())
    (track,) = tracks(tl)
    assert track.group == "g" and track.window == 0.1  # 11 s in at most 200 windows
    assert len(track.usage) == 110
    assert track.usage == utilisation(tl, "g", 0.1)
    assert track.queue == queue_depth(tl, "g")
    data = tl.to_dict()
    assert data["tracks"] == [track.to_dict()]
    assert data["resolution"] == time_resolution(tl)


def test_the_resolution_is_the_finest_decimal_of_the_data() -> None:
    # Binary fractions to 1/16 s: 0.0625 has four decimals.
    assert time_resolution(fold(*two_node_handover())) == 1e-4
    doc = {
        "runs": [
            {
                "timeslice": {
                    "events": [
                        {"t": 1.5, "kind": "acquired", "job": "A", "pool": "p", "wait_ms": 14},
                        {"t": 105.7, "kind": "yielded", "job": "A", "pool": "p"},
                    ]
                }
            }
        ]
    }
    # 1.5 - 0.014 reads back as 1.4859999999999999: milliseconds still.
    assert time_resolution(timelines_from_document(doc)[0]) == 1e-3
    whole = {
        "runs": [
            {
                "timeslice": {
                    "events": [
                        {"t": 3, "kind": "acquired", "job": "A", "pool": "p"},
                        {"t": 60, "kind": "yielded", "job": "A", "pool": "p"},
                    ]
                }
            }
        ]
    }
    assert time_resolution(timelines_from_document(whole)[0]) == 1.0
    # Wall-clock times: as fine as a replay goes.
    noisy = fold(
        ev.Acquire(now=1_700_000_000.123456789, group="g", job="A", call_id="a1"),
        ev.Yield(now=1_700_000_001.987654321, group="g", job="A"),
    )
    assert time_resolution(noisy) == 1e-6
