"""What the orchestrator tells its watchers, at a cost that does not grow with
their number on the path of a decision.

A notice is appended once to a log per filter (one group, or every group) and
form (the `Notice` itself, or what a watch's `render` makes of it: the wire
servicer's encoded event). Telling N watchers is then one append per log, not N
puts: each watch reads its log from its own cursor when it next runs, and takes
everything that came since in one batch.

Waking the watches is left to a pump task that wakes a few of them at a time and
then lets the event loop serve everything else: with thousands of watchers, the
writes to their streams share the loop with the calls instead of stalling them.
A watch takes its items only when the pump wakes it, also when they came while
it was still writing its last batch (a slow reader's flow control lets many go
at once): so every write waits its turn. A watch that falls `backlog` items
behind its log is ended (`lagged`); the log keeps no more than that for anyone.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

from timeslice.errors import ResourceExhaustedError
from timeslice.orchestrator.events import Effect

_T = TypeVar("_T")

# Watches woken per turn of the event loop: each then writes its batch (about
# 25 us on loopback), so a turn stays well under a millisecond and a call in
# flight waits at most that long per step.
WAKES_PER_TURN = 8
# The share of the event loop's time that waking watches may take: after each
# pass over them the pump rests in proportion to how long the pass took. With a
# handful of watchers a pass takes microseconds and so does the rest; with
# thousands, each watcher gets its events in fewer, larger batches, and the
# calls keep the rest of the loop.
WATCH_SHARE = 0.3


@dataclass(frozen=True)
class Notice:
    """One thing that happened to a group, as `watch` reports it."""

    effect: Effect
    time: float


#: What a watch makes of a notice (None: nothing to tell). Watches whose renders
#: are equal share a log, so each notice is rendered once for all of them.
Render = Callable[[Notice], Any]


class _Log:
    """The items of one filter and one form, kept for the watches that read them."""

    def __init__(self, key: tuple[str, Render | None]) -> None:
        self.key = key
        self.items: list[Any] = []
        self.base = 0  # the sequence number of items[0]
        self.watches: set[Watch[Any]] = set()
        self.dirty = False  # has items that its watches have not all been woken for

    @property
    def head(self) -> int:
        return self.base + len(self.items)

    def append(self, item: Any, backlog: int) -> None:
        self.items.append(item)
        if len(self.items) > 2 * backlog:  # trimmed in halves: amortized O(1)
            drop = len(self.items) - backlog
            del self.items[:drop]
            self.base += drop


class WatchHub:
    """The orchestrator's watches: at most `max_watchers` at once, each ended when it
    falls `backlog` items behind."""

    def __init__(self, max_watchers: int, backlog: int) -> None:
        self.max_watchers, self.backlog = max_watchers, backlog
        self.count = 0
        self._logs: dict[str, dict[Render | None, _Log]] = {}  # group ("" all) -> render -> log
        self._dirty: deque[_Log] = deque()
        self._ready: deque[Watch[Any]] = deque()  # watches with items, waiting their turn
        self._pump: asyncio.Task[None] | None = None
        self._closed = False

    @overload
    def watch(self, group: str = "", render: None = None) -> Watch[Notice]: ...

    @overload
    def watch(self, group: str, render: Callable[[Notice], _T | None]) -> Watch[_T]: ...

    def watch(self, group: str = "", render: Render | None = None) -> Watch[Any]:
        """A watch of `group` ("" for all), registered from this call on; its items
        are `Notice`s, or what `render` makes of them."""
        if self._closed:
            return Watch(self, _Log((group, render)), closed=True)
        if self.count >= self.max_watchers:
            raise ResourceExhaustedError(
                f"the orchestrator has {self.max_watchers} watchers, its limit"
            )
        logs = self._logs.setdefault(group, {})
        log = logs.get(render)
        if log is None:
            log = logs[render] = _Log((group, render))
        watch: Watch[Any] = Watch(self, log)
        log.watches.add(watch)
        self.count += 1
        return watch

    def publish(self, effect: Effect) -> None:
        """Tell every watch of `effect`'s group, and of all groups."""
        mine, everyone = self._logs.get(effect.group), self._logs.get("")
        if not mine and not everyone:
            return
        notice = Notice(effect, time.time())
        rendered: dict[Render | None, Any] = {}
        for logs in (mine, everyone):
            for render, log in (logs or {}).items():
                if render not in rendered:
                    rendered[render] = notice if render is None else render(notice)
                if (item := rendered[render]) is None:
                    continue
                log.append(item, self.backlog)
                if not log.dirty:
                    log.dirty = True
                    self._dirty.append(log)
        if self._dirty:
            self._start_pump()

    def close(self) -> None:
        """End every watch (each still gets what it was told), and refuse new ones."""
        self._closed = True
        if self._pump is not None:
            self._pump.cancel()  # an ended watch takes what it has without waiting its turn
        logs = [log for by_render in self._logs.values() for log in by_render.values()]
        for log in logs:
            for watch in list(log.watches):
                watch._end(lagged=False)
        self._logs.clear()

    def _start_pump(self) -> None:
        if self._pump is None and not self._closed:
            self._pump = asyncio.get_running_loop().create_task(self._wake_all())

    def _queue(self, watch: Watch[Any]) -> None:
        self._ready.append(watch)
        self._start_pump()

    def _forget(self, watch: Watch[Any]) -> None:
        log = watch._log
        if watch not in log.watches:
            return
        log.watches.discard(watch)
        self.count -= 1
        if not log.watches:
            group, render = log.key
            logs = self._logs.get(group, {})
            if logs.get(render) is log:
                del logs[render]
                if not logs:
                    del self._logs[group]

    async def _wake_all(self) -> None:
        loop = asyncio.get_running_loop()
        woken = 0
        try:
            while self._dirty or self._ready:
                began = loop.time()
                dirty, self._dirty = self._dirty, deque()
                ready, self._ready = self._ready, deque()
                for log in dirty:
                    log.dirty = False  # what comes from now on makes it dirty again
                for watches in [*(list(log.watches) for log in dirty), ready]:
                    for watch in watches:
                        if watch not in watch._log.watches:
                            continue  # closed while the pump let others run
                        if watch._log.head - watch._cursor > self.backlog:
                            watch._end(lagged=True)
                        elif watch._wake():
                            woken += 1
                            if not woken % WAKES_PER_TURN:
                                await asyncio.sleep(0)
                await asyncio.sleep(0)  # the last ones woken write their batches
                if self._dirty or self._ready:
                    await asyncio.sleep((loop.time() - began) * (1 / WATCH_SHARE - 1))
        finally:
            self._pump = None


