"""The trace export loaded in a real trace parser: the Chrome DevTools performance
panel's trace engine (`@paulirish/trace_engine`, pinned in scripts/trace_check/), run
by scripts/trace_check.sh under Node.js. Skipped where node, npm or the engine's
install is missing, except under CI=true, where .ci/run installs Node.js."""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.optional import need_command
from timeslice.cli import app

ROOT = Path(__file__).resolve().parents[2]
TRACE_CHECK = ROOT / "scripts" / "trace_check.sh"
UNAVAILABLE = 2  # trace_check.sh: npm is missing or the install failed


def parse_with_devtools(trace: Path) -> tuple[int, dict[str, Any]]:
    """trace_check.sh's exit status and summary of `trace`."""
    need_command("node")
    need_command("npm")
    # The first run installs the engine (a few seconds); later ones take well under one.
    done = subprocess.run(
        [str(TRACE_CHECK), str(trace)], capture_output=True, text=True, timeout=100
    )
    if done.returncode == UNAVAILABLE:
        message = f"the DevTools trace engine is unavailable: {done.stderr.strip()}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    try:
        return done.returncode, json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"trace_check.sh printed no summary: {done.stdout}{done.stderr}")


def test_the_export_loads_in_devtools_trace_engine(
    recorded_journal: Path, verl_runs_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "trace.json"
    command = ["replay", str(recorded_journal), "--runs", str(verl_runs_path), "--trace", str(out)]
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    status, summary = parse_with_devtools(out)
    assert summary["error"] is None and status == 0, summary
    ours = doc["traceEvents"]
    assert summary["events"] == len(ours)

    # The bounds are our first and last times; but DevTools reads a ts of 0 as "no
    # time" and takes no counter into its bounds, so its first is our first slice or
    # instant after 0 (and a negative ts would be its first).
    timed = [e for e in ours if e["ph"] != "M"]
    assert summary["bounds"]["max"] == max(e["ts"] + e.get("dur", 0) for e in timed)
    assert summary["bounds"]["min"] == min(
        e["ts"] for e in timed if e["ph"] in ("X", "I") and e["ts"] > 0
    )

    # Every process and thread by the name we gave it, and no other.
    processes = {str(e["pid"]): e["args"]["name"] for e in ours if e["name"] == "process_name"}
    assert summary["processes"] == processes
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ours if e["name"] == "thread_name"}
    found = {(t["pid"], t["tid"]): t["name"] for t in summary["threads"]}
    assert found == threads

    # Each thread holds its slices, in one tree: none dropped for crossing another.
    # (DevTools takes instant events of phase "I" only: it skips our marks, "i".)
    slices = Counter((e["pid"], e["tid"]) for e in ours if e["ph"] in ("X", "I"))
    assert {(t["pid"], t["tid"]): t["slices"] for t in summary["threads"] if t["slices"]} == slices
    assert not [t for t in summary["threads"] if t["dropped"]]


def test_the_check_fails_on_a_slice_devtools_drops(tmp_path: Path) -> None:
    def slice_at(ts: float, dur: float) -> dict[str, Any]:
        return {"name": "hold", "cat": "c", "ph": "X", "ts": ts, "dur": dur, "pid": 1, "tid": 1}

    trace = tmp_path / "crossing.json"
    crossing = [slice_at(10, 5), slice_at(12, 5)]  # 12..17 starts in 10..15, ends after it
    trace.write_text(json.dumps({"traceEvents": crossing}))
    status, summary = parse_with_devtools(trace)
    assert status == 1 and summary["error"] is None
    assert [(t["slices"], t["dropped"]) for t in summary["threads"]] == [(1, 1)]
