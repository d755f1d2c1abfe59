"""The recorded runs' event schema: the two recorded veRL runs load with their swaps
and the figures their page published; what is exported reads back the same."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from timeslice.orchestrator import events as ev
from timeslice.replay.from_journal import timeline_from_journal
from timeslice.replay.timeline import Timeline
from timeslice.replay.verl import (
    KINDS,
    ScheduleError,
    events_from_timeline,
    export_document,
    load_runs,
    timeline_from_run,
    timelines_from_document,
)


@pytest.fixture(scope="module")
def document(verl_runs_path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(verl_runs_path.read_text())
    return doc


@pytest.fixture(scope="module")
def runs(verl_runs_path: Path) -> list[Timeline]:
    return load_runs(verl_runs_path)


def test_the_recorded_runs_show_their_swaps(runs: list[Timeline], document: dict[str, Any]) -> None:
    assert [len(tl.switches) for tl in runs] == [42, 27]
    for tl, run in zip(runs, document["runs"], strict=True):
        assert len(tl.switches) == run["summary"]["swaps"]
        events = run["timeslice"]["events"]
        for pool in tl.groups:
            saves = [e for e in events if e["pool"] == pool and e["kind"] == "checkpointing"]
            assert sum(s.group == pool for s in tl.switches) == len(saves)
        assert tl.label == run["label"] and tl.meta["framework"] == "veRL"
        assert set(tl.job_names.values()) == {j["short"] for j in run["jobs"].values()}


def test_the_recorded_runs_give_their_published_medians(
    runs: list[Timeline], document: dict[str, Any]
) -> None:
    for tl, run in zip(runs, document["runs"], strict=True):
        summary = tl.summary()
        assert summary["median_snapshot"] * 1000 == pytest.approx(
            run["summary"]["med_ckpt_ms"], abs=1
        )
        assert summary["median_restore"] * 1000 == pytest.approx(
            run["summary"]["med_restore_ms"], abs=1
        )
        assert summary["moved_bytes"] is None  # the recorded runs have no byte counts


def test_each_swap_has_the_recorded_parts(runs: list[Timeline], document: dict[str, Any]) -> None:
    sync, _ = runs
    events = document["runs"][0]["timeslice"]["events"]
    # The third swap on the trainer: A saved from 1693.5 (5019 ms), B restored
    # (1839 ms), B acquired at 1699.4 having waited 985315 ms.
    third = sync.switches[2]
    assert (third.group, third.saved, third.job) == ("trainer", ("A",), "B")
    assert (third.start, third.end) == (1693.5, 1699.4)
    assert third.snapshot == 5.019 and third.restore == 1.839 and third.wait == 985.315
    assert third.restored and third.overhead == pytest.approx(0.0)
    # Every swap's job and wait are those of the next acquire on its pool.
    for s in sync.switches:
        later = [e for e in events if e["kind"] == "acquired" and e["pool"] == s.group
                 and e["t"] >= s.start]  # fmt: skip
        if not later:
            assert s.job == "" and s.wait is None
            continue
        assert (s.job, s.wait) == (later[0]["job"], later[0]["wait_ms"] / 1000)
        assert s.start <= later[0]["t"] <= s.end


def test_idle_time_before_anybody_asked_is_not_overhead(runs: list[Timeline]) -> None:
    _, fully_async = runs
    # Code-RLVR saved at 215.9; Math-RLVR asked at 615.1 - 23.0 and acquired at 615.1
    # after its restore from 608.2 to 615.1 (6944 ms).
    swap = fully_async.switches[3]
    assert (swap.start, swap.end, swap.wait) == (215.9, 615.1, 23.0)
    assert swap.idle == pytest.approx(592.1 - 229.9)  # saved, and nobody waiting yet
    assert swap.overhead == pytest.approx((608.2 - 592.1))
    # The parts add up to the swap (to the recorded times' 0.1 s).
    assert swap.snapshot + swap.restore + swap.idle + swap.overhead == pytest.approx(
        swap.duration, abs=0.1
    )


@pytest.mark.parametrize("index", [0, 1])
def test_an_export_reads_back_the_same(runs: list[Timeline], index: int) -> None:
    tl = runs[index]
    doc = json.loads(json.dumps(export_document([tl])))
    (back,) = timelines_from_document(doc)
    assert back.switches == tl.switches
    assert back.spans == tl.spans
    assert (back.groups, back.jobs, back.start, back.end) == (tl.groups, tl.jobs, tl.start, tl.end)


def test_the_export_is_the_schema(runs: list[Timeline]) -> None:
    run = export_document(runs)["runs"][0]
    events = run["timeslice"]["events"]
    assert [e["t"] for e in events] == sorted(e["t"] for e in events)
    for e in events:
        assert e["kind"] in KINDS and isinstance(e["job"], str) and isinstance(e["pool"], str)
        if e["kind"] == "acquired":
            assert {"wait_ms", "restore_ms", "step"} <= set(e)
        if e["kind"] in ("ckpt_done", "restore_done"):
            assert e["ms"] > 0
    assert sum(e["kind"] == "checkpointing" for e in events) == 42
    assert run["summary"]["swaps"] == 42 and run["jobs"]["A"]["short"] == "Job A"


def journal_with_a_failure() -> Timeline:
    t = 1000.0
    return timeline_from_journal(
        [
            (seq, e.now, e)
            for seq, e in enumerate(
                [
                    ev.SetGroupNodes(now=t, group="g", nodes=("n1", "n2")),
                    ev.Acquire(now=t + 1, group="g", job="A", call_id="a1"),
                    ev.SwitchDone(now=t + 2, group="g", token=1, restored=False, began=t + 1.5),
                    ev.Acquire(now=t + 3, group="g", job="B", call_id="b1"),
                    ev.Yield(now=t + 4, group="g", job="A"),
                    ev.SwitchDone(
                        now=t + 5,
                        group="g",
                        token=2,
                        restored=False,
                        error="n2: unreachable",
                        began=t + 4.25,
                        moved_bytes=300,
                        steps=(("n1", "A", "snapshot", 0.5, 300),),
                    ),
                    ev.Acquire(now=t + 6, group="g", job="B", call_id="b2"),
                    ev.SwitchDone(
                        now=t + 7,
                        group="g",
                        token=3,
                        restored=False,
                        began=t + 6.5,
                        moved_bytes=100,
                        steps=(("n2", "A", "snapshot", 0.25, 100),),
                    ),
                ],
                1,
            )
        ],
        label="failure",
    )


def test_a_journal_exports_what_the_plain_schema_cannot_say() -> None:
    tl = journal_with_a_failure()
    assert [s.ok for s in tl.switches] == [True, False, True]
    kinds = [e["kind"] for e in events_from_timeline(tl)]
    # A swap that moves nothing (the first) and one that fails stay visible.
    assert kinds.count("switching") == 3 and kinds.count("switch_failed") == 1
    (back,) = timelines_from_document(json.loads(json.dumps(export_document([tl]))))
    assert [(s.job, s.saved, s.ok, s.error, s.moved_bytes) for s in back.switches] == [
        ("A", (), True, "", None),
        ("B", ("A",), False, "n2: unreachable", 300),
        ("B", ("A",), True, "", 100),
    ]
    for a, b in zip(tl.switches, back.switches, strict=True):
        assert (a.start, a.end, a.snapshot, a.restore, a.overhead) == pytest.approx(
            (b.start, b.end, b.snapshot, b.restore, b.overhead)
        )
        assert a.wait == b.wait


def test_unknown_kinds_are_skipped_and_said() -> None:
    run = {
        "timeslice": {
            "events": [
                {"t": 0, "kind": "acquired", "job": "A", "pool": "p", "wait_ms": 0},
                {"t": 1, "kind": "preempted", "job": "A", "pool": "p"},
                {"t": 2, "kind": "yielded", "job": "A", "pool": "p"},
                {"t": 2, "kind": "checkpointing", "job": "A", "pool": "p"},
                {"t": 3, "kind": "ckpt_done", "job": "A", "pool": "p", "ms": 1000},
            ]
        }
    }
    tl = timeline_from_run(run)
    assert any("preempted (1)" in n for n in tl.notes)
    assert len(tl.switches) == 1 and tl.switches[0].job == ""
    assert any("no job acquire" in n for n in tl.notes)


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ([], '"runs" list'),
        ({"runs": {}}, '"runs" list'),
        ({"runs": [{"timeslice": {}}]}, "no timeslice.events"),
        ({"runs": [{"timeslice": {"events": [{"kind": "acquired"}]}}]}, "lacks kind, job"),
        ({"runs": [{"timeslice": {"events": [{"kind": "x", "job": "", "pool": "p"}]}}]}, "no time"),
    ],
)
def test_documents_not_in_the_schema(doc: Any, match: str) -> None:
    with pytest.raises(ScheduleError, match=match):
        timelines_from_document(doc)


def test_a_file_that_is_not_json(tmp_path: Path) -> None:
    bad = tmp_path / "runs.json"
    bad.write_text("{not json")
    with pytest.raises(ScheduleError, match="not JSON"):
        load_runs(bad)
