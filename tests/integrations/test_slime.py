"""`TimeSliceSlimeCallback` against Slime's phase-callback contract (the module's
docstring): Slime cannot be installed on the CPU machines that run these tests, so
loops call ``on_phase_begin`` / ``on_phase_end`` as Slime's synchronous and
asynchronous drivers do, around a real tiny torch RL step whose trainer (policy
and optimizer) and sampler (a rollout copy of the policy) are separate pools.

With a recording client: the v1alpha1 integration's phase-to-pool mapping, with
a phase's pools acquired in one call, the trainer-then-sampler order of the
asynchronous overlap, the environment's configuration and its no-op mode.
Through a real orchestrator and agent: two jobs, one on each driver, share both
pools, and each one's state in a pool is out whenever the other uses that pool;
a driver that dies without releasing loses its pools when its lease runs out.
"""

from __future__ import annotations

import atexit
import threading
import time
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
from timeslice.integrations import slime  # noqa: E402
from timeslice.integrations.slime import TimeSliceSlimeCallback, TimesliceCallback  # noqa: E402
from timeslice.orchestrator import events as ev  # noqa: E402
from timeslice.workloads.torch import TorchWorkload  # noqa: E402

pytestmark = pytest.mark.timeout(60)

STEPS = 3
T, S = "trainers", "samplers"


class NoHooks:
    def on_phase_begin(self, phase: str, role: str, context: object = None) -> None:
        pass

    def on_phase_end(self, phase: str, role: str, context: object = None) -> None:
        pass


At = Callable[[str], None]


def _nothing(phase: str) -> None:
    pass


def sync_driver(
    job: rl_loop.Policy, rollout: Any, seed: int, hooks: Any, at: At = _nothing
) -> list[float]:
    """Slime's synchronous driver: generate, train, sync the weights, each a phase."""
    generator = torch.Generator().manual_seed(seed)
    hooks.on_phase_begin("init", "both")
    at("init")
    rl_loop.sync_weights(rollout, job.model)
    hooks.on_phase_end("init", "both")
    losses = []
    for step in range(STEPS):
        context = {"rollout_id": step}
        hooks.on_phase_begin("generate", "sampler", context)
        at("generate")
        batch = rl_loop.prompts(generator)
        actions = rl_loop.generate(rollout, batch, generator)
        hooks.on_phase_end("generate", "sampler", context)
        score = rl_loop.rewards(batch, actions)
        hooks.on_phase_begin("train", "trainer", context)
        at("train")
        losses.append(rl_loop.update(job, batch, actions, score))
        hooks.on_phase_end("train", "trainer", context)
        hooks.on_phase_begin("weight_sync", "both", context)
        at("weight_sync")
        rl_loop.sync_weights(rollout, job.model)
        hooks.on_phase_end("weight_sync", "both", context)
    return losses


def async_driver(
    job: rl_loop.Policy, rollout: Any, seed: int, hooks: Any, at: At = _nothing
) -> list[float]:
    """Slime's asynchronous driver: the next generation is dispatched once training has
    the trainer pool, and runs beside it (one step off-policy)."""
    generator = torch.Generator().manual_seed(seed)
    hooks.on_phase_begin("init", "both")
    at("init")
    rl_loop.sync_weights(rollout, job.model)
    hooks.on_phase_end("init", "both")

    def dispatch(step: int) -> tuple[Any, Any]:
        hooks.on_phase_begin("generate", "sampler", {"rollout_id": step})
        at("generate")
        batch = rl_loop.prompts(generator)
        return batch, rl_loop.generate(rollout, batch, generator)

    pending = dispatch(0)
    losses = []
    for step in range(STEPS):
        hooks.on_phase_end("generate", "sampler", {"rollout_id": step})  # collected
        batch, actions = pending
        score = rl_loop.rewards(batch, actions)
        hooks.on_phase_begin("train", "trainer", {"rollout_id": step})
        at("train")
        if step + 1 < STEPS:
            pending = dispatch(step + 1)  # adds the sampler pool while training runs
        losses.append(rl_loop.update(job, batch, actions, score))
        hooks.on_phase_end("train", "trainer", {"rollout_id": step})
        hooks.on_phase_end("generate", "sampler", {"rollout_id": step + 1})
        hooks.on_phase_begin("weight_sync", "both", {"rollout_id": step})
        at("weight_sync")
        rl_loop.sync_weights(rollout, job.model)
        hooks.on_phase_end("weight_sync", "both", {"rollout_id": step})
    return losses


def recording_callback() -> tuple[TimeSliceSlimeCallback, RecordingClient]:
    client = RecordingClient()
    callback = TimeSliceSlimeCallback(
        job_id="job-a", trainer_group=T, sampler_group=S, client=client
    )
    return callback, client


