# ruff: noqa: E402  (torch is imported through `need`, before what uses it)
"""`TorchWorkload` on CPU: what a snapshot takes (by tag), that a restore gives the
very same objects their very same bytes back, that the memory really goes, and that
a saved tensor used by a forward, a backward or an optimizer step says so.

On CPU a tensor's "device" memory is its own storage: OFFLOAD copies it to a host
buffer of its own and frees the original, DISCARD frees it. CI installs the test
extra (torch included), so there a missing torch fails instead of skipping."""

from __future__ import annotations

import copy
import io
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.optional import need

torch = need("torch")  # the imports below need it first

from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from timeslice.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
)
from timeslice.workloads.torch import TensorSavedError, TorchWorkload

pytestmark = pytest.mark.timeout(60)

MiB = 1 << 20


class LoraLinear(nn.Module):
    """A frozen linear layer with a low-rank adapter beside it."""

    def __init__(self, width: int, rank: int = 2) -> None:
        super().__init__()
        self.base = nn.Linear(width, width)
        self.base.requires_grad_(False)
        self.lora_a = nn.Linear(width, rank, bias=False)
        self.lora_b = nn.Linear(rank, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_b(self.lora_a(x))


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), LoraLinear(16), nn.Linear(16, 3)
    )


def lora(name: str, param: nn.Parameter) -> tuple[str, ...]:
    return ("lora",) if "lora_" in name else ()


def train_step(model: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    data = torch.Generator().manual_seed(step)
    x = torch.randn(32, 8, generator=data)
    target = torch.randn(32, 3, generator=data)
    opt.zero_grad()
    nn.functional.mse_loss(model(x), target).backward()
    opt.step()


def setup(seed: int = 0, steps: int = 2) -> tuple[nn.Module, torch.optim.Optimizer, TorchWorkload]:
    model = make_model(seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(steps):
        train_step(model, opt, step)
    workload = TorchWorkload(chunk_bytes=4096)
    workload.add_module(model, name="policy", param_tags=lora)
    workload.add_optimizer(opt, name="adam")
    return model, opt, workload


def every_tensor(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor | None]:
    """Every tensor the training state has, by a name of the test's own, cloned."""
    found: dict[str, torch.Tensor | None] = {}
    for name, value in model.state_dict().items():
        found[name] = value.clone()
    for name, param in model.named_parameters():
        found[f"{name}.grad"] = None if param.grad is None else param.grad.clone()
    names = {id(p): n for n, p in model.named_parameters()}
    for param, state in opt.state.items():
        for key, value in state.items():
            found[f"state[{names[id(param)]}].{key}"] = value.clone()
    return found


def assert_same(a: dict[str, torch.Tensor | None], b: dict[str, torch.Tensor | None]) -> None:
    assert a.keys() == b.keys()
    for name, value in a.items():
        other = b[name]
        if value is None or other is None:
            assert value is other, name
        else:
            assert value.dtype == other.dtype and torch.equal(value, other), name


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors)


def identities(model: nn.Module, opt: torch.optim.Optimizer) -> list[int]:
    ids = [id(p) for p in model.parameters()] + [id(b) for b in model.buffers()]
    ids += [id(p) for group in opt.param_groups for p in group["params"]]
    ids += [id(p.grad) for p in model.parameters() if p.grad is not None]
    for param, state in opt.state.items():
        ids.append(id(param))
        ids += [id(v) for v in state.values()]
    return ids


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# --- in place, byte for byte ----------------------------------------------------------------


@pytest.mark.parametrize(
    "tags", [[], ["weights"], ["optimizer"], ["grads"], ["lora"], ["weights", "optimizer"]]
)
def test_offload_and_restore_give_the_same_objects_their_same_bytes(tags: list[str]) -> None:
    model, opt, workload = setup()
    before, ids = every_tensor(model, opt), identities(model, opt)
    keys = {id(p): list(state) for p, state in opt.state.items()}

    stored, freed = workload.snapshot("offload", tags)
    assert stored == freed > 0
    assert workload.state == "SAVED"
    assert identities(model, opt) == ids
    read, allocated = workload.restore(tags)
    assert read == allocated == stored
    assert workload.state == "RUNNING" and workload.saved == frozenset()

    assert identities(model, opt) == ids
    assert {id(p): list(state) for p, state in opt.state.items()} == keys
    assert_same(every_tensor(model, opt), before)
    train_step(model, opt, 5)  # and training goes on


def test_training_with_a_switch_between_steps_ends_bit_identical() -> None:
    model, opt, workload = setup(seed=3, steps=0)
    reference = make_model(seed=3)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=1e-2)
    selections = [[], ["optimizer"], ["weights"], ["grads"], ["lora"]]
    for step in range(10):
        train_step(model, opt, step)
        train_step(reference, ref_opt, step)
        tags = selections[step % len(selections)]
        workload.snapshot("offload", tags)
        workload.restore(tags)
    assert_same(every_tensor(model, opt), every_tensor(reference, ref_opt))


