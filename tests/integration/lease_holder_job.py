"""A job that holds a group under a lease and keeps it alive, run as a
subprocess by the fault tests.

    python lease_holder_job.py HOST:PORT GROUP JOB TTL_MS INTERVAL_MS

Prints `granted TOKEN` once it holds the group, then renews its lease every
INTERVAL_MS. When a renewal is refused it prints `keepalive STATUS`, sends a
Yield carrying its fencing token, prints `yield STATUS` and exits 0.
"""

from __future__ import annotations

import asyncio
import sys

import grpclib.client
from grpclib.exceptions import GRPCError

from timeslice.api.gen.timeslice_orchestrator import v1alpha1 as pb


async def hold(address: str, group: str, job: str, ttl_ms: int, interval_ms: int) -> None:
    host, _, port = address.rpartition(":")
    channel = grpclib.client.Channel(host, int(port))
    stub = pb.TimeSliceOrchestratorServiceStub(channel, timeout=10)
    try:
        grant = await stub.acquire(
            pb.AcquireRequest(job_id=job, group_id=group, lease_ttl_ms=ttl_ms)
        )
        print("granted", grant.fencing_token, flush=True)
        renewal = pb.KeepAliveRequest(group_id=group, job_id=job, lease_id=grant.lease.lease_id)
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await stub.keep_alive(renewal)
            except GRPCError as exc:
                print("keepalive", exc.status.name, flush=True)
                break
        request = pb.YieldRequest(job_id=job, group_id=group, fencing_token=grant.fencing_token)
        try:
            await stub.yield_(request)
        except GRPCError as exc:
            print("yield", exc.status.name, flush=True)
        else:
            print("yield OK", flush=True)
    finally:
        channel.close()


if __name__ == "__main__":
    address, group, job, ttl_ms, interval_ms = sys.argv[1:]
    asyncio.run(hold(address, group, job, int(ttl_ms), int(interval_ms)))
