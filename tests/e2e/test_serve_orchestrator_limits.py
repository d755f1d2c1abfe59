"""`serve orchestrator` takes the limits as options, and from its config file when
not given: over a limit a caller is answered RESOURCE_EXHAUSTED."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from orchestrator_process import Server, connect

from tests.ports import free_port
from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


async def second_group_refused(port: int) -> bool:
    async with connect(port) as stub:
        await stub.acquire(pb.AcquireRequest(job_id="a", group_id="g1"))
        try:
            await stub.acquire(pb.AcquireRequest(job_id="a", group_id="g2"))
        except GRPCError as error:
            assert error.status is Status.RESOURCE_EXHAUSTED
            return True
        return False


async def test_limits_come_from_the_options_and_else_from_the_config_file(
    serve: Callable[..., Awaitable[Server]], tmp_path: Path
) -> None:
    port = free_port()
    await serve(port, "memory", "--max-groups", "1")
    assert await second_group_refused(port)

    config = tmp_path / "orchestrator.toml"
    config.write_text("max_groups = 1\n")
    port = free_port()
    await serve(port, "memory", "--config", str(config))
    assert await second_group_refused(port)

    port = free_port()
    await serve(port, "memory", "--config", str(config), "--max-groups", "5")
    assert not await second_group_refused(port)
