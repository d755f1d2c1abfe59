"""`timeslice demo`: the main job a newcomer runs. Its result must be honest and
must show what the issue promises: two jobs whose accelerator phases fill less
than half their time finish at least 1.8x faster time-sliced than back to back."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from timeslice.cli import app
from timeslice.demo import DemoConfig, run_demo
from timeslice.demo_profiles import PROFILES
from timeslice.replay import read_journal

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

MiB = 1024 * 1024


async def test_the_default_demo_time_slices_two_jobs_at_least_1_8x_faster(tmp_path: Path) -> None:
    config = DemoConfig()
    log = tmp_path / "out.txt"
    with log.open("w") as out:
        result = await run_demo(config, tmp_path, out)
    printed = log.read_text()
    alone, shared = result.back_to_back, result.time_sliced
    share = PROFILES[config.profile].accelerator_share
    # Alone, a job keeps the accelerator busy for its profile's share of the time.
    assert alone.busy_share == pytest.approx(share, abs=0.05)
    assert result.speedup >= 1.8, printed
    assert shared.busy_share >= 1.6 * alone.busy_share
    # Both rounds did the same work: every accelerator phase of every job.
    assert shared.busy_s == pytest.approx(alone.busy_s, rel=0.1)
    # Back to back, only the jobs' first turns move contexts; time-sliced, every
    # turn after the other job's does, each one a real move of the job's bytes.
    assert len(alone.switch_s) == config.jobs
    assert len(shared.switch_s) >= config.steps
    assert shared.bytes_moved >= len(shared.switch_s) * config.mib * MiB
    assert alone.journal.exists() and shared.journal.exists()
    assert "speedup" in printed and f"{result.speedup:.2f}x" in printed
    # The replay page it wrote shows both rounds, with the switches the orchestrator told.
    assert str(result.replay) in printed
    replayed = [(await read_journal(f"sqlite:///{r.journal}")).timeline() for r in (alone, shared)]
    assert [len(t.switches) for t in replayed] == [len(alone.switch_s), len(shared.switch_s)]
    assert "<html" in result.replay.read_text()


def test_the_command_runs_to_its_table(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["demo", "--jobs", "3", "--steps", "1", "--step-seconds", "0.2", "--mib", "1",
         "--profile", "verl-sync", "--directory", str(tmp_path)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    for row in ("wall time", "speedup", "accelerator busy", "switches", "bytes moved"):
        assert row in result.output
    assert (tmp_path / "journal-time-sliced.db").exists()


def test_an_unknown_profile_is_refused() -> None:
    result = CliRunner().invoke(app, ["demo", "--profile", "nope"])
    assert result.exit_code == 2
    assert "verl-async" in result.output
