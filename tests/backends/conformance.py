"""What every backend must do, written once. A backend's tests subclass
`BackendConformance` and provide the fixtures:

- `backend`: the backend under test, constructed as the agent would;
- `job`: a JobRef the backend can act on (its context RUNNING);
- `bad_job`: a JobRef with a config the backend must refuse.

Hooks a subclass may override to check the context itself:
`assert_saved(job)` and `assert_running(job)`.
"""

from __future__ import annotations

import pytest

from timeslice.backends import AcceleratorMemory, Backend, JobRef, Moved, load_backend
from timeslice.errors import TimeSliceError


class BackendConformance:
    """Subclass me; see the module docstring."""

    async def assert_saved(self, job: JobRef) -> None:
        """The context is off the accelerators (override to look for yourself)."""

    async def assert_running(self, job: JobRef) -> None:
        """The context is back (override to look for yourself)."""

    def test_it_is_a_backend_found_by_its_name(self, backend: Backend) -> None:
        assert isinstance(backend, Backend)
        assert type(backend) is load_backend(backend.name)

    async def test_check_returns_the_claims(self, backend: Backend, job: JobRef) -> None:
        claims = await backend.check(job)
        assert isinstance(claims, tuple)
        assert all(isinstance(claim, str) and claim for claim in claims)

    async def test_check_refuses_a_bad_config(self, backend: Backend, bad_job: JobRef) -> None:
        with pytest.raises(TimeSliceError):
            await backend.check(bad_job)

    async def test_snapshot_then_restore(self, backend: Backend, job: JobRef) -> None:
        await backend.check(job)
        assert await backend.state(job) in ("RUNNING", None)
        moved = await backend.snapshot(job, {})
        _assert_measured(moved)
        assert await backend.state(job) in ("SAVED", None)
        await self.assert_saved(job)
        moved = await backend.restore(job, {})
        _assert_measured(moved)
        assert await backend.state(job) in ("RUNNING", None)
        await self.assert_running(job)

    async def test_many_cycles(self, backend: Backend, job: JobRef) -> None:
        await backend.check(job)
        for _ in range(5):
            await backend.snapshot(job, {})
            await backend.restore(job, {})
        await self.assert_running(job)

    async def test_accelerators_are_described(self, backend: Backend) -> None:
        for memory in await backend.accelerators():
            assert isinstance(memory, AcceleratorMemory)
            assert memory.id and 0 <= memory.used_bytes <= memory.total_bytes

    async def test_close_twice(self, backend: Backend) -> None:
        await backend.close()
        await backend.close()


def _assert_measured(moved: Moved) -> None:
    assert isinstance(moved, Moved)
    for value in (moved.storage_bytes, moved.device_bytes):
        assert value is None or (isinstance(value, int) and value >= 0)
