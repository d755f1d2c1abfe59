"""What the v1alpha1 compatibility tests share: compiling a proto with the
official tools at test time, and a timeslice server running on an event loop of
its own in a background thread, for the blocking `grpcio` stubs to call."""

from __future__ import annotations

import asyncio
import importlib
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc_tools
from grpc_tools import protoc

COMPAT = Path(__file__).parents[1] / "compat"


@contextmanager
def compiled(protos: Sequence[str], out: Path) -> Iterator[dict[str, ModuleType]]:
    """The `_pb2` and `_pb2_grpc` modules of `protos` (files in tests/compat),
    importable while the block runs."""
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    code = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{COMPAT}",
            f"-I{well_known}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            *(str(COMPAT / proto) for proto in protos),
        ]
    )
    assert code == 0, f"protoc failed on {', '.join(protos)}"
    names = [f"{Path(p).stem}{suffix}" for p in protos for suffix in ("_pb2", "_pb2_grpc")]
    sys.path.insert(0, str(out))
    try:
        yield {name: importlib.import_module(name) for name in names}
    finally:
        sys.path.remove(str(out))
        for name in names:
            sys.modules.pop(name, None)


@contextmanager
def serving_in_thread(
    server: Callable[[], AbstractAsyncContextManager[Any]],
    name: str,
    on_stop: Callable[[Any], None] = lambda _: None,
) -> Iterator[str]:
    """Run `server()` (an Orchestrator or Agent) on its own loop in a thread; yield
    its address. `on_stop(server)` runs on that loop before the server closes."""
    started = threading.Event()
    running: dict[str, Any] = {}

    async def serve() -> None:
        stop = asyncio.Event()
        async with server() as serving:
            running.update(address=serving.address, loop=asyncio.get_running_loop(), stop=stop)
            started.set()
            await stop.wait()
            on_stop(serving)

    def run() -> None:
        try:
            asyncio.run(serve())
        except BaseException as exc:
            running["error"] = exc
            raise
        finally:
            started.set()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    assert started.wait(20), f"the {name} did not start"
    if "error" in running:
        raise running["error"]
    try:
        yield running["address"]
    finally:
        running["loop"].call_soon_threadsafe(running["stop"].set)
        thread.join(20)
        assert not thread.is_alive(), f"the {name} did not stop"
        assert "error" not in running
