"""The fault campaign: a few short runs find no violation, and the checker does
find each kind of violation when the evidence holds one."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.faults import checker
from tests.faults.__main__ import summarize
from tests.faults.campaign import RunResult, Settings, run_once
from tests.faults.processes import code_snapshot
from tests.faults.schedule import ACTIVE_KINDS, KINDS, Plan, plan_faults
from tests.optional import need_postgres
from timeslice.orchestrator import events as ev

# Between them, every kind of fault (seed 13: one of each).
SEEDS = (13, 8)
SHORT = Settings(duration=8.0, min_faults=3, max_faults=4)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_short_runs_under_every_kind_of_fault_find_no_violation() -> None:
    plans = [plan_faults(s, duration=SHORT.duration, nodes=("node-a", "node-b"),
                         jobs=SHORT.job_names(), lease=SHORT.lease, min_faults=3, max_faults=4)
             for s in SEEDS]  # fmt: skip
    assert {f.kind for p in plans for f in p.faults} == set(KINDS)
    with code_snapshot() as code:
        for seed in SEEDS:
            result = await run_once(seed, SHORT, code, keep="failed")
            assert result.violations == [], f"seed {seed}, kept in {result.kept}"
            assert sum(result.faults.values()) == len(result.plan.faults)
            assert result.counts["holds confirmed"] >= 8
            assert result.counts["grants"] >= result.counts["holds confirmed"]


# Three orchestrators on one PostgreSQL journal: seed 26 kills, stops and cuts the active.
HA_SEED = 26
HA = {"duration": 12.0, "min_faults": 3, "max_faults": 3, "orchestrators": 3,
      "leader_lease": 2.0}  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_a_short_run_of_faults_of_the_active_finds_no_violation() -> None:
    settings = Settings(**HA, postgres_url=need_postgres())  # type: ignore[arg-type]
    plan = plan_faults(HA_SEED, duration=settings.duration, nodes=("node-a", "node-b"),
                       jobs=settings.job_names(), lease=settings.lease, min_faults=3,
                       max_faults=3, leader_lease=settings.leader_lease)  # fmt: skip
    assert {f.kind for f in plan.faults} == set(ACTIVE_KINDS)
    with code_snapshot() as code:
        result = await run_once(HA_SEED, settings, code, keep="failed")
    assert result.violations == [], f"kept in {result.kept}"
    # Each fault of the active was followed by a takeover and a grant of the new
    # active within the leader lease plus 2 s (the run counts a later one a violation).
    assert [kind for kind, _, _ in result.failovers] == [f.kind for f in plan.faults]
    assert all(first is not None for _, _, first in result.failovers)
    assert result.counts["holds confirmed"] >= 8


# --- the checker on made-up evidence ---------------------------------------------------


def _journal(*steps: tuple[str, str]) -> list[tuple[int, float, ev.Event]]:
    """Acquires ("a", job) and yields ("y", job) of group g, one second apart."""
    rows: list[tuple[int, float, ev.Event]] = []
    for i, (what, job) in enumerate(steps, 1):
        now = float(i)
        event: ev.Event = (
            ev.Acquire(now=now, group="g", job=job, call_id=f"c{i}", lease_ttl=2.0)
            if what == "a"
            else ev.Yield(now=now, group="g", job=job)
        )
        rows.append((i, now, event))
    return rows


def _hold(job: str, token: int, start: float, end: float, **fields: Any) -> dict[str, Any]:
    return {"kind": "hold", "job": job, "pid": 1, "round": 1, "token": token, "start": start,
            "end": end, "steps": [start], "found": "ok", "wrote": "ok", "after": "ok",
            "confirmed": True, "release_error": "", **fields}  # fmt: skip


# a holds token 1 from 1 to 3, b token 2 from 3 to 4.
JOURNAL = _journal(("a", "a"), ("a", "b"), ("y", "a"), ("y", "b"))
CLEAN = [_hold("a", 1, 1.1, 2.9), _hold("b", 2, 3.1, 3.9)]


def _violations(holds: list[dict[str, Any]], live: tuple[str, ...] = ()) -> list[str]:
    grants = checker.fold(JOURNAL).grants
    return checker.check_holds(grants, "g", holds, calm_start=0.0, live_jobs=live).violations


def test_the_checker_reads_grants_and_their_ends_from_the_journal() -> None:
    folded = checker.fold(JOURNAL)
    assert folded.violations == []
    assert [(g.token, g.job, g.granted, g.ended, g.end) for g in folded.grants.values()] == [
        (1, "a", 1.0, 3.0, "yield"),
        (2, "b", 3.0, 4.0, "yield"),
    ]
    assert _violations(CLEAN, live=("a", "b")) == []


def test_the_checker_finds_overlapping_confirmed_holds() -> None:
    holds = [_hold("a", 1, 1.1, 2.9), _hold("b", 2, 2.5, 3.9)]
    found = _violations(holds)
    assert any("began before its grant" in v for v in found)
    assert any("confirmed holds overlap" in v for v in found)


def test_the_checker_finds_a_token_held_by_a_job_it_was_not_granted_to() -> None:
    assert any("granted to a" in v for v in _violations([_hold("b", 1, 1.1, 2.9)]))
    assert any("never granted" in v for v in _violations([_hold("a", 7, 1.1, 2.9)]))


def test_the_checker_finds_a_token_held_twice() -> None:
    found = _violations([*CLEAN, _hold("b", 2, 3.2, 3.8)])
    assert "token 2 of g held 2 times" in found


def test_the_checker_finds_a_corrupt_or_missing_context() -> None:
    corrupt = _violations([_hold("a", 1, 1.1, 2.9, found="corrupt")])
    assert any("corrupt context" in v for v in corrupt)
    saved = _violations([_hold("a", 1, 1.1, 2.9, after="saved")])
    assert any("out of memory while it held" in v for v in saved)


def test_the_checker_finds_a_release_refused_though_journaled() -> None:
    refused = _hold("a", 1, 1.1, 2.9, confirmed=False, release_error="LeaseLostError: stale")
    assert any("release refused" in v for v in _violations([refused]))


def test_the_checker_finds_a_revoked_grant_whose_release_was_accepted() -> None:
    rows = [
        *JOURNAL[:2],
        (3, 3.0, ev.Revoke(now=3.0, group="g", token=1, reason=ev.Reason.LEASE_EXPIRED)),
    ]
    grants = checker.fold(rows).grants
    holds = [_hold("a", 1, 1.1, 2.9)]
    report = checker.check_holds(grants, "g", holds, calm_start=0.0, live_jobs=())
    assert any("the journal says revoked" in v for v in report.violations)
    # The same hold refused at its release is a stale holder, not a violation,
    # and its step after the revocation is counted.
    stale = [_hold("a", 1, 1.1, 4.0, confirmed=False, steps=[1.1, 3.5],
                   release_error="LeaseLostError: stale")]  # fmt: skip
    report = checker.check_holds(grants, "g", stale, calm_start=0.0, live_jobs=())
    assert report.violations == []
    assert report.counts["stale steps"] == 1 and report.stale_seconds == pytest.approx(0.5)


def test_the_checker_finds_a_job_without_progress_and_a_crash() -> None:
    found = _violations([*CLEAN, {"kind": "crash", "job": "c", "pid": 9, "error": "boom"}],
                        live=("a", "c"))  # fmt: skip
    assert "c made no confirmed hold after the last fault" in found
    assert any("crashed: boom" in v for v in found)


def test_the_checker_finds_a_token_granted_twice_or_out_of_order() -> None:
    # The table never does this; the effects are made up to see the checker notice.
    folded = checker.fold(JOURNAL[:3])  # a yielded token 1; b holds token 2
    lease = ev.LeaseInfo(lease_id="lease", ttl=2.0, expires_at=None)
    newest = {"g": 2}
    for token, job in ((2, "c"), (1, "a"), (3, "d")):
        effect = ev.Granted(
            group="g",
            job=job,
            call_id="c9",
            token=token,
            lease=lease,
            waited=0.0,
            context_restored=False,
        )
        checker._read_effect(folded, newest, 9, 9.0, effect)
    newest["g"] = 9
    checker._read_effect(
        folded, newest, 10, 10.0, ev.SwitchStarted(group="g", job="e", token=5, previous="d")
    )
    assert folded.violations == [
        "event 9: token 2 of g granted to c, already b's",
        "event 9: token 1 of g granted to a again after its yield",
        "event 10: new grant of g to e with token 5, not above 9",
    ]


def test_a_plan_is_drawn_from_its_seed_alone_and_bounded() -> None:
    def plan(seed: int) -> Any:
        return plan_faults(seed, duration=20.0, nodes=("n1", "n2"), jobs=("j1", "j2", "j3"),
                           lease=2.0, min_faults=3, max_faults=8)  # fmt: skip

    assert plan(5) == plan(5)
    assert plan(5) != plan(6)
    for seed in range(50):
        faults = plan(seed).faults
        assert 3 <= len(faults) <= 8
        assert all(0 <= f.at <= 20.0 for f in faults)
        assert sum(not f.restart for f in faults) <= 1  # two of three jobs stay


def test_the_checker_takes_a_retried_yield_for_one_end() -> None:
    """A Yield retried with its request id (its answer was lost as the active went,
    and the new active answers it again) ends its grant once."""
    yield_a = ev.Yield(now=3.0, group="g", job="a", request_id="y-a")
    rows = [*JOURNAL[:2], (3, 3.0, yield_a), (4, 3.5, ev.Recover(now=3.5, grace=10.0)),
            (5, 3.6, dataclasses.replace(yield_a, now=3.6))]  # fmt: skip
    folded = checker.fold(rows)
    assert folded.violations == []
    assert folded.grants[("g", 1)].end == "yield"


def test_the_summary_names_the_seed_of_each_slowest_failover() -> None:
    def run(seed: int, *failovers: tuple[str, float | None, float | None]) -> RunResult:
        result = RunResult(seed=seed, plan=Plan(seed=seed, duration=1.0, faults=()))
        result.failovers = list(failovers)
        return result

    results = [
        run(1, ("kill-active", 1.7, 2.0), ("stop-active", 1.8, 3.5)),
        run(2, ("kill-active", 1.9, 2.4), ("stop-active", 2.1, None)),
    ]
    figures = summarize(results, 1.0)["failover_seconds"]
    assert figures["kill-active"]["takeover"] == {"seen": 2, "p50": 1.8, "max": 1.9, "max_seed": 2}
    assert figures["kill-active"]["first_grant"]["max_seed"] == 2
    assert figures["stop-active"]["takeover"]["max_seed"] == 2
    assert figures["stop-active"]["first_grant"] == {
        "seen": 1,
        "p50": 3.5,
        "max": 3.5,
        "max_seed": 1,
    }
    assert "cut-active" not in figures
