"""What NVML says about the accelerators and the processes on them, for the
`cuda` backend: each device's memory, and which devices a job's processes use
and how much memory they hold there.

NVML is optional and best-effort: without nvidia-ml-py, without a driver, or on
any NVML error, the answers are "cannot tell" (None, or no devices), never a
guess. Everything here is synchronous; the backend calls it in worker threads.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from timeslice.backends import AcceleratorMemory


@dataclass(frozen=True)
class Usage:
    """The devices a set of processes holds memory on, and how much in all
    (None when NVML does not report the amount)."""

    devices: frozenset[str]
    bytes: int | None


class Nvml:
    """NVML, initialized on first use; `module` is pynvml or a stand-in for it."""

    def __init__(self, module: Any | None = None) -> None:
        self._module = module
        self._ready = False
        self._lock = threading.Lock()

    def _nvml(self) -> Any | None:
        with self._lock:
            if self._ready:
                return self._module
            module = self._module
            if module is None:
                try:
                    module = importlib.import_module("pynvml")
                except ImportError:
                    return None
            try:
                module.nvmlInit()
            except Exception:  # no library, no driver: NVML cannot tell anything
                return None
            self._module, self._ready = module, True
            return module

    def _devices(self, nvml: Any) -> list[tuple[str, Any]]:
        devices = []
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            try:
                uuid = nvml.nvmlDeviceGetUUID(handle)
                device_id = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            except Exception:
                device_id = str(index)
            devices.append((device_id, handle))
        return devices

    def memory(self) -> list[AcceleratorMemory]:
        """Every device's memory; none when NVML cannot tell."""
        nvml = self._nvml()
        if nvml is None:
            return []
        try:
            result = []
            for device_id, handle in self._devices(nvml):
                info = nvml.nvmlDeviceGetMemoryInfo(handle)
                result.append(AcceleratorMemory(device_id, int(info.used), int(info.total)))
            return result
        except Exception:
            return []

    def device_ids(self) -> list[str] | None:
        """Every device's id; None when NVML cannot tell."""
        nvml = self._nvml()
        if nvml is None:
            return None
        try:
            return [device_id for device_id, _ in self._devices(nvml)]
        except Exception:
            return None

    def usage(self, pids: Iterable[int]) -> Usage | None:
        """Where `pids` hold device memory; None when NVML cannot tell or none of
        them shows up on any device."""
        nvml = self._nvml()
        if nvml is None:
            return None
        wanted = set(pids)
        devices: set[str] = set()
        total: int | None = 0
        try:
            for device_id, handle in self._devices(nvml):
                for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if int(process.pid) not in wanted:
                        continue
                    devices.add(device_id)
                    used = process.usedGpuMemory  # None where the driver does not say
                    total = None if used is None or total is None else total + int(used)
        except Exception:
            return None
        if not devices:
            return None
        return Usage(frozenset(devices), total)

    def close(self) -> None:
        with self._lock:
            if not self._ready:
                return
            self._ready = False
            try:
                assert self._module is not None  # set when it became ready
                self._module.nvmlShutdown()
            except Exception:
                pass  # shutting down: nothing left to tell anyone
