"""`TimeSliceVerlPlugin` against veRL's trainer-hook contract (the module's
docstring): veRL cannot be installed on the CPU machines that run these tests, so a
loop calls the four hooks in the contract's order around a real tiny torch RL
step (sample, reward on the CPU, weight update).

With a recording client: what each hook acquires and yields, colocated and split,
synchronous and overlapping. Through a real orchestrator and agent: two jobs
share a group, each one's actor and optimizer state is out whenever the other
works, and both reach exactly the results they reach alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.optional import need

torch = need("torch")

import rl_loop  # noqa: E402
from plugin_cluster import Cluster  # noqa: E402
from plugin_fakes import RecordingClient  # noqa: E402

from timeslice.errors import ConflictError, InvalidArgumentError  # noqa: E402
from timeslice.integrations.verl import TimeSliceVerlPlugin  # noqa: E402
from timeslice.workloads.torch import TorchWorkload  # noqa: E402

pytestmark = pytest.mark.timeout(60)

STEPS = 4


class NoHooks:
    """The loop without the plugin."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


def verl_loop(
    job: rl_loop.Policy,
    seed: int,
    hooks: Any,
    at_phase: Callable[[str], None] = lambda phase: None,
) -> list[float]:
    """A synchronous PPO-style trainer's step, with the hooks where the contract puts them."""
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for step in range(STEPS):
        hooks.on_sample_begin(step)
        at_phase("sample")
        batch = rl_loop.prompts(generator)
        actions = rl_loop.generate(job.model, batch, generator)
        hooks.on_sample_end(step)
        score = rl_loop.rewards(batch, actions)  # on the CPU, the accelerators yielded
        hooks.on_weight_update_begin(step, metrics={"reward": float(score.mean())})
        at_phase("update")
        losses.append(rl_loop.update(job, batch, actions, score))
        hooks.on_weight_update_end(step)
    return losses


# --- the hooks, with a recording client ---------------------------------------------------


def test_colocated_each_phase_is_one_turn() -> None:
    client = RecordingClient()
    plugin = TimeSliceVerlPlugin("ppo", groups=["gpus"], client=client)
    job = rl_loop.policy(1)
    held = rl_loop.watch(job.model, lambda: "gpus" in plugin.locks.held)
    verl_loop(job, 1, plugin)
    assert client.calls == [("acquire", ("gpus",)), ("release", "gpus")] * (2 * STEPS)
    assert held == [True] * (2 * STEPS), "every forward (sample and update) held the group"
    plugin.close()
    assert not client.closed


def test_an_overlapping_sample_keeps_the_group_past_the_update_end() -> None:
    client = RecordingClient()
    plugin = TimeSliceVerlPlugin("ppo", groups=["gpus"], client=client)
    plugin.on_sample_begin(0)
    plugin.on_sample_end(0)
    plugin.on_sample_begin(1)  # the next sample, before this step's update
    plugin.on_weight_update_begin(0)
    plugin.on_weight_update_end(0)
    assert plugin.locks.held == {"gpus"}
    plugin.on_sample_end(1)
    assert client.calls == [("acquire", ("gpus",)), ("release", "gpus")] * 2


def test_split_placement_never_waits_for_one_pool_while_holding_the_other() -> None:
    client = RecordingClient()
    plugin = TimeSliceVerlPlugin(
        "ppo", sample_groups=["rollout"], update_groups=["train"], client=client
    )
    verl_loop(rl_loop.policy(1), 1, plugin)  # synchronous: one pool at a time
    assert (
        client.calls
        == [
            ("acquire", ("rollout",)),
            ("release", "rollout"),
            ("acquire", ("train",)),
            ("release", "train"),
        ]
        * STEPS
    )
    plugin.on_sample_begin(STEPS)
    with pytest.raises(ConflictError, match="while it holds"):
        plugin.on_weight_update_begin(STEPS - 1)  # overlapping: overlap=True is needed
    plugin.close()
    assert client.held == set()


