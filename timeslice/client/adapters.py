"""What `register_workload` drives when the agent says snapshot or restore.

Three kinds, tried in this order:

1. Callbacks: ``on_snapshot(mode, tags)`` and ``on_restore(tags)``, plain or
   ``async``, each returning None or ``(storage_bytes, device_bytes)``.
2. A vLLM engine (`LLM`, `LLMEngine`, `AsyncLLMEngine`, `AsyncLLM`, or any
   `EngineClient`), recognized by its class without importing vLLM. A snapshot
   is ``engine.sleep(level=1)`` for offload (weights to host memory, KV cache
   dropped) and ``level=2`` for discard; a restore is ``engine.wake_up(tags)``.
   vLLM's sleep takes no tags: it always sleeps the whole engine.
3. Any object with ``snapshot(mode, tags)`` and ``restore(tags)`` methods, such
   as `HostMemoryWorkload`. Its ``supported_modes``, ``default_mode``,
   ``tags``, ``store`` (where it keeps an offloaded context: "memory",
   "file") and ``pipelined`` (True: it moves its context tag by tag, so that
   a switch may overlap its restore with another's snapshot; see
   `timeslice.agent.pipeline`) attributes, when it has them, are the
   capabilities it registers with, and its ``state`` ("RUNNING" or "SAVED"),
   when it has one, is what it reports when it registers again.

Modes are named "offload" and "discard"; tags are lists of strings.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Final

from timeslice.backends import DISCARD, OFFLOAD, Moved, parse_mode
from timeslice.errors import InvalidArgumentError

# A callback may be a plain function or a coroutine function; it returns None or
# (storage_bytes, device_bytes), either of which may be None.
SnapshotCallback = Callable[[str, list[str]], Any]
RestoreCallback = Callable[[list[str]], Any]

# vLLM's engine classes that have the sleep API, by class name, in any module under `vllm`.
VLLM_ENGINE_CLASSES: Final = frozenset(
    {"LLM", "LLMEngine", "AsyncLLMEngine", "AsyncLLM", "EngineClient"}
)
VLLM_SLEEP_LEVELS: Final = {OFFLOAD: 1, DISCARD: 2}
VLLM_TAGS: Final = ("weights", "kv_cache")


@dataclass(frozen=True)
class Capabilities:
    """What a workload registers with: the modes it accepts (empty: any), its
    default mode (None: the agent's, offload), its region tags, and where it
    keeps an offloaded context ("memory", "file"; "": not said), and whether it
    moves its context tag by tag (`pipelined`)."""

    supported_modes: tuple[str, ...] = ()
    default_mode: str | None = None
    tags: tuple[str, ...] = ()
    store: str = ""
    pipelined: bool = False


@dataclass(frozen=True)
class WorkloadAdapter:
    """One workload, as the channel drives it."""

    kind: str
    snapshot: SnapshotCallback
    restore: RestoreCallback
    capabilities: Callable[[], Capabilities]
    # Where the workload says its context is ("RUNNING" or "SAVED"); None: it cannot say.
    state: Callable[[], str | None]

    async def run_snapshot(self, mode: str, tags: list[str], executor: Executor) -> Moved:
        """Snapshot; blocking callables run on `executor`."""
        return _moved(await _invoke(self.snapshot, (mode, tags), executor), "snapshot")

    async def run_restore(self, tags: list[str], executor: Executor) -> Moved:
        """Restore; blocking callables run on `executor`."""
        return _moved(await _invoke(self.restore, (tags,), executor), "restore")


def resolve_adapter(
    workload: object | None = None,
    on_snapshot: SnapshotCallback | None = None,
    on_restore: RestoreCallback | None = None,
    *,
    supported_modes: Iterable[str] | None = None,
    default_mode: str | None = None,
    tags: Iterable[str] | None = None,
) -> WorkloadAdapter:
    """The adapter for what `register_workload` was given; a clear error for anything
    it cannot drive. Explicit capabilities override what the workload declares."""
    explicit = _capabilities(supported_modes, default_mode, tags)
    if workload is not None and (on_snapshot is not None or on_restore is not None):
        raise InvalidArgumentError(
            "pass either a workload or the on_snapshot/on_restore callbacks, not both"
        )
    if workload is None:
        if on_snapshot is None and on_restore is None:
            raise InvalidArgumentError(
                "nothing to drive: pass a workload (a vLLM engine, or an object with"
                " snapshot(mode, tags) and restore(tags)), or on_snapshot and on_restore"
            )
        if on_snapshot is None or on_restore is None:
            missing = "on_restore" if on_restore is None else "on_snapshot"
            raise InvalidArgumentError(
                f"on_snapshot and on_restore go together: {missing} is missing"
            )
        _check_callable("on_snapshot", on_snapshot)
        _check_callable("on_restore", on_restore)
        return WorkloadAdapter(
            "callbacks", on_snapshot, on_restore, lambda: _merge(explicit, None), _unknown_state
        )
    if is_vllm_engine(workload):
        return _vllm_adapter(workload, explicit)
    snapshot = getattr(workload, "snapshot", None)
    restore = getattr(workload, "restore", None)
    if callable(snapshot) and callable(restore):
        return WorkloadAdapter(
            f"object:{type(workload).__qualname__}",
            snapshot,
            restore,
            lambda: _merge(explicit, _declared(workload)),
            functools.partial(_declared_state, workload),
        )
    raise InvalidArgumentError(
        f"cannot drive a {type(workload).__module__}.{type(workload).__qualname__}: expected a"
        " vLLM engine (LLM, AsyncLLM, ...) or an object with snapshot(mode, tags) and"
        " restore(tags) methods"
    )


def is_vllm_engine(obj: object) -> bool:
    """Whether `obj` is one of vLLM's engines (or a subclass), judged by class name
    and module so that vLLM need not be imported."""
    for cls in type(obj).__mro__:
        module = getattr(cls, "__module__", "") or ""
        if (module == "vllm" or module.startswith("vllm.")) and cls.__name__ in VLLM_ENGINE_CLASSES:
            return True
    return False


def _vllm_adapter(engine: Any, explicit: Capabilities) -> WorkloadAdapter:
    sleep = getattr(engine, "sleep", None)
    wake_up = getattr(engine, "wake_up", None)
    if not callable(sleep) or not callable(wake_up):
        raise InvalidArgumentError(
            f"this vLLM {type(engine).__name__} has no sleep()/wake_up(): use a vLLM release"
            " with sleep mode, and create the engine with enable_sleep_mode=True"
        )
    snapshot: SnapshotCallback
    restore: RestoreCallback
    if inspect.iscoroutinefunction(sleep):

        async def sleep_async(mode: str, tags: list[str]) -> None:
            await sleep(level=VLLM_SLEEP_LEVELS[mode])

        snapshot = sleep_async
    else:

        def sleep_blocking(mode: str, tags: list[str]) -> None:
            sleep(level=VLLM_SLEEP_LEVELS[mode])

        snapshot = sleep_blocking
    if inspect.iscoroutinefunction(wake_up):

        async def wake_up_async(tags: list[str]) -> None:
            await wake_up(tags=tags or None)

        restore = wake_up_async
    else:

        def wake_up_blocking(tags: list[str]) -> None:
            wake_up(tags=tags or None)

        restore = wake_up_blocking
    declared = Capabilities((OFFLOAD, DISCARD), OFFLOAD, VLLM_TAGS)
    return WorkloadAdapter(
        f"vllm:{type(engine).__name__}",
        snapshot,
        restore,
        lambda: _merge(explicit, declared),
        _unknown_state,
    )


async def _invoke(function: Callable[..., Any], args: tuple[Any, ...], executor: Executor) -> Any:
    if inspect.iscoroutinefunction(function):
        return await function(*args)
    result = await asyncio.get_running_loop().run_in_executor(executor, function, *args)
    if inspect.isawaitable(result):
        result = await result
    return result


def _moved(value: object, what: str) -> Moved:
    if value is None:
        return Moved()
    if isinstance(value, Moved):
        return value
    if isinstance(value, Sequence) and not isinstance(value, str | bytes) and len(value) == 2:
        storage, device = value
        if all(_is_byte_count(n) for n in (storage, device)):
            return Moved(storage, device)
    raise TypeError(
        f"{what} returned {value!r}; expected None or (storage_bytes, device_bytes),"
        " each a non-negative int or None"
    )


def _is_byte_count(value: object) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


def _capabilities(
    supported_modes: Iterable[str] | None, default_mode: str | None, tags: Iterable[str] | None
) -> Capabilities:
    """What the caller passed; fields left out are () or None."""
    if isinstance(supported_modes, str) or isinstance(tags, str):
        raise InvalidArgumentError("supported_modes and tags are lists of strings, not a string")
    modes = tuple(parse_mode(m) for m in supported_modes or ())
    default = None if default_mode is None else parse_mode(default_mode)
    return Capabilities(modes, default, tuple(tags or ()))


def _declared(workload: object) -> Capabilities:
    """The capabilities an object declares through its attributes."""
    modes = getattr(workload, "supported_modes", None)
    default = getattr(workload, "default_mode", None)
    tags = getattr(workload, "tags", None)
    store = getattr(workload, "store", None)
    declared = _capabilities(
        modes if isinstance(modes, Iterable) else None,
        default if isinstance(default, str) else None,
        tags if isinstance(tags, Iterable) else None,
    )
    return dataclasses.replace(
        declared,
        store=store if isinstance(store, str) else "",
        pipelined=getattr(workload, "pipelined", False) is True,
    )


def _merge(explicit: Capabilities, declared: Capabilities | None) -> Capabilities:
    base = declared or Capabilities()
    merged = Capabilities(
        explicit.supported_modes or base.supported_modes,
        explicit.default_mode or base.default_mode,
        explicit.tags or base.tags,
        base.store,
        base.pipelined,
    )
    if (
        merged.default_mode is not None
        and merged.supported_modes
        and merged.default_mode not in merged.supported_modes
    ):
        raise InvalidArgumentError(
            f"the default mode {merged.default_mode!r} is not among the supported modes"
            f" {list(merged.supported_modes)}"
        )
    return merged


def _declared_state(workload: object) -> str | None:
    state = getattr(workload, "state", None)
    return state if state in ("RUNNING", "SAVED") else None


def _unknown_state() -> str | None:
    return None


def _check_callable(name: str, value: object) -> None:
    if not callable(value):
        raise InvalidArgumentError(f"{name} must be callable, not {type(value).__name__}")