class Watch(Generic[_T]):
    """What happens to a group from the moment the watch is made: an async iterator
    of items, or `batch()` for all that came since the last one at once."""

    def __init__(self, hub: WatchHub, log: _Log, closed: bool = False) -> None:
        self._hub, self._log = hub, log
        self._cursor = log.head
        self._waiter: asyncio.Future[None] | None = None
        self._woken = False  # the pump gave it its turn
        self._ended = closed
        self._taken: deque[_T] = deque()
        #: It was ended for falling `backlog` items behind.
        self.lagged = False

    @property
    def group(self) -> str:
        return self._log.key[0]

    async def batch(self) -> list[_T]:
        """The items that came since the last batch, waiting for one if none did;
        [] once the watch has ended (see `lagged`)."""
        while True:
            log = self._log
            if self.lagged:
                return []
            if self._cursor < log.head:
                if self._cursor < log.base or log.head - self._cursor > self._hub.backlog:
                    self._end(lagged=True)
                    return []
                if self._woken or self._ended:
                    self._woken = False
                    items = log.items[self._cursor - log.base :]
                    self._cursor = log.head
                    return items
                self._hub._queue(self)  # they came while it wrote: it waits its turn
            elif self._ended:
                return []
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def __aiter__(self) -> Watch[_T]:
        return self

    async def __anext__(self) -> _T:
        if not self._taken:
            self._taken.extend(await self.batch())
            if not self._taken:
                raise StopAsyncIteration
        return self._taken.popleft()

    def close(self) -> None:
        """Stop receiving items."""
        self._end(lagged=False)

    def _wake(self) -> bool:
        if self._waiter is None or self._waiter.done() or self._cursor >= self._log.head:
            return False
        self._woken = True
        self._waiter.set_result(None)
        return True

    def _end(self, lagged: bool) -> None:
        if self._ended and not lagged:
            return
        self._ended = True
        self.lagged = self.lagged or lagged
        self._hub._forget(self)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
