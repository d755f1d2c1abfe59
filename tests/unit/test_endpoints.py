"""Which servers the app_endpoint backend may call (`timeslice.backends.endpoints`):
loopback, or under a prefix the agent allows (a whole origin, a path on a segment
boundary); anything else refused before a connection is made; and what an error
quotes of a server's answer is short."""

from __future__ import annotations

from typing import Any, cast

import pytest

from tests.fakes.fake_inference_server import FakeInferenceServer
from timeslice.agent.config import AgentConfig
from timeslice.backends import BackendContext, JobRef
from timeslice.backends.app_endpoint import AppEndpointBackend
from timeslice.backends.endpoints import check_allowed, is_allowed, is_loopback
from timeslice.errors import InvalidArgumentError, PermissionDeniedError

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    "endpoint",
    ["http://127.0.0.1:8000", "http://127.9.9.9:1/v1", "https://[::1]:9000", "http://localhost:8000",
     "http://[::ffff:7f00:1]:8000"],
)  # fmt: skip
def test_loopback(endpoint: str) -> None:
    assert is_loopback(endpoint) and is_allowed(endpoint, ())


@pytest.mark.parametrize(
    "endpoint",
    ["http://10.0.0.5:8000", "http://0.0.0.0:8000", "http://[::]:8000", "http://example.com:80",
     "http://localhost.example.com:80", "http://127.0.0.1.nip.io:80", "http://169.254.169.254:80"],
)  # fmt: skip
def test_not_loopback(endpoint: str) -> None:
    assert not is_loopback(endpoint)
    with pytest.raises(PermissionDeniedError, match="not on this node's loopback"):
        check_allowed([endpoint], ())


def test_a_prefix_is_a_whole_origin_and_whole_path_segments() -> None:
    prefixes = ("http://vllm.lab:8000", "https://10.0.0.5:9000/v1")
    for endpoint in ("http://vllm.lab:8000", "http://vllm.lab:8000/x", "https://10.0.0.5:9000/v1",
                     "https://10.0.0.5:9000/v1/a"):  # fmt: skip
        assert is_allowed(endpoint, prefixes), endpoint
    for endpoint in ("http://vllm.lab:80", "http://vllm.lab:80001", "http://vllm.lab.example.com:8000",
                     "https://vllm.lab:8000", "https://10.0.0.5:9000/v10", "https://10.0.0.5:9000",
                     "http://10.0.0.5:9000/v1"):  # fmt: skip
        assert not is_allowed(endpoint, prefixes), endpoint


def test_the_agent_config_normalizes_its_prefixes() -> None:
    config = AgentConfig(node_name="n", app_endpoint_allow=("HTTP://VLLM.lab:8000/",))
    assert config.app_endpoint_allow == ("http://vllm.lab:8000",)
    with pytest.raises(InvalidArgumentError, match="explicit port"):
        AgentConfig(node_name="n", app_endpoint_allow=("http://vllm.lab",))
    with pytest.raises(InvalidArgumentError, match="path prefix"):
        AgentConfig(node_name="n", app_endpoint_allow=("http://vllm.lab:80/?x=1",))


def backend(*allowed: str) -> AppEndpointBackend:
    context = BackendContext(node_name="n", channels=cast(Any, None), allowed_urls=allowed)
    return AppEndpointBackend(context)


async def test_the_backend_refuses_before_connecting() -> None:
    b = backend()
    job = JobRef("g", "j", {"app": "vllm", "endpoints": ["http://10.255.255.1:8000"]})
    try:
        with pytest.raises(PermissionDeniedError):
            await b.check(job)
        # A job known from before the rule (a saved job table) is refused at its call.
        with pytest.raises(PermissionDeniedError):
            await b.snapshot(job, {})
        assert b._client is None  # no HTTP client was ever made
    finally:
        await b.close()


async def test_an_error_quotes_little_of_a_servers_answer() -> None:
    async with FakeInferenceServer("vllm") as server:
        server.fail["/sleep"] = (500, "secret " * 200)
        b = backend()
        try:
            with pytest.raises(Exception) as raised:
                await b.snapshot(JobRef("g", "j", {"app": "vllm", "endpoints": [server.url]}), {})
        finally:
            await b.close()
    message = str(raised.value)
    assert "HTTP 500" in message and message.count("secret") <= 12 and len(message) < 300
