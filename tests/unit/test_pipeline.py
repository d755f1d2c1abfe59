"""The pipelined switch's ledger (`Room`, `Pace`) and its model of a switch's time."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from timeslice.agent.pipeline import Pace, Room, model

GB = 1e9
sizes = st.lists(st.integers(min_value=0, max_value=10**10), min_size=0, max_size=8)
bandwidth = st.floats(min_value=1e8, max_value=1e11)


def test_room_lets_in_what_has_been_freed_and_no_more() -> None:
    room = Room()
    assert not room.fits(1)
    assert room.fits(0)
    room.free(40)
    assert room.fits(40) and not room.fits(41)
    room.take(30)
    assert room.fits(10) and not room.fits(11)
    with pytest.raises(ValueError, match="do not fit"):
        room.take(11)
    room.free(None)  # a step that did not say: nothing
    room.free(-5)
    assert not room.fits(11)


def test_a_size_not_known_waits_until_the_room_opens() -> None:
    room = Room(freed=10**12)
    assert not room.fits(None)
    room.open = True
    assert room.fits(None) and room.fits(10**15)


async def test_pace_holds_a_restore_step_until_enough_is_freed() -> None:
    pace = Pace()
    entered = asyncio.ensure_future(pace.enter(50))
    await asyncio.sleep(0)
    pace.freed(30)
    await asyncio.sleep(0)
    assert not entered.done()
    pace.freed(20)
    await asyncio.wait_for(entered, 1)
    assert (pace.room.freed, pace.room.taken) == (50, 50)


async def test_pace_lets_everything_in_once_open() -> None:
    pace = Pace()
    entered = asyncio.ensure_future(pace.enter(None))
    await asyncio.sleep(0)
    assert not entered.done()
    pace.open()
    await asyncio.wait_for(entered, 1)


def test_equal_tags_over_a_full_duplex_link_take_one_tag_more_than_one_way() -> None:
    four = [10 * 2**30] * 4
    bw = 50 * GB
    one_way = sum(four) / bw
    piped = model(four, four, d2h=bw, h2d=bw, pipelined=True)
    serial = model(four, four, d2h=bw, h2d=bw, pipelined=False)
    assert serial.end == pytest.approx(2 * one_way)
    assert piped.end == pytest.approx(one_way * 5 / 4)
    assert piped.in_starts[0] == pytest.approx(one_way / 4)  # after the first tag left


def test_room_free_before_the_switch_is_not_assumed() -> None:
    # One big outgoing tag: the incoming waits for all of it, as if not pipelined.
    piped = model([8 * 2**30], [2**30] * 8, d2h=GB, h2d=GB, pipelined=True)
    serial = model([8 * 2**30], [2**30] * 8, d2h=GB, h2d=GB, pipelined=False)
    assert piped.end == pytest.approx(serial.end)


def test_a_step_costs_its_round_trip() -> None:
    piped = model([GB] * 2, [GB] * 2, d2h=GB, h2d=GB, pipelined=True, step_cost=0.01)
    assert piped.end == pytest.approx(0.01 + 1 + 2 * (0.01 + 1))


def test_bandwidths_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        model([1], [1], d2h=0, h2d=1, pipelined=True)


@given(sizes, st.lists(st.integers(min_value=0, max_value=10**10) | st.none(), max_size=8),
       bandwidth, bandwidth)  # fmt: skip
def test_a_pipelined_switch_is_never_slower_nor_faster_than_the_link_allows(
    outgoing: list[int], incoming: list[int | None], d2h: float, h2d: float
) -> None:
    piped = model(outgoing, incoming, d2h=d2h, h2d=h2d, pipelined=True)
    serial = model(outgoing, incoming, d2h=d2h, h2d=h2d, pipelined=False)
    out_time = sum(outgoing) / d2h
    in_time = sum(n or 0 for n in incoming) / h2d
    assert serial.end == pytest.approx(out_time + in_time)
    assert piped.end <= serial.end * (1 + 1e-9) + 1e-12
    assert piped.end >= max(out_time, in_time) * (1 - 1e-9)


@given(sizes, st.lists(st.integers(min_value=0, max_value=10**10) | st.none(), max_size=8),
       bandwidth, bandwidth)  # fmt: skip
def test_what_comes_in_before_the_last_step_left_never_exceeds_what_left(
    outgoing: list[int], incoming: list[int | None], d2h: float, h2d: float
) -> None:
    line = model(outgoing, incoming, d2h=d2h, h2d=h2d, pipelined=True)
    last = line.out_ends[-1] if outgoing else 0.0
    filled = 0
    for start, nbytes in zip(line.in_starts, incoming, strict=True):
        if start >= last:
            break
        assert nbytes is not None, "a size not known came in before the room opened"
        filled += nbytes
        gone = sum(n for end, n in zip(line.out_ends, outgoing, strict=True) if end <= start)
        assert filled <= gone
    assert line.in_starts == tuple(sorted(line.in_starts))
