"""Limits for the `cuda` backend: how long each kind of driver call may take,
how much of an operation's time is left, one operation at a time per GPU, and
driver calls in threads of their own with a time limit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

from timeslice.errors import DeadlineExceededError, InvalidArgumentError, UnavailableError

# The share of an operation's time kept for undoing a failed phase, at most this long.
ROLLBACK_SHARE: Final = 0.25
ROLLBACK_RESERVE_S: Final = 10.0


@dataclass(frozen=True)
class CudaTimeouts:
    """Limits per kind of driver call, in seconds: a lock (how long it may wait for
    the process's CUDA calls in flight), one checkpoint or restore, any other call."""

    lock_timeout_s: float = 30.0
    transfer_timeout_s: float = 600.0
    call_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidArgumentError(f"cuda: {f.name} must be a number of seconds")
            if not 0 < value < math.inf:
                raise InvalidArgumentError(f"cuda: {f.name} must be positive and finite")

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> CudaTimeouts:
        """The limits named in the backend's options; unknown names are refused."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise InvalidArgumentError(
                f"cuda: unknown options {unknown}; known: {', '.join(sorted(known))}"
            )
        values: dict[str, float] = {}
        for name, text in options.items():
            try:
                values[name] = float(text)
            except ValueError:
                raise InvalidArgumentError(f"cuda: {name} must be a number, got {text!r}") from None
        return cls(**values)


class Budget:
    """An operation's time: its forward steps must be done by `soft`, which leaves
    a share before the caller's deadline for a rollback. No timeout: no limit."""

    def __init__(self, timeout: Any = None) -> None:
        if timeout is None:
            self.soft = math.inf
            return
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise InvalidArgumentError(f"an operation's timeout must be a number, got {timeout!r}")
        reserve = min(ROLLBACK_RESERVE_S, max(0.0, timeout) * ROLLBACK_SHARE)
        self.soft = time.monotonic() + timeout - reserve

    def left(self) -> float:
        return self.soft - time.monotonic()


class DeviceLocks:
    """One asyncio.Lock per device, taken in sorted order (so never a deadlock)."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    @contextlib.asynccontextmanager
    async def hold(self, devices: Iterable[str], budget: Budget) -> AsyncIterator[None]:
        held: list[asyncio.Lock] = []
        try:
            for device in sorted(set(devices)):
                lock = self._locks.setdefault(device, asyncio.Lock())
                try:
                    async with asyncio.timeout(budget.left() if budget.soft < math.inf else None):
                        await lock.acquire()
                except TimeoutError:
                    raise DeadlineExceededError(
                        f"GPU {device} stayed busy with another job's operation"
                    ) from None
                held.append(lock)
            yield
        finally:
            for lock in reversed(held):
                lock.release()


class DriverThreads:
    """Runs blocking calls each in a thread of its own, with a time limit, and
    knows which processes have a call still running.

    A call that outlives its limit cannot be stopped: its thread is a daemon (so
    that it cannot hold up the agent's exit) and its process stays busy until it
    returns."""

    def __init__(self) -> None:
        self._running: dict[int, set[concurrent.futures.Future[Any]]] = {}
        self._lock = threading.Lock()
        self.closed = False

    async def call(
        self,
        what: str,
        function: Callable[..., Any],
        *args: Any,
        timeout: float,
        pid: int | None = None,
    ) -> Any:
        """`function(*args)`; DeadlineExceededError if it has not returned after `timeout`."""
        if self.closed:
            raise UnavailableError("the cuda backend is closed")
        if timeout <= 0:
            raise DeadlineExceededError(f"{what}: the operation ran out of time")
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if pid is not None:
            with self._lock:
                self._running.setdefault(pid, set()).add(future)
            future.add_done_callback(functools.partial(self._returned, pid))
        thread = threading.Thread(
            target=_run, args=(future, function, args), name=f"cuda {what}", daemon=True
        )
        try:
            thread.start()
        except RuntimeError as exc:  # no thread to be had
            future.cancel()
            raise UnavailableError(f"{what}: cannot start a thread ({exc})") from exc
        waiter = asyncio.wrap_future(future)
        try:
            done, _ = await asyncio.wait({waiter}, timeout=timeout)
        except asyncio.CancelledError:
            waiter.cancel()
            raise
        if not done:
            waiter.cancel()
            raise DeadlineExceededError(f"{what} did not return within {timeout:.3g} s")
        return waiter.result()

    def busy(self, pid: int) -> bool:
        """Whether a call on `pid` is still running."""
        with self._lock:
            return bool(self._running.get(pid))

    async def settle(self, pids: Iterable[int], timeout: float) -> None:
        """Wait (up to `timeout`) for the calls running on `pids` to return."""
        with self._lock:
            running = [future for pid in pids for future in self._running.get(pid, ())]
        if not running:
            return
        waiters = [asyncio.wrap_future(future) for future in running]
        try:
            await asyncio.wait(waiters, timeout=timeout)
        finally:
            for waiter in waiters:
                waiter.cancel()  # stop listening; the calls themselves go on

    def _returned(self, pid: int, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            running = self._running.get(pid)
            if running is not None:
                running.discard(future)
                if not running:
                    del self._running[pid]


def _run(
    future: concurrent.futures.Future[Any], function: Callable[..., Any], args: tuple[Any, ...]
) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = function(*args)
    except BaseException as exc:  # handed to the waiting coroutine, whatever it is
        future.set_exception(exc)
    else:
        future.set_result(result)
