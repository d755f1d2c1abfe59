"""The demo's profiles follow the recorded runs: their numbers are recomputed here
from the recorded data (the copy under tests/data)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from timeslice.demo_profiles import PROFILES, VERL_ASYNC, VERL_SYNC, Phase, Profile

DATA = Path(__file__).resolve().parents[1] / "data" / "verl-replay-runs.json"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "verl-replay-runs.json"


def test_every_profile_fills_one_step() -> None:
    for profile in PROFILES.values():
        assert sum(p.share for p in profile.phases) == pytest.approx(1.0)
        assert 0 < profile.accelerator_share < 1
    with pytest.raises(ValueError, match="add up"):
        Profile("bad", "", (Phase("x", True, 0.5),))


@pytest.fixture(scope="module")
def runs() -> list[dict[str, Any]]:
    return list(json.loads(DATA.read_text())["runs"])


def test_the_copy_of_the_recorded_runs_is_the_workplaces() -> None:
    if not SHARED.exists():
        pytest.skip(f"no shared/ beside this checkout ({SHARED})")
    assert DATA.read_bytes() == SHARED.read_bytes()


def _median_holds(run: dict[str, Any]) -> dict[str, float]:
    began: dict[tuple[str, str], float] = {}
    holds: dict[str, list[float]] = {}
    for e in run["timeslice"]["events"]:
        key = (e["job"], e["pool"])
        if e["kind"] == "acquired":
            began[key] = e["t"]
        elif e["kind"] == "yielded" and key in began:
            holds.setdefault(e["pool"], []).append(e["t"] - began.pop(key))
    return {pool: statistics.median(h) for pool, h in holds.items()}


def test_the_sync_profile_is_the_recorded_sync_run(runs: list[dict[str, Any]]) -> None:
    sync = next(r for r in runs if r["meta"]["mode"] == "sync disaggregated")
    assert VERL_SYNC.accelerator_share == pytest.approx(sync["summary"]["duty_base"] / 100)
    holds = _median_holds(sync)
    generation, training = (p.share for p in VERL_SYNC.phases if p.on_accelerator)
    assert generation / training == pytest.approx(holds["sampler"] / holds["trainer"], rel=0.01)


def test_the_async_profile_is_the_recorded_fully_async_run(runs: list[dict[str, Any]]) -> None:
    run = next(r for r in runs if r["meta"]["mode"] == "fully-async disaggregated")
    assert VERL_ASYNC.accelerator_share == pytest.approx(run["summary"]["duty_trainer_solo"] / 100)