def test_a_snapshot_reports_the_bytes_of_exactly_the_tensors_it_selects() -> None:
    model, opt, workload = setup()
    kv = torch.randn(3, 5, 7)
    workload.add_tensor("kv", kv, tags=("cache",))
    params = dict(model.named_parameters())
    lora_params = [p for n, p in params.items() if "lora_" in n]
    lora_ids = {id(p) for p in lora_params}
    weights = list(params.values()) + list(model.buffers())
    grads = [p.grad for p in params.values() if p.grad is not None]
    state = [v for s in opt.state.values() for v in s.values()]
    lora_state = [v for p, s in opt.state.items() if id(p) in lora_ids for v in s.values()]
    expected = {
        "weights": storage_bytes(weights),
        "grads": storage_bytes(grads),
        "optimizer": storage_bytes(state),
        "lora": storage_bytes(lora_params + [p.grad for p in lora_params] + lora_state),
        "cache": kv.nbytes,
    }
    expected["all"] = sum(v for k, v in expected.items() if k != "lora")
    assert set(workload.tags) == {"weights", "grads", "optimizer", "lora", "cache"}
    for selection, nbytes in expected.items():
        tags = [] if selection == "all" else [selection]
        assert workload.moved_bytes(tags) == nbytes, selection
        assert workload.snapshot("offload", tags) == (nbytes, nbytes), selection
        assert workload.moved_bytes(tags) == 0, selection  # nothing left to take
        assert workload.restore(tags) == (nbytes, nbytes), selection
    assert workload.snapshot("discard", ["cache"]) == (0, expected["cache"])
    assert workload.restore([]) == (0, expected["cache"])


def test_a_tensor_saved_already_is_left_as_it_is() -> None:
    _, _, workload = setup()
    weights = workload.moved_bytes(["weights"])
    assert workload.snapshot("offload", ["weights"]) == (weights, weights)
    rest = workload.moved_bytes([])
    assert workload.snapshot("offload", []) == (rest, rest)
    assert workload.restore([]) == (weights + rest, weights + rest)


def test_copies_in_chunks_keep_every_byte_and_every_layout() -> None:
    workload = TorchWorkload(chunk_bytes=4096)
    dense = torch.randn(257, 129, dtype=torch.float64)  # 265 KiB: 65 chunks
    transposed = torch.randn(64, 48).t()  # not contiguous
    channels_last = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    flags = torch.rand(1000) > 0.5
    tensors = {"dense": dense, "t": transposed, "cl": channels_last, "flags": flags}
    copies = {name: t.clone() for name, t in tensors.items()}
    strides = {name: t.stride() for name, t in tensors.items()}
    for name, tensor in tensors.items():
        workload.add_tensor(name, tensor)
    workload.snapshot("offload", ["tensors"])
    assert all(t.numel() == 0 for t in tensors.values())
    workload.restore(["tensors"])
    for name, tensor in tensors.items():
        assert tensor.stride() == strides[name], name
        assert torch.equal(tensor, copies[name]), name


