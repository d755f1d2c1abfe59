"""The torch demo's job: deterministic from its seed, and its comparison sees a
single bit of difference in a parameter or a loss."""

from __future__ import annotations

import math

import pytest

from tests.optional import need

torch = need("torch")

from timeslice.demo_torch_job import (  # noqa: E402
    BanditJob,
    JobOutcome,
    JobSettings,
    compare,
    deterministic_torch,
    state_digest,
)
from timeslice.errors import InvalidArgumentError  # noqa: E402

SMALL = {"hidden": 32, "batch": 64, "minibatch": 16, "epochs": 2}


def train(job: BanditJob, steps: int) -> JobOutcome:
    for _ in range(steps):
        rollout = job.rollout()
        job.train(rollout, job.score(rollout))
    return job.outcome()


def test_a_job_trains_to_the_same_bits_from_the_same_seed() -> None:
    with deterministic_torch():
        first = train(BanditJob("job-1", JobSettings(seed=7, **SMALL)), 3)
        again = train(BanditJob("job-1", JobSettings(seed=7, **SMALL)), 3)
        other = train(BanditJob("job-1", JobSettings(seed=8, **SMALL)), 3)
    assert len(first.losses) == 3 * JobSettings(seed=7, **SMALL).updates_per_step == 24
    assert first.steps == 3
    assert compare(first, again).identical
    assert first.losses != other.losses and first.params_sha256 != other.params_sha256
    assert not compare(first, other).params_identical


def test_a_job_learns_its_bandit() -> None:
    settings = JobSettings(seed=1, hidden=64, batch=256, minibatch=64, epochs=2, lr=3e-3)
    with deterministic_torch():
        outcome = train(BanditJob("job-1", settings), 12)
    assert outcome.rewards[-1] > outcome.rewards[0] + 0.3, outcome.rewards


def test_the_global_generator_is_left_alone() -> None:
    before = torch.random.get_rng_state()
    with deterministic_torch():
        train(BanditJob("job-1", JobSettings(seed=3, **SMALL)), 1)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_deterministic_torch_sets_the_previous_settings_back() -> None:
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    with deterministic_torch():
        assert torch.get_num_threads() == 1
        assert torch.are_deterministic_algorithms_enabled()
    assert torch.get_num_threads() == threads
    assert torch.are_deterministic_algorithms_enabled() == deterministic


def test_one_bit_of_one_parameter_changes_the_digest() -> None:
    job = BanditJob("job-1", JobSettings(seed=1, **SMALL))
    before = state_digest(job.policy)
    with torch.no_grad():
        weight = next(job.policy.parameters()).view(-1)
        weight[5] = torch.nextafter(weight[5], torch.tensor(math.inf))
    assert state_digest(job.policy) != before


def outcome(losses: tuple[float, ...], digest: str = "d") -> JobOutcome:
    return JobOutcome(name="job-1", losses=losses, rewards=(0.0,), params_sha256=digest)


def test_the_comparison_is_bit_for_bit() -> None:
    assert compare(outcome((1.0, -0.5)), outcome((1.0, -0.5))).identical
    assert compare(outcome((math.nan,)), outcome((math.nan,))).losses_identical
    # Equal as numbers, not as bits.
    assert not compare(outcome((0.0,)), outcome((-0.0,))).losses_identical
    assert not compare(outcome((1.0,)), outcome((math.nextafter(1.0, 2.0),))).identical
    assert not compare(outcome((1.0,)), outcome((1.0, 1.0))).losses_identical
    different = compare(outcome((1.0,), "a"), outcome((1.0,), "b"))
    assert different.losses_identical and not different.params_identical
    assert not different.identical


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"hidden": 0}, "hidden must be between 1"),
        ({"batch": 10**9}, "batch must be between 1"),
        ({"actions": 1}, "at least 2 actions"),
        ({"minibatch": 1000}, "minibatch must be between 1 and batch"),
        ({"lr": 0.0}, "lr must be between 0 and 1"),
        ({"seed": -1}, "seed must be between"),
    ],
)
def test_bad_settings_are_refused(change: dict[str, float], words: str) -> None:
    with pytest.raises(InvalidArgumentError, match=words):
        JobSettings(**{"seed": 1, **change})  # type: ignore[arg-type]
