"""Recording one training forward as autograd sees it, for ``trace``.

A ``TorchDispatchMode`` (``_Recorder``) sees every ATen op the model runs
under fake tensors: its inputs and outputs by storage, and, through
saved-tensor hooks, what autograd saves for backward in the order it
saves it. A few ops are run for real on tiny inputs where fake tensors
cannot say what a kernel saves (a layer norm's statistics).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ._binary import CkptplanError
from .layers import decoder_layers, unwrap


class TraceError(CkptplanError, ValueError):
    """The model or config cannot be traced; the message says why
    (``code`` 1, ``kind`` "input"; a ValueError too)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 1, kind="input")


@dataclass
class _Op:
    """One ATen op as it ran."""

    func: Any
    args: list  # tensor arguments, in order
    outs: list  # tensor outputs, in order
    block: str
    scope: str
    saves: list = field(default_factory=list)  # tensors, in the order autograd saved them
    retype: dict = field(default_factory=dict)  # output → its dtype on the device, where fake tensors differ
    host: int = 0  # bytes it keeps in host memory: a Python number it multiplies by, wrapped


def _key(t: torch.Tensor) -> tuple:
    """What a tensor is: its storage and where in it it looks."""
    return (t.untyped_storage()._cdata, tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype)


def _sid(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class _Recorder(TorchDispatchMode):
    """Records the ops, the saved tensors and the module each op ran in."""

    def __init__(self, model: nn.Module, fake, device: str):
        super().__init__()
        self.model, self.fake, self.device = model, fake, device
        self.layers = decoder_layers(model)
        self.ops: list[_Op] = []
        self.block = "embed"
        self.scopes: list[str] = []
        self.packs: list[tuple[int, torch.Tensor]] = []  # (ops recorded before, tensor)
        self.sides: dict[int, str] = {}  # storage → the graph input it is
        self.side_tensors: dict[str, torch.Tensor] = {}
        self.hidden: list[torch.Tensor] = []  # each layer's hidden-state input
        self.keep: list = []  # every tensor seen, so that storages stay distinct
        self.params: dict[int, tuple[int, bool, torch.dtype]] = {}  # storage → (elements, trains, dtype)
        self.buffers: set[int] = set()

    def name_input(self, t: torch.Tensor, name: str) -> None:
        """Make t a graph input named name."""
        self.sides[_sid(t)] = name
        self.side_tensors[name] = t
        self.keep.append(t)

    def run(self, batch: dict) -> torch.Tensor:
        base = unwrap(self.model)
        # A live model's parameters reach this mode as they are, before the
        # fake mode below converts them.
        for p in self.model.parameters():
            self.keep.append(p)
            n, tr, _ = self.params.get(_sid(p), (0, False, p.dtype))
            self.params[_sid(p)] = (n + p.numel(), tr or p.requires_grad, p.dtype)
        for b in self.model.buffers():
            self.keep.append(b)
            self.buffers.add(_sid(b))
        self.stats_dtype = _layer_norm_stats(self.device)
        names = {m: n for n, m in base.named_modules()}
        layer_of = {m: i for i, m in enumerate(self.layers)}
        hooks = []

        def pre(module, args, kwargs):
            self.scopes.append(names.get(module, ""))
            if module in layer_of:
                self._enter(layer_of[module], args, kwargs)

        def post(module, args, kwargs, out):
            self.scopes.pop()
            if module in layer_of:
                self.block = "head"

        for m in base.modules():
            hooks.append(m.register_forward_pre_hook(pre, with_kwargs=True))
            hooks.append(m.register_forward_hook(post, with_kwargs=True))

        def pack(t):
            self.packs.append((len(self.ops), t))
            self.keep.append(t)
            return t

        try:
            with _as_run(), self.fake, self, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = self.model(**batch)
        finally:
            for h in hooks:
                h.remove()
        loss = getattr(out, "loss", None)
        if not isinstance(loss, torch.Tensor):
            raise TraceError(f"{type(base).__name__} returned no loss from input_ids and labels")
        self._attribute()
        return loss

    def _enter(self, i: int, args: tuple, kwargs: dict) -> None:
        self.block = f"layers.{i}"
        hidden = args[0] if args else kwargs.get("hidden_states")
        if not isinstance(hidden, torch.Tensor):
            raise TraceError(f"decoder layer {i} got no hidden states tensor")
        self.hidden.append(hidden)
        named = [(f"arg{k}", a) for k, a in enumerate(args[1:], 1)]
        named += [(k, v) for k, v in kwargs.items() if k != "hidden_states"]
        for key, value in named:
            leaves = [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]
            for j, t in enumerate(leaves):
                sid = _sid(t)
                if sid in self.sides or sid == _sid(hidden):
                    continue
                label = key if len(leaves) == 1 else f"{key}.{j}"
                if label in self.side_tensors:
                    label = f"{label}.{len(self.side_tensors)}"
                self.sides[sid] = label
                self.side_tensors[label] = t
                self.keep.append(t)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace != "aten":
            return out
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if not outs:
            return out
        scope = self.scopes[-1] if self.scopes else ""
        retype: dict = {}
        if func is torch.ops.aten.native_layer_norm.default and len(outs) == 3:
            # Fake tensors give the statistics the CUDA kernel's dtype;
            # other devices keep their own.
            dt = self.stats_dtype.get(outs[0].dtype)
            if dt is not None and dt != outs[1].dtype:
                retype = {1: dt, 2: dt}
        from ._measure import keeps_number

        self.ops.append(_Op(func, ins, outs, self.block, scope, retype=retype,
                            host=keeps_number(func, args)))
        self.keep.extend(ins)
        self.keep.extend(outs)
        return out

    def _attribute(self) -> None:
        """Give each saved tensor to the op that saved it. Autograd saves an
        op's inputs before the op runs and its outputs right after, so a
        tensor saved between op n-1 and op n is op n-1's output, saved by
        it, or op n's input; an output of n-1 that op n also reads goes to
        n-1 the first time it is saved there, to n after."""
        window: dict[int, list[torch.Tensor]] = {}
        for n, t in self.packs:
            window.setdefault(n, []).append(t)
        for n, saved in window.items():
            prev = self.ops[n - 1] if n > 0 else None
            nxt = self.ops[n] if n < len(self.ops) else None
            prev_out = {_key(t) for t in prev.outs} if prev else set()
            next_in = {_key(t) for t in nxt.args} if nxt else set()
            if nxt is not None and _is_view_op(nxt):
                next_in = set()  # a view saves none of its inputs
            k = 0
            seen: set = set()
            while k < len(saved):
                key = _key(saved[k])
                if key not in prev_out:
                    break
                if key in next_in and key in seen:
                    break
                if key in next_in and not any(_key(s) == key for s in saved[k + 1:]):
                    break
                seen.add(key)
                k += 1
            if prev is not None:
                prev.saves.extend(saved[:k])
            if saved[k:]:
                target = nxt or prev
                if target is None:
                    continue
                target.saves.extend(saved[k:])


@contextlib.contextmanager
def _as_run() -> Iterator[None]:
    """Inside, transformers decides what it decides from values as it
    would on the traced batch, not as for a graph being compiled.

    From transformers 5, whether a training batch packs several sequences
    in a row is read off the position ids' values, except on tensors it
    takes for a trace (fake tensors among them): then it assumes packing,
    and every layer gets a mask that the model run on the same batch does
    not make. The traced batch is one unpadded sequence a row (positions
    0 to seq-1), so the answer is the one transformers gives for such
    positions, asked on real ones."""
    try:
        from transformers import masking_utils
    except ImportError:
        yield
        return
    find = getattr(masking_utils, "find_packed_sequence_indices", None)
    if find is None:
        yield
        return

    def unpacked(position_ids: torch.Tensor):
        from torch.utils._python_dispatch import _disable_current_modes

        # Real tensors, unseen by the recorder.
        with _unfaked(), _disable_current_modes():
            b, s = position_ids.shape[0], position_ids.shape[-1]
            plain = find(torch.arange(s).expand(b, s))
        return None if plain is None else find(position_ids)

    masking_utils.find_packed_sequence_indices = unpacked
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = find


def _layer_norm_stats(device: str) -> dict:
    """The dtype a layer norm's mean and rstd have on device, for each
    input dtype, found by running it there on a tiny tensor."""
    out = {}
    if device != "cpu":
        return out
    with _unfaked():
        for dt in (torch.float32, torch.bfloat16, torch.float16):
            try:
                x = torch.zeros(1, 8, dtype=dt)
                out[dt] = torch.ops.aten.native_layer_norm.default(x, [8], None, None, 1e-5)[1].dtype
            except RuntimeError:
                pass
    return out


@contextlib.contextmanager
def _unfaked() -> Iterator[None]:
    """Run real kernels inside, whatever modes are active."""
    try:
        from torch._subclasses.fake_tensor import unset_fake_temporarily
    except ImportError:  # older PyTorch
        yield
        return
    with unset_fake_temporarily():
        yield


def _is_view_op(op: _Op) -> bool:
    """Whether an op only looks at its input's storage (not in place)."""
    name = op.func._schema.name.split("::")[-1]
    return (bool(op.outs) and bool(op.args) and not name.endswith("_")
            and _sid(op.outs[0]) == _sid(op.args[0]) and op.func.is_view)