# --- the hooks, with a recording client ---------------------------------------------------


def test_the_sync_driver_takes_each_phases_pools_in_one_call() -> None:
    callback, client = recording_callback()
    job = rl_loop.policy(1)
    sync_driver(job, rl_loop.rollout_copy(job.model), 1, callback)
    both = [("acquire", (T, S)), ("release", S), ("release", T)]
    step = [
        ("acquire", (S,)),
        ("release", S),
        ("acquire", (T,)),
        ("release", T),
        *both,
    ]
    assert client.calls == both + step * STEPS
    callback.close()
    assert client.held == set() and not client.closed


def test_the_async_driver_trains_with_both_pools_so_its_next_generation_waits_for_nothing() -> None:
    client = RecordingClient()  # it fails any acquire sent while a pool is held
    callback = TimeSliceSlimeCallback(
        job_id="job-a", trainer_group=T, sampler_group=S, async_driver=True, client=client
    )
    job = rl_loop.policy(1)
    states: list[tuple[str, bool, bool]] = []

    def at(phase: str) -> None:
        states.append((phase, callback.held("trainer"), callback.held("sampler")))

    async_driver(job, rl_loop.rollout_copy(job.model), 1, callback, at)
    assert ("generate", True, True) in states, "the next generation ran beside training"
    assert states.count(("train", True, True)) == STEPS
    acquired = [groups for call, groups in client.calls if call == "acquire"]
    assert acquired == [(T, S), (S,)] + [(T, S), (T, S)] * STEPS
    assert client.held == set()


def test_the_async_driver_without_its_setting_is_refused_rather_than_left_to_deadlock() -> None:
    callback, client = recording_callback()
    job = rl_loop.policy(1)
    with pytest.raises(ConflictError, match="while it holds"):
        async_driver(job, rl_loop.rollout_copy(job.model), 1, callback)
    assert client.calls[-1] == ("acquire", (T,)), "the generation's wait was not sent"


def test_asking_for_the_trainer_pool_while_only_the_sampler_pool_is_held_is_refused() -> None:
    callback, client = recording_callback()
    callback.on_phase_begin("generate", "sampler")
    with pytest.raises(ConflictError, match="while it holds"):
        callback.on_phase_begin("train", "trainer")
    assert client.calls == [("acquire", (S,))]
    callback.on_phase_end("generate", "sampler")
    callback.on_phase_begin("train", "trainer")  # fine once generation ended


def test_configuration_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(slime.ENV_ASYNC, "1")
    monkeypatch.setenv(slime.ENV_JOB_ID, "job-env")
    monkeypatch.setenv(slime.ENV_TRAINER_GROUP, "pool-t")
    monkeypatch.setenv(slime.ENV_SAMPLER_GROUP, "pool-s")
    client = RecordingClient()
    callback = TimesliceCallback(client=client)  # the v1alpha1 name
    assert callback.enabled and callback.job_id == "job-env" and callback.async_driver
    callback.on_phase_begin("weight_sync", "both")
    assert client.calls == [("acquire", ("pool-t", "pool-s"))]


