"""A request's `BackendConfig` as the agent's backends take it: which backend, the
job's config, and the operation's parameters. The agent decodes every Snapshot,
Restore and switch with it; the orchestrator checks a job's registered backend
with it before keeping it."""

from __future__ import annotations

from typing import Any, Final

import betterproto2

from timeslice.api.gen.snapshot_agent import v1alpha1 as pb
from timeslice.backends import DISCARD, OFFLOAD
from timeslice.ids import check_pod_uid
from timeslice.errors import ConflictError, InvalidArgumentError, PermissionDeniedError

MODE_NAME: Final = {
    pb.SuspendMode.UNSPECIFIED: "",
    pb.SuspendMode.OFFLOAD: OFFLOAD,
    pb.SuspendMode.DISCARD: DISCARD,
}
APP_NAME: Final = {pb.App.VLLM: "vllm", pb.App.SGLANG: "sglang"}


def backend_of(
    config: pb.BackendConfig | None, legacy: pb.Backend
) -> tuple[str | None, dict[str, Any] | None, dict[str, Any]]:
    """(backend name, job config, operation params) of a request's backend config."""
    # `is not None`, not truth: a message's truth walks every field (an empty one is
    # read as none all the same).
    kind, value = betterproto2.which_one_of(config, "backend") if config is not None else ("", None)
    match value:
        case None:
            return ("cuda", None, {}) if legacy == pb.Backend.CUDA else (None, None, {})
        case pb.CudaBackendConfig():
            target = value.explicit_target
            pids = list(target.pids) if target is not None else []
            if 1 in pids:  # never a job's, on any node: not even kept
                raise PermissionDeniedError("pid 1 is the node's init process, no job's")
            pod = target.pod_uid if target is not None else ""
            if pod:
                if pids:
                    raise InvalidArgumentError("a cuda target names pids or a pod_uid, not both")
                return "cuda", {"pod_uid": check_pod_uid(pod)}, {}
            return "cuda", {"pids": pids}, {}
        case pb.AppEndpointConfig():
            if value.app not in APP_NAME:
                raise InvalidArgumentError("app_endpoint needs an app: APP_VLLM or APP_SGLANG")
            job = {"app": APP_NAME[value.app], "endpoints": list(value.endpoints)}
            return "app_endpoint", job, {"mode": _mode(value.mode), "tags": list(value.tags)}
        case pb.AppChannelConfig():
            return "app_channel", {}, {"mode": _mode(value.mode), "tags": list(value.tags)}
        case pb.NamedBackendConfig():
            if not value.name:
                raise InvalidArgumentError("a named backend needs a name")
            return value.name, dict(value.options), {}
        case pb.DirectMemoryBackendConfig():
            raise ConflictError("the direct_memory backend is disabled on this agent")
        case pb.MemoryRegionsBackendConfig():
            raise ConflictError("the memory_regions backend is not available on this agent")
    raise InvalidArgumentError(f"unknown backend config {kind!r}")


def _mode(mode: pb.SuspendMode) -> str:
    try:
        return MODE_NAME[mode]
    except KeyError:  # a number this protocol has no name for
        raise InvalidArgumentError(f"unknown suspend mode {int(mode)}") from None


def names_pod(config: pb.BackendConfig | None) -> bool:
    """Whether `config` is a `cuda` target naming a pod (which only an operator, or
    the orchestrator's discovery, may name)."""
    _, value = betterproto2.which_one_of(config, "backend") if config is not None else ("", None)
    target = value.explicit_target if isinstance(value, pb.CudaBackendConfig) else None
    return bool(target is not None and target.pod_uid)