def test_views_of_one_storage_move_together_and_still_share_it() -> None:
    workload = TorchWorkload()
    base = torch.arange(20, dtype=torch.float32)
    # Detached, so that neither keeps `base` itself alive as its autograd `_base`.
    head, tail = base[:8].detach(), base[8:].view(3, 4).detach()
    del base
    workload.add_tensor("head", head, tags=("head",))
    workload.add_tensor("tail", tail, tags=("tail",))
    with pytest.raises(InvalidArgumentError, match="shares its memory with 'tail'"):
        workload.snapshot("offload", ["head"])
    assert workload.state == "RUNNING" and head.numel() == 8  # refused before anything moved
    assert workload.snapshot("offload", ["head", "tail"]) == (80, 80)
    workload.restore(["head"])  # brings its storage back whole
    assert workload.saved == frozenset()
    assert head.untyped_storage().data_ptr() == tail.untyped_storage().data_ptr()
    assert (head.storage_offset(), tail.storage_offset()) == (0, 8)
    tail[0, 0] = 100.0  # seen through the one storage both are views of
    whole = torch.empty(0).set_(head.untyped_storage(), 0, (20,), (1,))
    expected = torch.arange(20, dtype=torch.float32)
    expected[8] = 100.0
    assert torch.equal(whole, expected)


def test_a_parameter_tied_in_two_places_is_saved_once() -> None:
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight
    workload = TorchWorkload()
    workload.add_module(model, name="tied")
    assert workload.snapshot("offload", ["weights"]) == (160, 160)
    assert model[0].weight is model[1].weight and model[0].weight.numel() == 0
    workload.restore([])
    assert model[0].weight is model[1].weight and model[0].weight.shape == (10, 4)


# --- the memory really goes -----------------------------------------------------------------


def test_a_snapshot_frees_the_tensors_own_memory() -> None:
    model, opt, workload = setup()
    param = model[0].weight
    grad = param.grad
    assert grad is not None
    exp_avg = opt.state[param]["exp_avg"]
    refs = [StorageWeakRef(t.untyped_storage()) for t in (param, grad, exp_avg)]
    workload.snapshot("offload", [])
    assert all(ref.expired() for ref in refs)
    assert all(t.untyped_storage().nbytes() == 0 for t in (param, grad, exp_avg))
    assert param.grad is grad and opt.state[param]["exp_avg"] is exp_avg


