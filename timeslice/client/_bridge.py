"""Crossing between event loops and threads; what `acquire()` and
`on_accelerators()` return.

A client's channel belongs to one event loop. `run_blocking` calls into that
loop from another thread and waits; `run_on` calls into it from a coroutine on
any loop. `OnAccelerators` builds on both, so one object serves `with`,
`async with`, and decorating a plain or an async function.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Generator
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, overload

from timeslice.client.types import AcquireResult

T = TypeVar("T")
P = ParamSpec("P")


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def _call(factory: Callable[[], Awaitable[T]]) -> T:
    return await factory()


class LoopThread:
    """An event loop of its own on a daemon thread, for a blocking facade over an
    async client: calls are sent to it with `run`, and it keeps running (lease
    renewals, a workload channel) while the caller's thread computes."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(started,), name=name, daemon=True)
        self.thread.start()
        started.wait()

    def _serve(self, started: threading.Event) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        loop.call_soon(started.set)
        try:
            loop.run_forever()
        finally:
            try:
                tasks = asyncio.all_tasks(loop)
                for task in tasks:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    def run(self, factory: Callable[[], Awaitable[T]]) -> T:
        """Run `factory()` on the loop and wait here for its result."""
        return run_blocking(self.loop, factory)

    def stop(self, closing: Callable[[], Awaitable[object]] | None = None) -> None:
        """Run `closing()` on the loop (if given), then stop the loop. Returns at once,
        from any thread; safe to call twice. Does not hold a reference to the facade,
        so it can be its `weakref.finalize` callback."""
        loop = self.loop

        def close_then_stop() -> None:
            if closing is None:
                loop.stop()
                return
            task = loop.create_task(_call(closing))
            task.add_done_callback(lambda _: loop.stop())

        with contextlib.suppress(RuntimeError):  # the loop is closed already
            loop.call_soon_threadsafe(close_then_stop)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end (not from the loop's own thread)."""
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout)


def run_blocking(loop: asyncio.AbstractEventLoop | None, factory: Callable[[], Awaitable[T]]) -> T:
    """Runs `factory()` on `loop`, which runs in another thread, and waits here for the result.

    Raises what the coroutine raises. If this thread is interrupted while it
    waits, the coroutine is cancelled.
    """
    if loop is None or loop.is_closed() or not loop.is_running():
        raise RuntimeError(
            "the client's event loop is not running: use the async client with"
            " 'await' or 'async with', or use TimeSliceOrchestratorClient from plain code"
        )
    if _running_loop() is loop:
        raise RuntimeError(
            "a blocking call from inside the client's own event loop would stall it:"
            " use 'async with' or 'await' there"
        )
    future = asyncio.run_coroutine_threadsafe(_call(factory), loop)
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise


async def run_on(loop: asyncio.AbstractEventLoop | None, factory: Callable[[], Awaitable[T]]) -> T:
    """Awaits `factory()` on `loop`; here when `loop` is this one or not chosen yet."""
    if loop is None or loop is asyncio.get_running_loop():
        return await factory()
    if loop.is_closed() or not loop.is_running():
        raise RuntimeError("the client's event loop is not running")
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_call(factory), loop))


class OnAccelerators:
    """Holds a group's lock around a block or a function call; releases it even on error.

    One object works four ways::

        with client.on_accelerators() as result: ...
        async with client.on_accelerators() as result: ...

        @client.on_accelerators()
        def train_step(): ...

        @client.on_accelerators()
        async def train_step(): ...

    A decorated function acquires on every call. When the block raises, a
    failed release is logged and the block's exception is the one raised.
    A blocking use (`with`, a plain function) must not run on the thread of
    the client's own event loop.
    """

    def __init__(
        self,
        *,
        acquire: Callable[[], Awaitable[AcquireResult]],
        release: Callable[[BaseException | None], Awaitable[None]],
        loop: Callable[[], asyncio.AbstractEventLoop | None],
    ) -> None:
        self._acquire = acquire
        self._release = release
        self._loop = loop

    def __enter__(self) -> AcquireResult:
        return run_blocking(self._loop(), self._acquire)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        run_blocking(self._loop(), lambda: self._release(exc))

    async def __aenter__(self) -> AcquireResult:
        return await run_on(self._loop(), self._acquire)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await run_on(self._loop(), lambda: self._release(exc))

    @overload
    def __call__(
        self, function: Callable[P, Coroutine[Any, Any, T]]
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...

    @overload
    def __call__(self, function: Callable[P, T]) -> Callable[P, T]: ...

    def __call__(self, function: Callable[P, Any]) -> Callable[P, Any]:
        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def run_async(*args: P.args, **kwargs: P.kwargs) -> Any:
                async with self:
                    return await function(*args, **kwargs)

            return run_async

        @functools.wraps(function)
        def run(*args: P.args, **kwargs: P.kwargs) -> Any:
            with self:
                return function(*args, **kwargs)

        return run


class AcquireCall(Coroutine[Any, Any, AcquireResult]):
    """What `AsyncTimeSliceOrchestratorClient.acquire()` returns.

    A coroutine: await it (or make a task of it) for the `AcquireResult`. Or
    use it with `async with` to release when the block ends, also when it
    raises. Like any coroutine, it runs once.
    """

    def __init__(
        self,
        job_id: str,
        group_id: str,
        *,
        acquire: Callable[[], Coroutine[Any, Any, AcquireResult]],
        release: Callable[[BaseException | None], Awaitable[None]],
    ) -> None:
        self.job_id = job_id
        self.group_id = group_id
        self._acquire = acquire
        self._release = release
        self._coroutine: Coroutine[Any, Any, AcquireResult] | None = None
        self.__qualname__ = self.__name__ = "AsyncTimeSliceOrchestratorClient.acquire"

    def _started(self) -> Coroutine[Any, Any, AcquireResult]:
        # Made on first use, so that a call never awaited leaves no warning.
        if self._coroutine is None:
            self._coroutine = self._acquire()
        return self._coroutine

    def __await__(self) -> Generator[Any, None, AcquireResult]:
        return self._started().__await__()

    def send(self, value: Any) -> Any:
        return self._started().send(value)

    def throw(
        self,
        typ: type[BaseException] | BaseException,
        val: object = None,
        tb: TracebackType | None = None,
    ) -> Any:
        if val is None and tb is None:
            return self._started().throw(typ)
        return self._started().throw(typ, val, tb)  # type: ignore[arg-type]

    def close(self) -> None:
        if self._coroutine is not None:
            self._coroutine.close()

    async def __aenter__(self) -> AcquireResult:
        return await self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._release(exc)
