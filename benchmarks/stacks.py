"""Python gRPC servers side by side: what one unary call costs the server in each.

    python benchmarks/stacks.py --json OUT [--calls 1500] [--paced 50] [--rounds 3] [--quick]

The same echo method (benchmarks/common.py's route; the request's bytes sent back
as they came, parsed by no stack), served in a process of its own by each server,
called by the same client (a plain grpclib channel, this process), one server at a
time, in rounds that alternate them so that all share the machine's load:

  grpclib         grpclib on asyncio's own event loop: the stack the orchestrator
                  and the agents are built on;
  grpclib-uvloop  the same on uvloop's event loop, where uvloop is installed;
  grpcio-aio      grpcio's asyncio server (HTTP/2 in its C core);
  grpcio-threads  grpcio's thread-pool server, the handler on a worker thread;
  h2core          our own gRPC server (timeslice.api.h2serve) on our own HTTP/2
                  connection (timeslice.api.h2core), asyncio's loop.

Each server answers `--calls` calls back to back, then `--paced` calls each after
the 120 ms pause of a handoff's waiter. Figures: the server's CPU per call (user +
system time of every thread, from /proc/PID/stat), the client's (this process's)
and the round trip's median, the medians of the rounds. Every row is beside
grpclib's, measured in the same rounds. In each round the h2core server is also
called by our own client (`timeslice.api.h2client`, `h2core+h2client`), beside
grpclib's client calling the same server.

What it answers: whether another Python gRPC server would make our calls cheap
enough to beat etcd's CPU per lock cycle (`anchors.py`), which takes two calls.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import statistics
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: the benchmarks are imported as a package
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import grpclib.const  # noqa: E402
from grpclib.client import Channel  # noqa: E402
from grpclib.server import Server, Stream  # noqa: E402

from benchmarks.common import (  # noqa: E402
    CALL_TIMEOUT,
    ECHO_ROUTE,
    Child,
    RawCodec,
    Row,
    add_common_arguments,
    describe,
    echo_request,
    format_table,
    machine,
    now,
    process_cpu,
    receive,
    run_main,
)
from timeslice.api.h2client import H2Channel  # noqa: E402
from timeslice.api.serving import Encoded, listening_socket  # noqa: E402

PAUSE = 0.12  # seconds before each paced call, as a handoff's waiter queues
STACKS = ("grpclib", "grpclib-uvloop", "grpcio-aio", "grpcio-threads", "h2core")
OUR_CLIENT = "h2core+h2client"  # the h2core server, called by timeslice.api.h2client
_SERVICE, _METHOD = ECHO_ROUTE.strip("/").split("/")


class _RawEcho:
    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            ECHO_ROUTE: grpclib.const.Handler(
                self.echo, grpclib.const.Cardinality.UNARY_UNARY, bytes, bytes
            )
        }

    async def echo(self, stream: Stream[bytes, bytes]) -> None:
        request = await stream.recv_message()
        assert request is not None
        await stream.send_message(request)


def available(stack: str) -> str:
    """Why `stack` cannot run here, or ""."""
    needs = {"grpclib-uvloop": "uvloop", "grpcio-aio": "grpc", "grpcio-threads": "grpc"}
    module = needs.get(stack)
    if module is not None and importlib.util.find_spec(module) is None:
        return f"{module} is not installed"
    return ""


def serve(conn: Connection, stack: str) -> None:
    """Process entry point: the echo served by `stack` on a loopback port; its
    address goes to `conn`, and "stop" (or the pipe closing) ends it."""
    if stack == "grpcio-threads":
        _serve_threads(conn)
        return
    if stack == "h2core":
        asyncio.run(_serve_h2core(conn))
        return
    main = _serve_grpcio_aio(conn) if stack == "grpcio-aio" else _serve_grpclib(conn)
    if stack == "grpclib-uvloop":
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)


async def _until_stopped(conn: Connection) -> None:
    with contextlib.suppress(EOFError, OSError):
        while await receive(conn) != "stop":
            pass


async def _serve_grpclib(conn: Connection) -> None:
    server = Server([_RawEcho()], codec=RawCodec())
    # Nagle off, as the servers' own listener has it: grpclib turns it off only on
    # sockets whose proto names TCP, and a reply held back waits for a delayed ACK.
    sock = listening_socket("127.0.0.1", 0)
    await server.start(sock=sock)
    conn.send("127.0.0.1:%d" % sock.getsockname()[1])
    await _until_stopped(conn)
    server.close()
    await server.wait_closed()


async def _serve_h2core(conn: Connection) -> None:
    from timeslice.api.h2serve import Call, H2Server, Route

    async def echo(call: Call) -> None:
        body = await call.recv(1 << 20)
        if body is not None:
            call.send(Encoded.of_body(body).frames)

    server = H2Server({ECHO_ROUTE: Route(echo)})
    sock = listening_socket("127.0.0.1", 0)
    await server.start(sock)
    conn.send("127.0.0.1:%d" % sock.getsockname()[1])
    await _until_stopped(conn)
    await server.stop()


def _grpc() -> Any:
    """grpcio, imported where a server of it runs (it may not be installed)."""
    import grpc  # type: ignore[import-untyped]

    return grpc


def _echo_handler(echo: Any) -> Any:
    """grpcio's handler of the echo route, answered by `echo(request, context)`."""
    grpc = _grpc()
    return grpc.method_handlers_generic_handler(
        _SERVICE, {_METHOD: grpc.unary_unary_rpc_method_handler(echo)}
    )