def test_the_process_gives_the_memory_back_and_an_offload_keeps_one_copy() -> None:
    size = 96 * MiB  # well above glibc's mmap threshold: a free is a munmap
    big = nn.Linear(4096, size // 4 // 4096, bias=False)
    workload = TorchWorkload()
    workload.add_module(big, name="big")
    expected = big.weight.detach().clone()
    before = rss()

    # OFFLOAD: the host copy replaces the original; were the original kept, the
    # process would hold the size twice.
    assert workload.snapshot("offload", []) == (size, size)
    grown = rss() - before
    assert grown < size / 2, f"the process grew by {grown / MiB:.0f} MiB: the original stayed"
    workload.restore([])
    assert torch.equal(big.weight, expected)
    del expected

    # DISCARD: the memory leaves the process.
    before = rss()
    assert workload.snapshot("discard", []) == (0, size)
    freed = before - rss()
    assert freed > 0.9 * size, f"only {freed / MiB:.0f} MiB of {size // MiB} MiB freed"
    assert workload.restore([]) == (0, size)
    assert big.weight.shape == (size // 4 // 4096, 4096)
    assert int(torch.count_nonzero(big.weight)) == 0
    assert rss() - before > -0.1 * size  # zeros, touched


def test_memory_still_referenced_elsewhere_is_not_counted_as_freed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model, opt, workload = setup()
    alias = model[0].weight.detach()  # shares the weight's storage
    nbytes = alias.nbytes
    everything = workload.moved_bytes([])
    with caplog.at_level(logging.WARNING, logger="timeslice.workloads.torch"):
        stored, freed = workload.snapshot("offload", [])
    assert (stored, freed) == (everything, everything - nbytes)
    assert "'policy.0.weight'" in caplog.text and "still referenced" in caplog.text
    workload.restore([])
    assert torch.equal(model[0].weight, alias)


# --- discard --------------------------------------------------------------------------------


def test_discarded_gradients_come_back_as_none_and_training_goes_on() -> None:
    model, opt, workload = setup()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    weights = every_tensor(model, opt)
    grads = workload.moved_bytes(["grads"])
    assert workload.snapshot("discard", ["grads"]) == (0, grads)
    assert workload.restore(["grads"]) == (0, 0)
    assert all(p.grad is None for p in model.parameters())
    after = every_tensor(model, opt)
    assert_same({k: v for k, v in after.items() if not k.endswith(".grad")},
                {k: v for k, v in weights.items() if not k.endswith(".grad")})  # fmt: skip
    train_step(model, opt, 9)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_discarded_weights_and_state_come_back_as_zeros_of_their_shape() -> None:
    model, opt, workload = setup()
    before = every_tensor(model, opt)
    shapes = {n: (t.shape, t.dtype) for n, t in before.items() if t is not None}
    workload.snapshot("discard", ["weights", "optimizer"])
    workload.restore([])
    for name, tensor in every_tensor(model, opt).items():
        if name.endswith(".grad"):
            assert_same({name: tensor}, {name: before[name]})  # grads were not discarded
            continue
        assert tensor is not None and (tensor.shape, tensor.dtype) == shapes[name], name
        assert int(torch.count_nonzero(tensor)) == 0, name


# --- use while saved ------------------------------------------------------------------------


def test_a_forward_while_the_weights_are_saved_raises_and_changes_nothing() -> None:
    model, opt, workload = setup()
    before = every_tensor(model, opt)
    workload.snapshot("offload", ["weights"])
    x = torch.randn(4, 8)
    with pytest.raises(TensorSavedError, match=r"'policy\.0\.weight' .* restore first"):
        model(x)
    with pytest.raises(TensorSavedError, match="policy.3.lora_a.weight"):
        model[3].lora_a(torch.randn(4, 16))  # a submodule called on its own
    workload.restore([])
    assert_same(every_tensor(model, opt), before)
    model(x)


def test_only_the_saved_tags_are_guarded() -> None:
    model, opt, workload = setup()
    workload.snapshot("offload", ["lora"])
    assert workload.saved >= {"policy.3.lora_a.weight", "policy.3.lora_a.weight.grad",
                              "adam.state[policy.3.lora_a.weight].exp_avg"}  # fmt: skip
    assert not any(label.startswith("policy.0") for label in workload.saved)
    model[0](torch.randn(4, 8))  # not saved: runs
    with pytest.raises(TensorSavedError, match="lora"):
        model(torch.randn(4, 8))
    workload.restore(["lora"])
    train_step(model, opt, 7)


def test_an_optimizer_step_while_anything_of_it_is_saved_raises() -> None:
    for tags in (["optimizer"], ["weights"], ["grads"]):
        model, opt, workload = setup()
        model(torch.randn(4, 8)).sum().backward()
        before = every_tensor(model, opt)
        workload.snapshot("offload", tags)
        with pytest.raises(TensorSavedError, match="restore first"):
            opt.step()
        workload.restore([])
        assert_same(every_tensor(model, opt), before)
        opt.step()


def test_a_backward_into_saved_gradients_raises() -> None:
    model, opt, workload = setup()
    loss = model(torch.randn(4, 8)).sum()  # the graph is built before the snapshot
    workload.snapshot("offload", ["grads"])
    with pytest.raises(TensorSavedError, match=r"\.grad' .* restore first"):
        loss.backward()
    workload.restore([])


def test_a_named_tensor_is_handed_out_only_while_it_is_in_memory() -> None:
    workload = TorchWorkload()
    kv = torch.ones(16)
    workload.add_tensor("kv", kv, tags=("cache",))
    assert workload.tensor("kv") is kv
    workload.snapshot("discard", ["cache"])
    with pytest.raises(TensorSavedError, match=r"'kv' \(tags cache\) is discarded"):
        workload.tensor("kv")
    with pytest.raises(NotFoundError, match="no tensor named 'nope'"):
        workload.tensor("nope")
    workload.restore([])
    assert workload.tensor("kv") is kv and torch.equal(kv, torch.zeros(16))


def test_gradients_cleared_while_saved_stay_cleared() -> None:
    model, opt, workload = setup()
    workload.snapshot("offload", ["grads"])
    opt.zero_grad()  # set_to_none=True
    workload.restore([])
    assert all(p.grad is None for p in model.parameters())

    train_step(model, opt, 3)
    workload.snapshot("offload", ["grads"])
    opt.zero_grad(set_to_none=False)  # writes the (empty) saved gradients in place
    workload.restore([])
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and g.numel() and not g.any() for g in grads)


def test_a_copy_of_a_held_model_is_not_held_and_runs_while_the_original_is_saved() -> None:
    model, opt, workload = setup()
    twin = copy.deepcopy(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)  # pickles the hooks too: no warning, no error
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    workload.snapshot("offload", [])
    for other in (twin, loaded):
        other(torch.randn(4, 8)).sum().backward()
    with pytest.raises(TensorSavedError):
        model(torch.randn(4, 8))
    workload.restore([])
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert a is not b and a.shape == b.shape


# --- from several threads -------------------------------------------------------------------


def test_snapshots_and_restores_from_several_threads_keep_every_byte() -> None:
    model, opt, workload = setup()
    before = every_tensor(model, opt)
    errors: list[BaseException] = []

    def cycles(tags: list[str]) -> None:
        try:
            for _ in range(30):
                workload.snapshot("offload", tags)
                workload.restore(tags)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=cycles, args=(t,))
               for t in (["weights"], ["optimizer"], ["grads"], ["lora"])]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    workload.restore([])
    assert_same(every_tensor(model, opt), before)


