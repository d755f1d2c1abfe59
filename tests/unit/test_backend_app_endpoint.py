"""The app_endpoint backend against fake vLLM and SGLang servers on 127.0.0.1."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any, cast

import pytest

from tests.backends.conformance import BackendConformance
from tests.fakes.fake_inference_server import FakeInferenceServer
from timeslice.backends import Backend, BackendContext, JobRef, Moved
from timeslice.backends.app_endpoint import TIMEOUT_OPTION, AppEndpointBackend
from timeslice.errors import (
    ConflictError,
    DeadlineExceededError,
    InternalError,
    InvalidArgumentError,
    UnavailableError,
)

pytestmark = pytest.mark.timeout(5)

Servers = Callable[..., Awaitable[list[FakeInferenceServer]]]


def context(**options: str) -> BackendContext:
    return BackendContext(node_name="node-a", channels=cast(Any, None), options=options)


def job(app: str, *servers: FakeInferenceServer) -> JobRef:
    return JobRef("group", "job", {"app": app, "endpoints": [s.url for s in servers]})


@pytest.fixture
async def backend() -> AsyncIterator[AppEndpointBackend]:
    b = AppEndpointBackend(context())
    yield b
    await b.close()


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    async with AsyncExitStack() as stack:

        async def start(app: str, count: int = 1, **settings: bool) -> list[FakeInferenceServer]:
            return [
                await stack.enter_async_context(FakeInferenceServer(app, **settings))
                for _ in range(count)
            ]

        yield start


# --- config and params ------------------------------------------------------------------


async def test_check_claims_each_endpoint_normalized() -> None:
    config = {
        "app": "vllm",
        "endpoints": ["HTTP://Node-1.Example:8000/", "https://[::1]:9000/v/", "http://10.0.0.2:80"],
    }
    # Beyond loopback only where the agent allows it (see tests/unit/test_endpoints.py).
    allowed = ("http://NODE-1.example:8000", "http://10.0.0.2:80/")
    backend = AppEndpointBackend(
        BackendContext(node_name="node-a", channels=cast(Any, None), allowed_urls=allowed)
    )
    claims = await backend.check(JobRef("g", "j", config))
    assert claims == (
        "endpoint:http://node-1.example:8000",
        "endpoint:https://[::1]:9000/v",
        "endpoint:http://10.0.0.2:80",
    )


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"app": "tgi", "endpoints": ["http://h:1"]}, "unknown app"),
        ({"endpoints": ["http://h:1"]}, "unknown app"),
        ({"app": "vllm"}, "non-empty list"),
        ({"app": "vllm", "endpoints": []}, "non-empty list"),
        ({"app": "vllm", "endpoints": "http://h:1"}, "non-empty list"),
        ({"app": "vllm", "endpoints": [8000]}, "not a URL"),
        ({"app": "vllm", "endpoints": ["h:8000"]}, "http:// or https://"),
        ({"app": "vllm", "endpoints": ["ftp://h:21"]}, "http:// or https://"),
        ({"app": "vllm", "endpoints": ["http://h"]}, "explicit port"),
        ({"app": "vllm", "endpoints": ["http://h:0"]}, "explicit port"),
        ({"app": "vllm", "endpoints": ["http://h:70000"]}, "out of range"),
        ({"app": "vllm", "endpoints": ["http://:8000"]}, "no host"),
        ({"app": "vllm", "endpoints": ["http://bad_host!:8000"]}, "bad host"),
        ({"app": "vllm", "endpoints": ["http://u:p@h:8000"]}, "credentials"),
        ({"app": "vllm", "endpoints": ["http://h:8000/?level=2"]}, "path prefix"),
        ({"app": "vllm", "endpoints": ["http://h:8000", "http://H:8000/"]}, "repeat"),
        ({"app": "vllm", "endpoints": ["http://h:1"], "mode": "offload"}, "unknown keys"),
    ],
)
async def test_check_refuses_a_bad_config(
    backend: AppEndpointBackend, config: dict[str, Any], says: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=says):
        await backend.check(JobRef("g", "j", config))


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"mode": "hibernate"}, "unknown suspend mode"),
        ({"mode": 1}, "mode must be a string"),
        ({"tags": "weights"}, "tags must be a list"),
        ({"tags": ["weights", ""]}, "tags must be a list"),
        ({"tags": ["kv_cache", "kv_cache"]}, "tags repeat"),
    ],
)
async def test_bad_params_are_refused_before_any_request(
    backend: AppEndpointBackend, servers: Servers, params: dict[str, Any], says: str
) -> None:
    [server] = await servers("vllm")
    with pytest.raises(InvalidArgumentError, match=says):
        await backend.snapshot(job("vllm", server), params)
    assert server.requests == []


@pytest.mark.parametrize("value", ["0", "-1", "soon", "inf", "nan"])
def test_a_bad_timeout_option_is_refused(value: str) -> None:
    with pytest.raises(InvalidArgumentError, match=TIMEOUT_OPTION):
        AppEndpointBackend(context(**{TIMEOUT_OPTION: value}))


async def test_it_is_a_backend_that_sees_no_accelerators(backend: AppEndpointBackend) -> None:
    assert isinstance(backend, Backend)
    assert backend.name == "app_endpoint"
    assert await backend.accelerators() == []


# --- vLLM -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "query", "weights_intact"),
    [
        ("", {}, True),
        ("offload", {"level": ["1"]}, True),
        ("discard", {"level": ["2"]}, False),
    ],
)
async def test_vllm_snapshot_sleeps_at_the_mode_level_and_restore_wakes(
    backend: AppEndpointBackend,
    servers: Servers,
    mode: str,
    query: dict[str, list[str]],
    weights_intact: bool,
) -> None:
    [server] = await servers("vllm")
    ref = job("vllm", server)
    assert await backend.state(ref) == "RUNNING"

    assert await backend.snapshot(ref, {"mode": mode, "tags": []}) == Moved(None, None)
    [sleep] = server.calls("/sleep")
    assert (sleep.method, sleep.query) == ("POST", query)
    assert server.sleeping and server.weights_intact is weights_intact
    assert await backend.state(ref) == "SAVED"

    assert await backend.restore(ref, {}) == Moved(None, None)
    [wake] = server.calls("/wake_up")
    assert (wake.method, wake.query) == ("POST", {})
    assert not server.sleeping
    assert await backend.state(ref) == "RUNNING"


async def test_vllm_sleeps_and_wakes_by_tag(backend: AppEndpointBackend, servers: Servers) -> None:
    [server] = await servers("vllm")
    ref = job("vllm", server)
    await backend.snapshot(ref, {"mode": "discard", "tags": ["kv_cache"]})
    assert server.calls("/sleep")[0].query == {"tags": ["kv_cache"]}  # tags win over a level
    assert server.released == {"kv_cache"} and server.weights_intact

    await backend.restore(ref, {"tags": ["kv_cache"]})
    assert server.calls("/wake_up")[0].query == {"tags": ["kv_cache"]}
    assert not server.sleeping


async def test_vllm_wakes_some_regions_and_still_counts_as_saved(
    backend: AppEndpointBackend, servers: Servers
) -> None:
    [server] = await servers("vllm")
    ref = job("vllm", server)
    await backend.snapshot(ref, {"mode": "discard"})
    await backend.restore(ref, {"tags": ["weights"]})
    assert server.calls("/wake_up")[0].query == {"tags": ["weights"]}
    assert server.released == {"kv_cache"}
    assert await backend.state(ref) == "SAVED"
    await backend.restore(ref, {"tags": ["kv_cache"]})
    assert await backend.state(ref) == "RUNNING"


async def test_vllm_offload_cannot_sleep_weights_by_tag(
    backend: AppEndpointBackend, servers: Servers
) -> None:
    [server] = await servers("vllm")
    with pytest.raises(InvalidArgumentError, match="offload cannot name 'weights'"):
        await backend.snapshot(job("vllm", server), {"mode": "offload", "tags": ["weights"]})
    assert server.requests == []


async def test_vllm_without_dev_mode_is_named_as_the_likely_cause(
    backend: AppEndpointBackend, servers: Servers
) -> None:
    [server] = await servers("vllm", dev_mode=False)
    with pytest.raises(ConflictError, match=r"HTTP 404.*VLLM_SERVER_DEV_MODE=1") as caught:
        await backend.snapshot(job("vllm", server), {"mode": "offload"})
    assert server.url in str(caught.value)


async def test_vllm_state_is_unknown_when_replicas_disagree_or_cannot_say(
    backend: AppEndpointBackend, servers: Servers
) -> None:
    awake, asleep, broken = await servers("vllm", 3)
    asleep.released = {"weights", "kv_cache"}
    broken.fail["/is_sleeping"] = (500, "engine dead")
    assert await backend.state(job("vllm", asleep)) == "SAVED"
    assert await backend.state(job("vllm", awake, asleep)) is None
    assert await backend.state(job("vllm", awake, broken)) is None
    await broken.close()
    assert await backend.state(job("vllm", awake, broken)) is None


async def test_vllm_state_is_unknown_for_an_unexpected_answer(
    backend: AppEndpointBackend, servers: Servers
) -> None:
    [server] = await servers("sglang")  # answers /is_sleeping with 404
    assert await backend.state(job("vllm", server)) is None


# --- several replicas and their failures ----------------------------------------------------


async def test_every_replica_switches_concurrently(
    backend: AppEndpointBackend, servers: Servers
) -> None:
    replicas = await servers("vllm", 3)
    for server in replicas:
        server.delay["/sleep"] = 0.3
    started = time.monotonic()
    await backend.snapshot(job("vllm", *replicas), {"mode": "offload"})
    assert time.monotonic() - started < 0.8  # three 0.3 s answers, side by side
    assert all(server.sleeping for server in replicas)

    await backend.restore(job("vllm", *replicas), {})
    assert not any(server.sleeping for server in replicas)


async def test_a_partial_offload_failure_wakes_the_replicas_that_slept(
    backend: AppEndpointBackend, servers: Servers
) -> None:
    ok1, failing, ok2 = await servers("vllm", 3)
    failing.fail["/sleep"] = (500, "CUDA error: out of memory")
    with pytest.raises(InternalError) as caught:
        await backend.snapshot(job("vllm", ok1, failing, ok2), {"mode": "offload"})
    message = str(caught.value)
    assert "failed on 1 of 3 endpoints" in message
    assert f"{failing.url}: POST /sleep?level=1 -> HTTP 500" in message
    assert "CUDA error: out of memory" in message
    assert f"resumed again: {ok1.url}, {ok2.url}" in message
    assert not ok1.sleeping and not ok2.sleeping
    assert len(ok1.calls("/wake_up")) == 1 and failing.calls("/wake_up") == []


async def test_a_partial_discard_failure_leaves_the_released_replicas_alone(
    backend: AppEndpointBackend, servers: Servers
) -> None:
    ok, failing = await servers("vllm", 2)
    failing.fail["/sleep"] = (503, "busy")
    with pytest.raises(InternalError, match=f"left released: {ok.url}"):
        await backend.snapshot(job("vllm", ok, failing), {"mode": "discard"})
    assert ok.sleeping and ok.calls("/wake_up") == []  # waking would serve lost weights


async def test_a_failed_wake_after_a_partial_failure_is_reported(
    backend: AppEndpointBackend, servers: Servers
) -> None:
    ok, failing = await servers("vllm", 2)
    failing.fail["/sleep"] = (400, "bad request")
    ok.fail["/wake_up"] = (500, "cannot wake")
    with pytest.raises(ConflictError) as caught:
        await backend.snapshot(job("vllm", ok, failing), {})
    message = str(caught.value)
    assert 'HTTP 400: {"error": {"message": "bad request"}}' in message
    assert f"resuming them again failed too: {ok.url}: POST /wake_up -> HTTP 500" in message


async def test_an_unreachable_replica_is_named(
    backend: AppEndpointBackend, servers: Servers
) -> None:
    ok, gone = await servers("vllm", 2)
    await gone.close()
    with pytest.raises(UnavailableError, match=f"{gone.url}: POST /sleep.*cannot reach it"):
        await backend.snapshot(job("vllm", ok, gone), {"mode": "offload"})
    assert not ok.sleeping
    with pytest.raises(UnavailableError, match=f"failed on 1 of 2.*{gone.url}"):
        await backend.restore(job("vllm", ok, gone), {})


async def test_a_replica_that_does_not_answer_in_time_fails_the_operation(
    servers: Servers,
) -> None:
    backend = AppEndpointBackend(context(**{TIMEOUT_OPTION: "0.2"}))
    try:
        [server] = await servers("vllm")
        server.delay["/wake_up"] = 2.0
        started = time.monotonic()
        with pytest.raises(DeadlineExceededError, match=r"no answer within 0\.2 s"):
            await backend.restore(job("vllm", server), {})
        assert time.monotonic() - started < 1.0
    finally:
        await backend.close()


async def test_a_closed_backend_refuses_calls(servers: Servers) -> None:
    [server] = await servers("vllm")
    backend = AppEndpointBackend(context())
    await backend.snapshot(job("vllm", server), {})
    await backend.close()
    await backend.close()
    with pytest.raises(UnavailableError, match="closed"):
        await backend.restore(job("vllm", server), {})


# --- SGLang ----------------------------------------------------------------------------


async def test_sglang_releases_and_resumes_with_json_bodies(
    backend: AppEndpointBackend, servers: Servers
) -> None:
    replicas = await servers("sglang", 2)
    ref = job("sglang", *replicas)
    assert await backend.snapshot(ref, {"mode": "offload"}) == Moved(None, None)
    for server in replicas:
        [release] = server.calls("/release_memory_occupation")
        assert (release.method, release.body) == ("POST", {})
        assert server.released == {"weights", "kv_cache", "cuda_graph"} and server.weights_intact
    assert await backend.state(ref) is None  # SGLang has no state query

    assert await backend.restore(ref, {"mode": "offload"}) == Moved(None, None)
    for server in replicas:
        [resume] = server.calls("/resume_memory_occupation")
        assert (resume.method, resume.body) == ("POST", {})
        assert not server.sleeping


async def test_sglang_passes_tags(backend: AppEndpointBackend, servers: Servers) -> None:
    [server] = await servers("sglang")
    ref = job("sglang", server)
    await backend.snapshot(ref, {"mode": "discard", "tags": ["kv_cache", "cuda_graph"]})
    assert server.calls("/release_memory_occupation")[0].body == {
        "tags": ["kv_cache", "cuda_graph"]
    }
    await backend.restore(ref, {"tags": ["kv_cache"]})
    assert server.calls("/resume_memory_occupation")[0].body == {"tags": ["kv_cache"]}
    assert server.released == {"cuda_graph"}


async def test_sglang_offload_of_weights_needs_their_host_copy(
    backend: AppEndpointBackend, servers: Servers
) -> None:
    backed, bare = await servers("sglang", 2, weights_cpu_backup=False)
    backed.weights_cpu_backup = True
    with pytest.raises(ConflictError, match=f"{bare.url}: keeps no host copy of its weights"):
        await backend.snapshot(job("sglang", backed, bare), {"mode": "offload"})
    assert backed.calls("/release_memory_occupation") == []
    assert bare.calls("/release_memory_occupation") == []

    # Without the weights, or when they may be dropped, it goes ahead.
    await backend.snapshot(job("sglang", bare), {"mode": "offload", "tags": ["kv_cache"]})
    assert bare.released == {"kv_cache"} and bare.weights_intact
    await backend.snapshot(job("sglang", bare), {"mode": "discard"})
    assert not bare.weights_intact


async def test_sglang_without_the_memory_saver_is_refused(
    backend: AppEndpointBackend, servers: Servers
) -> None:
    [server] = await servers("sglang", memory_saver=False)
    with pytest.raises(ConflictError, match="without --enable-memory-saver"):
        await backend.snapshot(job("sglang", server), {"mode": "discard"})
    assert server.calls("/release_memory_occupation") == []


async def test_sglang_settings_that_cannot_be_read_stop_the_snapshot(
    backend: AppEndpointBackend, servers: Servers
) -> None:
    ok, failing = await servers("sglang", 2)
    failing.fail["/get_server_info"] = (500, "oops")
    with pytest.raises(
        InternalError, match=f"cannot read the SGLang server settings: {failing.url}"
    ):
        await backend.snapshot(job("sglang", ok, failing), {})
    assert ok.calls("/release_memory_occupation") == []


async def test_sglang_partial_failure_resumes_what_it_released(
    backend: AppEndpointBackend, servers: Servers
) -> None:
    ok, failing = await servers("sglang", 2)
    failing.fail["/release_memory_occupation"] = (400, "not idle")
    with pytest.raises(ConflictError, match=f"resumed again: {ok.url}"):
        await backend.snapshot(job("sglang", ok, failing), {"mode": "offload"})
    assert not ok.sleeping and ok.calls("/resume_memory_occupation")[0].body == {}


# --- the suite every backend passes ------------------------------------------------------


class _Conformance(BackendConformance):
    app = ""

    @pytest.fixture
    async def fake(self) -> AsyncIterator[FakeInferenceServer]:
        async with FakeInferenceServer(self.app) as fake:
            self.replica = fake
            yield fake

    @pytest.fixture
    async def backend(self, fake: FakeInferenceServer) -> AsyncIterator[AppEndpointBackend]:
        b = AppEndpointBackend(context())
        yield b
        await b.close()

    @pytest.fixture
    def job(self, fake: FakeInferenceServer) -> JobRef:
        return job(self.app, fake)

    @pytest.fixture
    def bad_job(self) -> JobRef:
        return JobRef("g", "j", {"app": self.app, "endpoints": ["localhost"]})

    async def assert_saved(self, job: JobRef) -> None:
        assert self.replica.sleeping and self.replica.weights_intact

    async def assert_running(self, job: JobRef) -> None:
        assert not self.replica.sleeping and self.replica.weights_intact


class TestVLLMConformance(_Conformance):
    app = "vllm"


class TestSGLangConformance(_Conformance):
    app = "sglang"