async def _echo_async(request: bytes, context: Any) -> bytes:
    return request


def _echo(request: bytes, context: Any) -> bytes:
    return request


async def _serve_grpcio_aio(conn: Connection) -> None:
    server = _grpc().aio.server()
    server.add_generic_rpc_handlers((_echo_handler(_echo_async),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    conn.send(f"127.0.0.1:{port}")
    await _until_stopped(conn)
    await server.stop(None)


def _serve_threads(conn: Connection) -> None:
    from concurrent.futures import ThreadPoolExecutor

    server = _grpc().server(ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((_echo_handler(_echo),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    conn.send(f"127.0.0.1:{port}")
    stopped = threading.Event()

    def wait() -> None:
        with contextlib.suppress(EOFError, OSError):
            while conn.recv() != "stop":
                pass
        stopped.set()

    threading.Thread(target=wait, daemon=True).start()
    stopped.wait()
    server.stop(None)


async def measure(
    address: str, pid: int, calls: int, pause: float, client: str = "grpclib"
) -> dict[str, float]:
    """`calls` echoes (each after `pause`) from `client` (grpclib's, or "h2client"):
    the round trip's median, the server's and the client's CPU per call, in
    milliseconds."""
    host, port = address.rsplit(":", 1)
    request = bytes(echo_request())
    channel = Channel(host, int(port), codec=RawCodec())
    ours = H2Channel(host, int(port))

    async def call_grpclib() -> bytes | None:
        async with channel.request(
            ECHO_ROUTE, grpclib.const.Cardinality.UNARY_UNARY, bytes, bytes, timeout=CALL_TIMEOUT
        ) as stream:
            await stream.send_message(request, end=True)
            return await stream.recv_message()

    async def call_ours() -> bytes | None:
        return await ours.unary(ECHO_ROUTE, request, CALL_TIMEOUT)

    send = call_ours if client == "h2client" else call_grpclib

    async def call() -> None:
        if await send() != request:
            raise RuntimeError(f"the echo at {address} sent back other bytes")

    try:
        for _ in range(20):  # connected, and every path warm
            await call()
        times = []
        cpu, mine = process_cpu(pid), time.process_time()
        for _ in range(calls):
            if pause:
                await asyncio.sleep(pause)
            t0 = now()
            await call()
            times.append(now() - t0)
        cpu, mine = process_cpu(pid) - cpu, time.process_time() - mine
    finally:
        channel.close()
        ours.close()
    return {
        "p50_ms": statistics.median(times) * 1e3,
        "cpu_ms": cpu / calls * 1e3,
        "client_cpu_ms": mine / calls * 1e3,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    skipped = {stack: why for stack in STACKS if (why := available(stack))}
    stacks = [stack for stack in STACKS if stack not in skipped]
    rounds: dict[str, list[dict[str, Any]]] = {stack: [] for stack in stacks}
    if "h2core" in stacks:
        rounds[OUR_CLIENT] = []
    for _ in range(args.rounds):
        for stack in stacks:
            async with Child(serve, stack, name=f"bench-{stack}") as server:
                pid = server.process.pid
                assert pid is not None
                clients = (
                    {stack: "grpclib", OUR_CLIENT: "h2client"}
                    if stack == "h2core"
                    else {stack: "grpclib"}
                )
                for key, client in clients.items():
                    rounds[key].append(
                        {
                            "back_to_back": await measure(
                                server.address, pid, args.calls, 0, client
                            ),
                            "paced": await measure(server.address, pid, args.paced, PAUSE, client),
                        }
                    )
    results = {
        stack: {
            f"{how}_{figure}": statistics.median(r[how][figure] for r in runs)
            for how in ("back_to_back", "paced")
            for figure in ("p50_ms", "cpu_ms", "client_cpu_ms")
        }
        for stack, runs in rounds.items()
    }
    return {
        "stacks": results,
        "rounds": rounds,
        "skipped": skipped,
        "parameters": {
            "calls": args.calls,
            "paced": args.paced,
            "pause_s": PAUSE,
            "rounds": args.rounds,
            "quick": args.quick,
        },
        "machine": machine(),
    }


def summary(r: dict[str, Any]) -> list[Row]:
    stacks = r["stacks"]
    ours = stacks.get("grpclib")
    if ours is None:
        return []
    rows = []
    for stack in STACKS[1:]:
        other = stacks.get(stack)
        if other is None:
            continue
        rows += [
            Row(f"server CPU per unary call, {stack}", other["back_to_back_cpu_ms"],
                ours["back_to_back_cpu_ms"], "ms",
                "baseline: grpclib's (our stack), the same echo, back to back"),
            Row(f"server CPU per unary call after a 120 ms pause, {stack}",
                other["paced_cpu_ms"], ours["paced_cpu_ms"], "ms",
                "baseline: grpclib's, paced as a handoff's waiter"),
            Row(f"unary round trip p50, {stack}", other["back_to_back_p50_ms"],
                ours["back_to_back_p50_ms"], "ms",
                "baseline: grpclib's; the same grpclib client for all"),
        ]  # fmt: skip
    theirs, client = stacks.get("h2core"), stacks.get(OUR_CLIENT)
    if theirs is not None and client is not None:
        rows += [
            Row("client CPU per unary call, timeslice.api.h2client",
                client["back_to_back_client_cpu_ms"], theirs["back_to_back_client_cpu_ms"], "ms",
                "baseline: grpclib's client; both calling the h2core server, back to back"),
            Row("server CPU per unary call, h2core called by h2client",
                client["back_to_back_cpu_ms"], theirs["back_to_back_cpu_ms"], "ms",
                "baseline: the same server called by grpclib's client"),
            Row("unary round trip p50, h2client to h2core", client["back_to_back_p50_ms"],
                theirs["back_to_back_p50_ms"], "ms",
                "baseline: grpclib's client to the same server"),
        ]  # fmt: skip
    return rows


def print_table(r: dict[str, Any]) -> None:
    print(f"timeslice stacks benchmark: {describe(r['machine'])}")
    for stack, why in r["skipped"].items():
        print(f"{stack} skipped: {why}")
    print(
        f"\n{'server':16} {'CPU/call':>9} {'p50':>9} {'CPU/call paced':>15} {'p50 paced':>10}"
        f" {'client CPU/call':>16}"
    )
    for stack, f in r["stacks"].items():
        print(
            f"{stack:16} {f['back_to_back_cpu_ms']:7.3f}ms {f['back_to_back_p50_ms']:7.3f}ms"
            f" {f['paced_cpu_ms']:13.3f}ms {f['paced_p50_ms']:8.3f}ms"
            f" {f['back_to_back_client_cpu_ms']:14.3f}ms"
        )
    print()
    print(format_table(summary(r)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser)
    parser.add_argument("--calls", type=int, default=1500, help="back-to-back calls per round")
    parser.add_argument("--paced", type=int, default=50, help="paced calls per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds through every server")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls, args.paced, args.rounds = min(args.calls, 200), min(args.paced, 10), 1
    if min(args.calls, args.paced, args.rounds) < 1:
        parser.error("--calls, --paced and --rounds must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    return run_main(parse_args(argv), run, print_table)


if __name__ == "__main__":
    sys.exit(main())