def test_with_overlap_each_phase_holds_both_pools_so_an_overlap_waits_for_nothing() -> None:
    client = RecordingClient()
    plugin = TimeSliceVerlPlugin(
        "ppo", sample_groups=["rollout"], update_groups=["train"], overlap=True, client=client
    )
    plugin.on_sample_begin(1)
    plugin.on_weight_update_begin(0)
    plugin.on_sample_end(1)
    assert plugin.locks.held == {"rollout", "train"}, "the update still needs both"
    plugin.on_weight_update_end(0)
    assert client.calls == [
        ("acquire", ("rollout", "train")),
        ("release", "train"),
        ("release", "rollout"),
    ]


def test_a_phase_needing_several_groups_acquires_them_at_once() -> None:
    client = RecordingClient()
    plugin = TimeSliceVerlPlugin(
        "ppo", sample_groups=["rollout"], update_groups=["train", "rollout"], client=client
    )
    plugin.on_weight_update_begin(0)  # an update that syncs weights into the rollout
    assert client.calls == [("acquire", ("train", "rollout"))]


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"groups": []},
        {"groups": ["g"], "workloads": {"h": object()}, "agent": "127.0.0.1:1"},
        {"groups": ["g"], "workloads": {"g": object()}},
        {"groups": "g"},
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        TimeSliceVerlPlugin("ppo", client=RecordingClient(), **kwargs)


# --- through a real orchestrator and agent ------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path, ["g"]) as running:
        yield running


def actor_workload(job: rl_loop.Policy) -> TorchWorkload:
    workload = TorchWorkload(chunk_bytes=64 << 10)
    workload.add_module(job.model, name="actor")
    workload.add_optimizer(job.optimizer, name="adam")
    return workload


def test_two_verl_jobs_take_turns_on_one_group(cluster: Cluster) -> None:
    seeds = {"a": 1, "b": 2}
    alone = {}
    for name, seed in seeds.items():
        job = rl_loop.policy(seed)
        alone[name] = (verl_loop(job, seed, NoHooks()), rl_loop.weights(job.model))

    jobs = {name: rl_loop.policy(seed) for name, seed in seeds.items()}
    workloads = {name: actor_workload(job) for name, job in jobs.items()}
    plugins = {
        name: TimeSliceVerlPlugin(
            name,
            groups=["g"],
            orchestrator=cluster.orchestrator_address,
            agent=cluster.agent_address,
            workloads={"g": workloads[name]},
        )
        for name in seeds
    }
    cluster.wait_registered("g", list(seeds))
    held = {
        n: rl_loop.watch(j.model, lambda n=n: "g" in plugins[n].locks.held) for n, j in jobs.items()
    }
    seen: dict[str, list[tuple[str, str | None, str, int]]] = {name: [] for name in seeds}
    losses: dict[str, list[float]] = {}
    errors: list[BaseException] = []

    def run(name: str) -> None:
        other = "b" if name == "a" else "a"

        def at_phase(phase: str) -> None:
            seen[name].append(
                (
                    phase,
                    cluster.holder("g"),
                    workloads[other].state,
                    rl_loop.numel(jobs[other].model),
                )
            )

        try:
            losses[name] = verl_loop(jobs[name], seeds[name], plugins[name], at_phase)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(name,)) for name in seeds]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(40)
        assert not errors, errors
        for name in seeds:
            # Each phase ran while this job held the group and the other's state was out.
            assert [phase for phase, *_ in seen[name]] == ["sample", "update"] * STEPS
            assert {(holder, state, n) for _, holder, state, n in seen[name]} == {
                (name, "SAVED", 0)
            }
            assert held[name] == [True] * (2 * STEPS)
            assert plugins[name].locks.held == frozenset()
        # The job that did not hold last is out, optimizer state and all.
        out = [name for name in seeds if workloads[name].state == "SAVED"]
        assert len(out) == 1
        assert any(".state[" in label for label in workloads[out[0]].saved)
    finally:
        for plugin in plugins.values():
            plugin.close()  # brings a state left out back
    for name in seeds:
        assert workloads[name].state == "RUNNING"
        expected_losses, expected_weights = alone[name]
        assert losses[name] == expected_losses
        found = rl_loop.weights(jobs[name].model)
        assert all(torch.equal(found[k], v) for k, v in expected_weights.items())