def test_without_configuration_the_callback_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        slime.ENV_JOB_ID,
        slime.ENV_ORCH_ADDR,
        slime.ENV_TRAINER_GROUP,
        slime.ENV_SAMPLER_GROUP,
    ):
        monkeypatch.delenv(name, raising=False)
    callback = TimeSliceSlimeCallback()
    assert not callback.enabled
    job = rl_loop.policy(1)
    sync_driver(job, rl_loop.rollout_copy(job.model), 1, callback)
    assert not callback.held("trainer")
    callback.close()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"trainer_group": "same", "sampler_group": "same"},
        {"trainer_group": T, "sampler_group": S, "workloads": {"trainer": object()}},
        {"trainer_group": T, "sampler_group": S, "agent": "127.0.0.1:1", "workloads": {"x": 1}},
        {"trainer_group": T, "sampler_group": "bad/id" * 100},
    ],
)
def test_bad_configuration_is_refused(
    kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(slime.ENV_AGENT_ADDR, raising=False)
    with pytest.raises(InvalidArgumentError):
        TimeSliceSlimeCallback(job_id="a", client=RecordingClient(), **kwargs)


def test_an_unknown_role_is_refused() -> None:
    callback, client = recording_callback()
    with pytest.raises(InvalidArgumentError, match="role"):
        callback.on_phase_begin("train", "critic")
    assert client.calls == []


# --- through a real orchestrator and agent ------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path, [T, S]) as running:
        yield running


def pool_workloads(job: rl_loop.Policy, rollout: Any) -> dict[str, TorchWorkload]:
    trainer = TorchWorkload(chunk_bytes=64 << 10)
    trainer.add_module(job.model, name="policy")
    trainer.add_optimizer(job.optimizer, name="adam")
    sampler = TorchWorkload(chunk_bytes=64 << 10)
    sampler.add_module(rollout, name="rollout")
    return {"trainer": trainer, "sampler": sampler}


PHASE_POOLS = {
    "init": ("trainer", "sampler"),
    "weight_sync": ("trainer", "sampler"),
    "train": ("trainer",),  # and the sampler pool, on the asynchronous driver
    "generate": ("sampler",),
}


def test_two_slime_jobs_share_both_pools(cluster: Cluster) -> None:
    drivers = {"a": sync_driver, "b": async_driver}
    seeds = {"a": 1, "b": 2}
    alone = {}
    for name, seed in seeds.items():
        job = rl_loop.policy(seed)
        rollout = rl_loop.rollout_copy(job.model)
        alone[name] = (drivers[name](job, rollout, seed, NoHooks()), rl_loop.weights(job.model))

    jobs = {name: rl_loop.policy(seed) for name, seed in seeds.items()}
    rollouts = {name: rl_loop.rollout_copy(job.model) for name, job in jobs.items()}
    workloads = {name: pool_workloads(jobs[name], rollouts[name]) for name in seeds}
    callbacks = {
        name: TimeSliceSlimeCallback(
            job_id=name,
            orchestrator=cluster.orchestrator_address,
            trainer_group=T,
            sampler_group=S,
            agent=cluster.agent_address,
            workloads=workloads[name],
            async_driver=drivers[name] is async_driver,
        )
        for name in seeds
    }
    for group in (T, S):
        cluster.wait_registered(group, list(seeds))
    pools = {"trainer": T, "sampler": S}
    problems: list[str] = []
    phases: dict[str, list[str]] = {name: [] for name in seeds}
    losses: dict[str, list[float]] = {}
    errors: list[BaseException] = []

    def run(name: str) -> None:
        other = "b" if name == "a" else "a"
        callback = callbacks[name]

        def at(phase: str) -> None:
            phases[name].append(phase)
            both = callback.async_driver and phase == "train"
            for role in ("trainer", "sampler") if both else PHASE_POOLS[phase]:
                holder = cluster.holder(pools[role])
                state = workloads[other][role].state
                if (holder, state) != (name, "SAVED"):
                    problems.append(f"{name} {phase}: {role} pool held by {holder}, other {state}")
            if len(PHASE_POOLS[phase]) == 2 or both:  # both pools, granted by one call
                result = callback.locks.last_result
                granted = {g.group_id for g in result.grants} if result else set()
                if granted != {T, S}:
                    problems.append(f"{name} {phase}: granted {granted} at once")

        try:
            losses[name] = drivers[name](jobs[name], rollouts[name], seeds[name], callback, at)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(name,)) for name in seeds]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(40)
        assert not errors, errors
        assert problems == []
        assert phases["a"].count("weight_sync") == phases["b"].count("weight_sync") == STEPS
        for callback in callbacks.values():
            assert callback.locks is not None and callback.locks.held == frozenset()
    finally:
        for callback in callbacks.values():
            callback.close()
    for name in seeds:
        expected_losses, expected_weights = alone[name]
        assert losses[name] == expected_losses
        found = rl_loop.weights(jobs[name].model)
        assert all(torch.equal(found[k], v) for k, v in expected_weights.items())
        assert all(w.state == "RUNNING" for w in workloads[name].values())


def test_a_driver_that_dies_holding_loses_its_pools_when_its_lease_runs_out(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    exit_handlers: list[object] = []
    monkeypatch.setattr(atexit, "register", lambda fn, *a, **k: exit_handlers.append(fn))
    address = cluster.orchestrator_address
    dying = TimeSliceSlimeCallback(
        job_id="dying", orchestrator=address, trainer_group=T, sampler_group=S, lease_ttl_sec=0.5
    )
    dying.on_phase_begin("weight_sync", "both")
    assert dying.locks is not None
    dying.locks.client.close()  # the process stops: no renewal, no release

    survivor = TimeSliceSlimeCallback(
        job_id="survivor", orchestrator=address, trainer_group=T, sampler_group=S
    )
    began = time.monotonic()
    survivor.on_phase_begin("weight_sync", "both")
    waited = time.monotonic() - began
    try:
        assert survivor.held("trainer") and survivor.held("sampler")
        assert cluster.holder(T) == cluster.holder(S) == "survivor"
        revoked = {(e.group, e.job, e.reason) for e in cluster.effects(ev.Revoked)}
        assert revoked == {(g, "dying", ev.Reason.LEASE_EXPIRED) for g in (T, S)}
        assert 0.2 < waited < 5
        assert exit_handlers == [], "the lease, not an exit handler, frees a dead driver's pools"
    finally:
        survivor.close()
