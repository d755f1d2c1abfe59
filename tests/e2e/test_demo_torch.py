"""`timeslice demo --workload torch`: two real PyTorch training jobs, time-sliced
through `TorchWorkload`, must end with the very bits they end with alone, and finish
sooner than back to back; when a job's bits differ, the demo says so and fails."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from timeslice.cli import app

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

# Small but robust: each step's reward wait is about three times its training (0.2 s
# here), so that sharing pays off even on a loaded two-core machine.
STEPS = 3
SMALL = ("--jobs", "2", "--steps", str(STEPS), "--reward-seconds", "0.6")
MiB = 1024 * 1024
# Found, not imported: importing torch here would cost the test seconds.
needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="PyTorch is not installed"
)


def timeslice(*args: str, without_torch: bool = False) -> subprocess.CompletedProcess[str]:
    """Run `timeslice ARGS` in a process of its own, as a user would."""
    entry = (
        ["-c", "import sys; sys.modules['torch'] = None; from timeslice.cli import main; main()"]
        if without_torch
        else ["-m", "timeslice"]
    )
    env = {k: v for k, v in os.environ.items() if k != "TIMESLICE_DEBUG"}
    return subprocess.run(
        [sys.executable, *entry, *args], capture_output=True, text=True, timeout=100, env=env
    )


def row(output: str, name: str) -> list[str]:
    """The cells after `name` on the table's line that starts with it."""
    for line in output.splitlines():
        if line.startswith(name + " "):
            return line[len(name) :].split()
    raise AssertionError(f"no row {name!r} in:\n{output}")


@needs_torch
def test_two_torch_jobs_end_bit_identical_to_their_solo_runs_and_sooner(tmp_path: Path) -> None:
    done = timeslice("demo", "--workload", "torch", *SMALL, "--directory", str(tmp_path))
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert done.stderr == ""  # no warning either (a tensor the workload could not free, say)
    assert "RESULTS DIFFER" not in out
    for job in ("job-1", "job-2"):
        steps, _loss, first, _arrow, last, params, losses = row(out, job)
        assert (steps, params, losses) == (str(STEPS), "yes", "yes"), out
        assert math.isfinite(float(first)) and math.isfinite(float(last))
    # Measured, both rounds: the speedup is their ratio.
    alone, shared = (float(s) for s in row(out, "wall time")[::2])
    speedup = float(row(out, "speedup")[1].rstrip("x"))
    assert speedup == pytest.approx(alone / shared, abs=0.01)
    assert speedup > 1.0, out
    # Time-sliced, every switch really moved the jobs' state: at least the yielding
    # job's weights out and the next one's in (float32 parameters).
    size = re.search(r"an MLP policy of ([0-9.]+) M parameters", out)
    assert size is not None, out
    weights_mib = float(size.group(1)) * 1e6 * 4 / MiB
    switches = int(row(out, "switches")[1])
    moved_mib = float(row(out, "bytes moved")[2])
    assert switches >= STEPS, out
    assert moved_mib >= switches * 2 * weights_mib * 0.98, out
    # The table ends the output, and the journals are where it says.
    assert out.rstrip().splitlines()[-1].startswith("bytes per switch (out + in)")
    assert (tmp_path / "journal-time-sliced.db").exists()


class FlipsABitAtItsSecondRestore:
    """A workload that hands a job back one bit wrong, at its second restore: in the
    back-to-back round each job is restored once (its first turn), so only the
    time-sliced round is affected."""

    def __init__(self) -> None:
        from timeslice.workloads.torch import TorchWorkload

        self.inner = TorchWorkload()
        self.restores = 0
        self.modules: list[object] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def add_module(self, module: object, name: str) -> None:
        self.modules.append(module)
        self.inner.add_module(module, name=name)

    def restore(self, tags: list[str]) -> object:
        moved = self.inner.restore(tags)
        if self.inner.state != "RUNNING":
            return moved  # one tag of a restore moved tag by tag: not back yet
        self.restores += 1
        if self.restores == 2:
            import torch

            with torch.no_grad():
                weight = next(self.modules[0].parameters()).view(-1)  # type: ignore[attr-defined]
                weight[0] = torch.nextafter(weight[0], torch.tensor(math.inf))
        return moved


@needs_torch
def test_a_job_that_comes_back_one_bit_wrong_fails_the_demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import timeslice.demo_torch as demo_torch

    monkeypatch.setattr(demo_torch, "TorchWorkload", FlipsABitAtItsSecondRestore)
    result = CliRunner().invoke(
        app,
        ["demo", "--workload", "torch", "--steps", "2", "--reward-seconds", "0.1",
         "--directory", str(tmp_path)],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    differ = re.search(r"RESULTS DIFFER: (.*) did not end time-sliced", result.output)
    assert differ is not None, result.output
    wrong = {job for job in ("job-1", "job-2") if row(result.output, job)[-2] == "NO"}
    assert wrong and set(differ.group(1).split(", ")) == wrong, result.output
    assert "error: a job's parameters or loss curve differ" in result.output


def test_without_torch_the_demo_says_what_to_install() -> None:
    done = timeslice("demo", "--workload", "torch", without_torch=True)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "error: the torch demo needs PyTorch: pip install 'timeslice[torch]'"
    ]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--workload", "torch", "--mib", "4"], "--mib does not apply to --workload torch"),
        (["--workload", "torch", "--profile", "verl-sync"], "--profile does not apply"),
        (["--workload", "torch", "--step-seconds", "1"], "--step-seconds does not apply"),
        (["--reward-seconds", "1"], "--reward-seconds does not apply to --workload hostmem"),
        (["--workload", "cuda"], "unknown workload 'cuda'; known: hostmem, torch"),
    ],
)
def test_options_of_the_other_workload_are_refused(args: list[str], words: str) -> None:
    result = CliRunner().invoke(app, ["demo", *args])
    assert result.exit_code == 2
    assert words in result.output