# --- what it refuses ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda w: TorchWorkload(chunk_bytes=10), InvalidArgumentError, "chunk_bytes"),
        (lambda w: TorchWorkload(chunk_bytes=2 << 30), InvalidArgumentError, "chunk_bytes"),
        (lambda w: w.add_module("model"), InvalidArgumentError, "torch.nn.Module"),
        (lambda w: w.add_optimizer(nn.Linear(2, 2)), InvalidArgumentError, "Optimizer"),
        (lambda w: w.add_tensor("t", [1.0]), InvalidArgumentError, "torch.Tensor"),
        (lambda w: w.add_tensor("t", torch.ones(2), tags="cache"), InvalidArgumentError,
         "not one string"),
        (lambda w: w.add_tensor("t", torch.ones(2), tags=()), InvalidArgumentError, "one tag"),
        (lambda w: w.add_tensor("t", torch.ones(2), tags=("",)), InvalidArgumentError,
         "non-empty"),
        (lambda w: w.add_tensor("t", torch.ones(2), tags=("x" * 300,)), InvalidArgumentError,
         "longer than"),
        (lambda w: w.add_tensor("policy", torch.ones(2)), AlreadyExistsError, "'policy'"),
        (lambda w: w.add_tensor("", torch.ones(2)), InvalidArgumentError, "non-empty"),
        (lambda w: w.add_tensor("s", torch.ones(3).to_sparse()), InvalidArgumentError,
         "sparse"),
        (lambda w: w.add_tensor("m", torch.ones(3, device="meta")), InvalidArgumentError,
         "meta"),
        (lambda w: w.add_module(nn.LazyLinear(3)), InvalidArgumentError, "lazy"),
        (lambda w: w.snapshot("offload", ["weigths"]), InvalidArgumentError, "'weigths'"),
        (lambda w: w.snapshot("suspend", []), InvalidArgumentError, "suspend mode"),
        (lambda w: w.restore("weights"), InvalidArgumentError, "not one string"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_with_a_clear_error(
    make: Callable[[TorchWorkload], object], error: type[Exception], message: str
) -> None:
    _, _, workload = setup(steps=1)
    with pytest.raises(error, match=message):
        make(workload)


def test_a_workload_cannot_close_while_saved_and_its_hooks_go_when_it_does() -> None:
    model, opt, workload = setup()
    workload.snapshot("offload", [])
    with pytest.raises(ConflictError, match="restore them before closing"):
        workload.close()
    workload.restore([])
    with workload:
        pass
    workload.close()  # idempotent
    with pytest.raises(ConflictError, match="closed"):
        workload.snapshot("offload", [])
    assert not any(m._forward_pre_hooks for m in model.modules())
    assert not opt._optimizer_step_pre_hooks
    assert all(not p._backward_hooks for p in model.parameters() if p._backward_hooks is not None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
@pytest.mark.parametrize("name", ["torch_workload_cuda.py", "pipelined_switch.py"])
def test_the_gpu_scripts_refuse_clearly_without_cuda(name: str) -> None:
    script = Path(__file__).resolve().parents[2] / "benchmarks/gpu" / name
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "needs a CUDA device" in done.stderr
