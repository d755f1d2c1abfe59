"""What `TorchWorkload` refuses, and the hooks that catch a saved tensor in use.

The hooks (a module's forward pre-hook, a parameter's gradient hook, an optimizer's
step pre-hook) ask their workload through `Watched`, a narrow interface, and return
at once while nothing is saved: a Python call per module forward, per parameter in
backward and per optimizer step is all they cost then.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any, Protocol

import torch

from timeslice.api.bounds import id_problem
from timeslice.errors import ConflictError, InvalidArgumentError


class TensorSavedError(ConflictError):
    """A tensor was used while a snapshot has its memory (restore it first)."""


class Watched(Protocol):
    """What a guard asks of its workload."""

    @property
    def state(self) -> str:
        """SAVED while anything is saved."""
        ...

    def check_tensor(self, tensor: torch.Tensor) -> None:
        """`TensorSavedError` if `tensor` is saved."""
        ...

    def check_module(self, module: torch.nn.Module) -> None:
        """`TensorSavedError` if `module` directly holds a saved tensor."""
        ...

    def check_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """`TensorSavedError` if a step of `optimizer` would use a saved tensor."""
        ...


class Guard:
    """A hook of a workload's, which raises `TensorSavedError` when what it watches is
    saved. It holds the workload weakly; a copy of it watches nothing, so that a held
    module can still be copied (``copy.deepcopy``) or pickled whole (``torch.save``):
    the copy is not held."""

    # torch.save leaves a parameter's hooks out; this says so without a warning.
    __torch_unserializable__ = True

    def __init__(self, workload: Watched | None = None) -> None:
        self._workload = None if workload is None else weakref.ref(workload)

    def watching(self) -> Watched | None:
        """The workload, while it has something saved (else None: nothing to check)."""
        found = None if self._workload is None else self._workload()
        return found if found is not None and found.state == "SAVED" else None

    def __deepcopy__(self, memo: dict[int, Any]) -> Guard:
        return type(self)()

    def __reduce__(self) -> tuple[type[Guard], tuple[()]]:
        return type(self), ()


class ForwardGuard(Guard):
    def __call__(self, module: torch.nn.Module, args: Any) -> None:
        if (workload := self.watching()) is not None:
            workload.check_module(module)


class BackwardGuard(Guard):
    def __init__(self, workload: Watched | None = None, param: torch.Tensor | None = None) -> None:
        super().__init__(workload)
        self._param = None if param is None else weakref.ref(param)

    def __call__(self, grad: torch.Tensor) -> None:
        workload = self.watching()
        param = None if self._param is None else self._param()
        if workload is None or param is None:
            return
        workload.check_tensor(param)
        if param.grad is not None:
            workload.check_tensor(param.grad)


class StepGuard(Guard):
    def __call__(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if (workload := self.watching()) is not None:
            workload.check_optimizer(optimizer)


def check_tags(what: str, tags: Iterable[str]) -> frozenset[str]:
    """`tags` as a set, each a non-empty id of bounded length (`what` names the owner)."""
    if isinstance(tags, str):
        raise InvalidArgumentError(f"{what}: tags must be a list of strings, not one string")
    chosen = frozenset(tags)
    for tag in chosen:
        if not isinstance(tag, str) or not tag:
            raise InvalidArgumentError(f"{what}: every tag must be a non-empty string")
        if (problem := id_problem(tag)) is not None:
            raise InvalidArgumentError(f"{what}: a tag {problem}")
    return chosen


def check_plain(label: str, tensor: torch.Tensor) -> None:
    """Refuses a tensor whose memory is not one plain strided storage."""
    data = tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor
    problem = None
    if torch.nn.parameter.is_lazy(tensor):
        problem = "is not initialized yet (a lazy module: run a forward first)"
    elif type(data) is not torch.Tensor:
        problem = f"is a {type(data).__name__}, whose memory is not one storage"
    elif data.layout != torch.strided or data.is_quantized or data.is_nested:
        problem = f"has layout {data.layout}{', quantized' if data.is_quantized else ''}"
    elif data.is_meta:
        problem = "is on the meta device: it has no memory"
    if problem is not None:
        raise InvalidArgumentError(
            f"tensor {label!r} {problem}; only plain strided tensors can move"
        )


def kind_of(value: object) -> str:
    """The qualified class name of `value`, for an error message."""
    return f"{type(value).__module__}.{type(value).__qualname__}"
