"""`benchmarks/switch.py` cuts each measured switch at the times the orchestrator's
journal gives it: these tests hold that cut to the events it must use."""

from __future__ import annotations

import pytest

from benchmarks.handoff import HANDOFF_GROUP, JOB_A, JOB_B, Handoffs
from benchmarks.switch import split_switches
from timeslice.orchestrator import events as ev
from timeslice.orchestrator.events import Event

OFFSET = 1_000.0  # the orchestrator's wall clock, less this, is the benchmark's clock


def yielded(at: float, group: str = HANDOFF_GROUP, job: str = JOB_A) -> ev.Yield:
    return ev.Yield(now=at + OFFSET, group=group, job=job)


def switched(
    began: float, done: float, error: str = "", group: str = HANDOFF_GROUP
) -> ev.SwitchDone:
    return ev.SwitchDone(
        now=done + OFFSET, group=group, token=1, restored=True, began=began + OFFSET, error=error
    )


def run(*samples: tuple[float, float]) -> Handoffs:
    """Samples as (sent, latency)."""
    return Handoffs(
        latency=[latency for _, latency in samples],
        yield_rtt=[0.0] * len(samples),
        sent_at=[sent for sent, _ in samples],
        echo=[],
    )


def test_each_switch_is_cut_at_its_yield_its_start_and_its_agents_answers() -> None:
    events: list[Event] = [
        yielded(10.0005),
        switched(10.001, 10.003),
        yielded(20.0001, job=JOB_B),  # B's own yield, before A's of the next sample
        yielded(20.0004),
        switched(20.0009, 20.0031),
    ]
    split = split_switches(events, [run((10.0, 0.004), (20.0, 0.005))], OFFSET)
    assert split.decided == pytest.approx([0.0005, 0.0004])
    assert split.asked == pytest.approx([0.0005, 0.0005])
    assert split.answered == pytest.approx([0.002, 0.0022])
    assert split.returned == pytest.approx([0.001, 0.0019])


def test_other_groups_failed_switches_and_samples_without_their_events_are_left_out() -> None:
    events: list[Event] = [
        yielded(10.0005, group="other"),
        switched(10.001, 10.003, group="other"),
        yielded(20.0005),
        switched(20.001, 20.003, error="n1: agent unreachable"),
        yielded(30.0005),
        switched(30.001, 30.009),  # answered after B's Acquire returned: not this sample's
        yielded(40.0005),
        switched(40.001, 40.002),
    ]
    samples = run((10.0, 0.004), (20.0, 0.004), (30.0, 0.004), (40.0, 0.004))
    split = split_switches(events, [samples], OFFSET)
    assert split.decided == pytest.approx([0.0005])
    assert split.returned == pytest.approx([0.002])


def test_samples_of_several_runs_are_pooled_in_order() -> None:
    events: list[Event] = [
        yielded(1.0001),
        switched(1.0002, 1.0003),
        yielded(2.0001),
        switched(2.0002, 2.0004),
    ]
    split = split_switches(events, [run((1.0, 0.001)), run((2.0, 0.001))], OFFSET)
    assert split.answered == pytest.approx([0.0001, 0.0002])
