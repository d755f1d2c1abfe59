"""`TorchWorkload`: a PyTorch training process's state, moved off its accelerator
and back in place, so that the training loop does not change.

    from timeslice.workloads.torch import TorchWorkload

    workload = TorchWorkload()
    workload.add_module(model, name="policy",
                        param_tags=lambda name, p: ("lora",) if "lora_" in name else ())
    workload.add_optimizer(optimizer, name="adam")
    registration = await register_workload(agent_address, "job-a", workload=workload)

What it holds, under tags (a snapshot of some tags moves only what carries one of
them; no tags: everything):

- a module's parameters and buffers (``weights``) and its parameters' gradients
  (``grads``), each also under the module's ``tags`` and, for a parameter and its
  gradient, the tags ``param_tags(name, parameter)`` gives it (``name`` as in
  ``module.named_parameters()``);
- an optimizer's state tensors, ``optimizer.state[p][key]`` (``optimizer``), also
  under the optimizer's ``tags`` and the user tags of their parameter ``p`` (its
  module's and its ``param_tags``), so that ``lora`` selects a LoRA adapter's
  weights, gradients and optimizer state together;
- tensors added by name (`add_tensor`), under their own tags.

What stays the same: every object. A saved tensor keeps its identity; only its
``.data`` is swapped for an empty tensor, and a restore points it at new memory
holding the same bytes (`Parameter` objects, ``param_groups``, the keys of
``optimizer.state`` and their tensors are the very same objects). Tensors that are
views of one storage are saved and restored together and still share memory after.

Modes:

- OFFLOAD copies each storage to host memory (pinned for CUDA tensors), then frees
  it; on CUDA the caching allocator's free blocks then go back to the driver
  (``torch.cuda.empty_cache()``). A restore allocates new device memory and copies
  the bytes back: bit for bit what was saved.
- DISCARD frees the memory and keeps nothing. A restore gives gradients back as
  None (as ``optimizer.zero_grad()`` leaves them) and every other tensor as zeros of
  its shape and dtype (weights to be loaded again, a cache to be refilled).

Bytes are copied in chunks of at most ``chunk_bytes`` and counted as they go: a
snapshot reports ``(storage_bytes, device_bytes)``, the bytes copied to host memory
and the device memory freed, which leaves out a storage something else still
references (a view kept elsewhere, an autograd graph not yet run backward: the
memory goes when that reference does, and the snapshot logs it). On CPU a tensor's
storage stands for its device memory: OFFLOAD copies it to a host buffer of its own
and frees it, and the C allocator gets it back.

Detected while saved (raising `TensorSavedError`, before anything is changed):
a forward of a module that directly holds a saved parameter or buffer; a backward
that reaches a parameter whose weights or gradient are saved; ``optimizer.step()``
of an added optimizer when its state, or the weights or gradient of one of its
parameters, is saved; `tensor` of a saved named tensor. Not detected: any other use
of a saved tensor (``p.sum()``, indexing, a tensor added by name and used directly),
which sees a tensor of no elements and fails with torch's own error or, for an
operation indifferent to size, silently computes on nothing. An in-place write
while saved moves the tensor's version counter and is reported when it comes back
(a gradient then comes back as zeros, as ``zero_grad(set_to_none=False)`` wants;
anything else keeps its saved bytes). A gradient set to None or replaced while
saved (``zero_grad()``) stays as the training loop left it.

A copy of a held module (``copy.deepcopy``, ``torch.save`` of the whole model) is
not held: its hooks watch nothing. `close` removes the hooks.

The training loop must not run while a snapshot or restore does (the protocol's
turns see to it: a job is switched only after it yields). Every method takes one
lock, so that the agent's worker thread and the training thread can call in.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Final

import torch
from torch.utils.hooks import RemovableHandle

from timeslice.api.bounds import MAX_ITEMS, id_problem
from timeslice.backends import DISCARD, OFFLOAD, parse_mode
from timeslice.errors import AlreadyExistsError, ConflictError, InvalidArgumentError, NotFoundError
from timeslice.workloads._torch_checks import (
    BackwardGuard,
    ForwardGuard,
    StepGuard,
    TensorSavedError,
    check_plain,
    check_tags,
    kind_of,
)
from timeslice.workloads._torch_storage import (
    Held,
    SavedStorage,
    SavedView,
    StorageGroup,
    bring_back,
    group_by_storage,
    release_cached,
    save,
    storage_group,
    synchronize,
)

__all__ = ["TensorSavedError", "TorchWorkload"]

log = logging.getLogger(__name__)

RUNNING: Final = "RUNNING"
SAVED: Final = "SAVED"
WEIGHTS: Final = "weights"
GRADS: Final = "grads"
OPTIMIZER: Final = "optimizer"
TENSORS: Final = "tensors"  # the default tag of a tensor added by name

DEFAULT_CHUNK_BYTES: Final = 64 << 20
MIN_CHUNK_BYTES: Final = 4 << 10
MAX_CHUNK_BYTES: Final = 1 << 30

ParamTags = Callable[[str, torch.nn.Parameter], Iterable[str]]


@dataclass(frozen=True, kw_only=True)
class _Slot:
    """A parameter or buffer of a module, found again at each snapshot by its owner
    and local name (so that one replaced since is the one taken)."""

    owner: torch.nn.Module
    local: str
    label: str
    user_tags: frozenset[str]


@dataclass(eq=False, kw_only=True)
class _Module:
    module: torch.nn.Module
    params: list[_Slot]
    buffers: list[_Slot]
    handles: list[RemovableHandle] = field(default_factory=list)


@dataclass(eq=False, kw_only=True)
class _Optimizer:
    optimizer: torch.optim.Optimizer
    tags: frozenset[str]
    handle: RemovableHandle | None = None


@dataclass(eq=False, kw_only=True)
class _Tensor:
    tensor: torch.Tensor
    tags: frozenset[str]


def check_chunk_bytes(chunk_bytes: int) -> int:
    """`chunk_bytes`, the most one copy moves at once, if it is an int from 4 KiB to
    1 GiB; else `InvalidArgumentError`."""
    if (
        not isinstance(chunk_bytes, int)
        or isinstance(chunk_bytes, bool)
        or not MIN_CHUNK_BYTES <= chunk_bytes <= MAX_CHUNK_BYTES
    ):
        raise InvalidArgumentError(
            f"chunk_bytes must be an int from {MIN_CHUNK_BYTES} to {MAX_CHUNK_BYTES}"
        )
    return chunk_bytes


class TorchWorkload:
    """Modules, optimizers and named tensors whose device memory a snapshot moves to
    host memory (or drops) and a restore brings back, in place.

    ``chunk_bytes``: the most one copy moves at once (4 KiB to 1 GiB; 64 MiB by
    default). It has what `register_workload` drives: ``snapshot(mode, tags)``,
    ``restore(tags)``, ``supported_modes``, ``default_mode``, ``tags``, ``pipelined``
    and ``state`` (SAVED while any tensor is out, even when only some tags were;
    RUNNING else).
    """

    supported_modes: tuple[str, ...] = (OFFLOAD, DISCARD)
    default_mode: str = OFFLOAD
    # A snapshot or restore of some tags moves those only: a switch may move it tag by
    # tag, and bring the next holder in as this one goes out.
    pipelined: bool = True

    def __init__(self, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        self.chunk_bytes = check_chunk_bytes(chunk_bytes)
        self._lock = threading.RLock()
        self._modules: dict[str, _Module] = {}
        self._optimizers: dict[str, _Optimizer] = {}
        self._tensors: dict[str, _Tensor] = {}
        self._tags: set[str] = set()
        # Every saved tensor object by id (the record holds the object, so its id
        # stays its own), with the storage it was saved with.
        self._saved: dict[int, tuple[SavedStorage, SavedView]] = {}
        self._closed = False

    # --- what it holds ------------------------------------------------------------------

    def add_module(
        self,
        module: torch.nn.Module,
        *,
        name: str | None = None,
        tags: Iterable[str] = (),
        param_tags: ParamTags | None = None,
    ) -> None:
        """Holds `module`'s parameters and buffers (``weights``) and its parameters'
        gradients (``grads``), each also under `tags`; a parameter and its gradient
        also under ``param_tags(name, parameter)``, called once here for each."""
        if not isinstance(module, torch.nn.Module):
            raise InvalidArgumentError(f"add_module takes a torch.nn.Module, not {kind_of(module)}")
        with self._lock:
            self._check_open()
            name = self._new_name(name, "module")
            user = check_tags(f"module {name!r}", tags)
            params: list[_Slot] = []
            buffers: list[_Slot] = []
            seen: set[int] = set()
            new_tags = {WEIGHTS, GRADS} | user
            for prefix, owner in module.named_modules():
                for local, param in owner.named_parameters(recurse=False):
                    if id(param) in seen:
                        continue  # tied: held once, where named_parameters() lists it
                    seen.add(id(param))
                    qualified = f"{prefix}.{local}" if prefix else local
                    own: frozenset[str] = frozenset()
                    if param_tags is not None:
                        own = check_tags(f"parameter {qualified!r}", param_tags(qualified, param))
                    check_plain(f"{name}.{qualified}", param)
                    params.append(
                        _Slot(
                            owner=owner,
                            local=local,
                            label=f"{name}.{qualified}",
                            user_tags=user | own,
                        )
                    )
                    new_tags |= own
                for local, buffer in owner.named_buffers(recurse=False):
                    qualified = f"{prefix}.{local}" if prefix else local
                    check_plain(f"{name}.{qualified}", buffer)
                    buffers.append(
                        _Slot(owner=owner, local=local, label=f"{name}.{qualified}", user_tags=user)
                    )
            self._add_tags(new_tags)
            held = _Module(module=module, params=params, buffers=buffers)
            self._guard_module(held)
            self._modules[name] = held

    def add_optimizer(
        self, optimizer: torch.optim.Optimizer, *, name: str | None = None, tags: Iterable[str] = ()
    ) -> None:
        """Holds `optimizer`'s state tensors (``optimizer``, and `tags`), whichever
        exist at each snapshot (Adam makes its own at its first step)."""
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise InvalidArgumentError(
                f"add_optimizer takes a torch.optim.Optimizer, not {kind_of(optimizer)}"
            )
        with self._lock:
            self._check_open()
            name = self._new_name(name, "optimizer")
            user = check_tags(f"optimizer {name!r}", tags)
            for other, held_opt in self._optimizers.items():
                if held_opt.optimizer is optimizer:
                    raise AlreadyExistsError(f"this optimizer is held already, as {other!r}")
            self._add_tags({OPTIMIZER} | user)
            held = _Optimizer(optimizer=optimizer, tags=frozenset({OPTIMIZER}) | user)
            held.handle = optimizer.register_step_pre_hook(StepGuard(self))
            self._optimizers[name] = held

    def add_tensor(
        self, name: str, tensor: torch.Tensor, *, tags: Iterable[str] = (TENSORS,)
    ) -> None:
        """Holds `tensor` (a cache, say) under `name` and `tags` (at least one)."""
        if not isinstance(tensor, torch.Tensor):
            raise InvalidArgumentError(f"add_tensor takes a torch.Tensor, not {kind_of(tensor)}")
        with self._lock:
            self._check_open()
            name = self._new_name(name, "tensor")
            chosen = check_tags(f"tensor {name!r}", tags)
            if not chosen:
                raise InvalidArgumentError(f"tensor {name!r}: give it at least one tag")
            check_plain(name, tensor)
            self._add_tags(chosen)
            self._tensors[name] = _Tensor(tensor=tensor, tags=chosen)

    def tensor(self, name: str) -> torch.Tensor:
        """The tensor added as `name`; `TensorSavedError` while it is saved."""
        with self._lock:
            held = self._tensors.get(name)
            if held is None:
                known = ", ".join(repr(n) for n in self._tensors) or "none"
                raise NotFoundError(f"no tensor named {name!r}; the workload has {known}")
            self.check_tensor(held.tensor)
            return held.tensor

    @property
    def tags(self) -> tuple[str, ...]:
        """Every tag something held carries, sorted."""
        with self._lock:
            return tuple(sorted(self._tags))

    @property
    def saved(self) -> frozenset[str]:
        """The labels of the tensors saved now (``policy.fc.weight``, ``policy.fc.weight.grad``,
        ``adam.state[policy.fc.weight].exp_avg``, a named tensor's name)."""
        with self._lock:
            return frozenset(view.label for _, view in self._saved.values())

    @property
    def state(self) -> str:
        """SAVED while any tensor is saved (whatever tags the snapshot had), else RUNNING."""
        return SAVED if self._saved else RUNNING

    def moved_bytes(self, tags: Iterable[str] = ()) -> int:
        """The bytes a snapshot of `tags` would take off the devices now (and copy to
        host memory, for OFFLOAD)."""
        with self._lock:
            wanted = self._wanted(tags)
            groups = group_by_storage(self._live())
            return sum(
                storage_group(g).nbytes for g in groups if any(_selected(h.tags, wanted) for h in g)
            )

    # --- snapshot and restore -----------------------------------------------------------

    def snapshot(self, mode: str = OFFLOAD, tags: Iterable[str] = ()) -> tuple[int, int]:
        """Takes the memory of every tensor carrying one of `tags` (all of them when
        `tags` is empty); tensors saved already stay as they are.

        Returns ``(storage_bytes, device_bytes)``: the bytes copied to host memory
        (0 for DISCARD) and the device memory freed (a storage still referenced
        elsewhere is not counted: its memory goes only when that reference does).
        A snapshot that fails part way leaves what it took saved, for a restore.
        """
        mode = parse_mode(mode)
        with self._lock:
            self._check_open()
            wanted = self._wanted(tags)
            groups = self._plan(wanted)
            devices = [g.device for g in groups]
            synchronize(devices)  # the last step's kernels may still be running
            stored = freed = 0
            try:
                for group in groups:
                    saved, released = save(
                        group, keep=mode == OFFLOAD, chunk_bytes=self.chunk_bytes
                    )
                    for view in saved.views:
                        self._saved[id(view.tensor)] = (saved, view)
                    stored += 0 if saved.host is None else saved.nbytes
                    freed += released
            finally:
                release_cached(devices)
            return stored, freed

    def restore(self, tags: Iterable[str] = ()) -> tuple[int, int]:
        """Brings back every saved tensor carrying one of `tags` (all when empty), with
        the others of its storage: byte for byte if offloaded; if discarded, gradients
        as None and the rest as zeros.

        Returns ``(storage_bytes, device_bytes)``: bytes read from host memory and
        device memory allocated.
        """
        with self._lock:
            self._check_open()
            wanted = self._wanted(tags)
            chosen: dict[int, SavedStorage] = {}
            for saved, view in self._saved.values():
                if _selected(view.tags, wanted):
                    chosen[id(saved)] = saved
            read = allocated = 0
            for saved in chosen.values():
                views = [v for v in saved.views if self._still_in_place(v)]
                got, made = bring_back(saved, views, chunk_bytes=self.chunk_bytes)
                for view in saved.views:
                    del self._saved[id(view.tensor)]
                saved.host = None
                read += got
                allocated += made
            synchronize(saved.device for saved in chosen.values())
            return read, allocated

    def _plan(self, wanted: frozenset[str]) -> list[StorageGroup]:
        """The storages a snapshot of `wanted` takes; refuses, before anything moves, a
        storage that a tensor the tags leave out shares."""
        plan = []
        for members in group_by_storage(self._live()):
            chosen = [h for h in members if _selected(h.tags, wanted)]
            if not chosen:
                continue
            if len(chosen) < len(members):
                other = next(h for h in members if h not in chosen)
                raise InvalidArgumentError(
                    f"{chosen[0].label!r} shares its memory with {other.label!r}, which the"
                    f" tags {sorted(wanted)} do not select: select both, or neither"
                )
            plan.append(storage_group(members))
        return plan

    def _live(self) -> list[Held]:
        """Every tensor held and not saved now, once each (a tensor reached twice
        carries the tags of both)."""
        found: dict[int, Held] = {}

        def take(
            label: str,
            tensor: torch.Tensor | None,
            tags: frozenset[str],
            grad_of: torch.Tensor | None = None,
        ) -> None:
            if tensor is None or id(tensor) in self._saved:
                return
            seen = found.get(id(tensor))
            if seen is not None:
                seen.tags |= tags
                return
            check_plain(label, tensor)
            found[id(tensor)] = Held(label=label, tensor=tensor, tags=tags, grad_of=grad_of)

        owners: dict[int, tuple[str, frozenset[str]]] = {}  # parameter id -> label, user tags
        for held in self._modules.values():
            for slot in held.params:
                param = slot.owner._parameters.get(slot.local)
                if param is None:
                    continue
                owners[id(param)] = (slot.label, slot.user_tags)
                take(slot.label, param, slot.user_tags | {WEIGHTS})
                take(f"{slot.label}.grad", param.grad, slot.user_tags | {GRADS}, param)
            for slot in held.buffers:
                take(slot.label, slot.owner._buffers.get(slot.local), slot.user_tags | {WEIGHTS})
        for name, opt in self._optimizers.items():
            for index, (key_param, state) in enumerate(opt.optimizer.state.items()):
                label, user = owners.get(id(key_param), (f"param{index}", frozenset()))
                for key, value in state.items():
                    if isinstance(value, torch.Tensor):
                        take(f"{name}.state[{label}].{key}", value, opt.tags | user)
        for name, held_tensor in self._tensors.items():
            take(name, held_tensor.tensor, held_tensor.tags)
        return list(found.values())

    def _still_in_place(self, view: SavedView) -> bool:
        """Whether `view` should come back: a gradient set to None or replaced while
        saved (``zero_grad()``) stays as the training loop left it."""
        if view.grad_of is None or view.grad_of.grad is view.tensor:
            return True
        log.debug("gradient %r was replaced while saved; the saved one is dropped", view.label)
        return False

    # --- guards -------------------------------------------------------------------------

    def _guard_module(self, held: _Module) -> None:
        """Hooks that raise `TensorSavedError` on a forward or backward that would use
        a saved tensor; each returns at once while nothing is saved."""
        owners = {id(s.owner): s.owner for s in [*held.params, *held.buffers]}
        for owner in owners.values():
            held.handles.append(owner.register_forward_pre_hook(ForwardGuard(self)))
        for slot in held.params:
            param = slot.owner._parameters[slot.local]
            if param is not None and param.requires_grad:
                guard = BackwardGuard(self, param)
                held.handles.append(param.register_hook(guard))  # type: ignore[no-untyped-call]

    def check_module(self, module: torch.nn.Module) -> None:
        """`TensorSavedError` if `module` directly holds a saved parameter or buffer."""
        for tensor in itertools.chain(
            module.parameters(recurse=False), module.buffers(recurse=False)
        ):
            self.check_tensor(tensor)

    def check_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """`TensorSavedError` if a step of `optimizer` would use a saved tensor: its state,
        or a parameter's weights or gradient."""
        for group in optimizer.param_groups:
            for param in group["params"]:
                self.check_tensor(param)
                if param.grad is not None:
                    self.check_tensor(param.grad)
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    self.check_tensor(value)

    def check_tensor(self, tensor: torch.Tensor) -> None:
        """`TensorSavedError` if `tensor` (the very object) is saved now."""
        found = self._saved.get(id(tensor))
        if found is None:
            return
        saved, view = found
        how = "discarded" if saved.discarded else "offloaded"
        raise TensorSavedError(
            f"{view.label!r} (tags {', '.join(sorted(view.tags))}) is {how} by a snapshot:"
            " restore first"
        )

    # --- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Removes the workload's hooks and forgets what it holds. Idempotent;
        `ConflictError` while anything is saved (restore first)."""
        with self._lock:
            if self._closed:
                return
            if self._saved:
                raise ConflictError(
                    f"{len(self._saved)} tensors are saved: restore them before closing"
                )
            self._closed = True
            for held in self._modules.values():
                for handle in held.handles:
                    handle.remove()
            for opt in self._optimizers.values():
                if opt.handle is not None:
                    opt.handle.remove()
            self._modules.clear()
            self._optimizers.clear()
            self._tensors.clear()

    def __enter__(self) -> TorchWorkload:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<TorchWorkload {len(self._modules)} modules, {len(self._optimizers)} optimizers,"
            f" {len(self._tensors)} tensors, {len(self._saved)} tensors saved>"
        )

    # --- helpers ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ConflictError("the torch workload is closed")

    def _new_name(self, name: str | None, kind: str) -> str:
        """`name` checked and free, or the first free of ``module0``, ``module1``... for None."""
        taken = self._modules.keys() | self._optimizers.keys() | self._tensors.keys()
        if name is None:
            name = next(f"{kind}{n}" for n in itertools.count() if f"{kind}{n}" not in taken)
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"a {kind}'s name must be a non-empty string")
        if (problem := id_problem(name)) is not None:
            raise InvalidArgumentError(f"a {kind}'s name {problem}")
        if name in taken:
            raise AlreadyExistsError(f"the workload holds something named {name!r} already")
        return name

    def _add_tags(self, tags: Iterable[str]) -> None:
        merged = self._tags | set(tags)
        if len(merged) > MAX_ITEMS:
            raise InvalidArgumentError(
                f"a workload carries at most {MAX_ITEMS} distinct tags (its registration"
                " sends them all)"
            )
        self._tags = merged

    def _wanted(self, tags: Iterable[str]) -> frozenset[str]:
        if isinstance(tags, str):
            raise InvalidArgumentError("tags must be a list of strings, not one string")
        wanted = frozenset(tags)
        unknown = sorted(str(t) for t in wanted - self._tags)
        if unknown:
            raise InvalidArgumentError(
                f"no tensor carries the tags {unknown[:8]}; known tags: {sorted(self._tags)[:32]}"
            )
        return wanted


def _selected(tags: frozenset[str], wanted: frozenset[str]) -> bool:
    return not wanted or not tags.isdisjoint(wanted)
