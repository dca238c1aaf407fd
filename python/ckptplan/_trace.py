"""Tracing any model transformers can build into a graph the planner reads.

``trace(config_or_model)`` builds the model under PyTorch's fake tensors
(shapes, dtypes and devices, no memory: seconds even for a 70B model), runs
one training forward with its loss, and records every ATen op as autograd
sees it: its inputs, its outputs, the tensors autograd saves for backward
(through saved-tensor hooks, in the order it saves them) and its FLOPs.
The result is a graph YAML of ``aten`` nodes, one block per decoder layer,
which ``ckptplan plan`` plans like any other graph, keep sets included.

What the graph holds:

- the embedding ops (block ``embed``) that lead to the first layer's
  hidden state, every decoder layer's ops (``layers.N``) and what follows
  them up to the loss (``head``);
- the tensors the model computes once and hands every layer (rotary cos
  and sin, the attention mask, positions) as graph inputs: they are not
  any layer's activations, and those a layer saves count once, as static
  buffers;
- the model's parameters, each counted once: those in the training dtype
  (the one most of them are in) on the first node, those in another
  (PEFT's fp32 adapters over 16-bit weights) with that dtype on the first
  node that reads one; and whether each node's output needs a gradient;
- FLOPs of matrix products and fused attention (2·m·n·k; 4·b·h·s·s'·d,
  its backward 2.5× when fused), the counting ``ckptplan``'s builders use.

The ops are those of the device the fake tensors claim (``cpu`` by
default, ``cuda`` where PyTorch has CUDA): kernels differ between devices
in what they save (CPU's dropout keeps its mask in the model's dtype,
CUDA's a byte; their fused attention kernels keep different statistics).

Example:
    >>> import transformers
    >>> config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32,
    ...     num_attention_heads=2, intermediate_size=64, vocab_size=64)
    >>> text = trace(config, seq=16)
    >>> text.splitlines()[0]
    '# A traced graph: ckptplan plan this file (ckptplan trace wrote it).'
"""
from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Union

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .introspect import _ATTENTION, _TORCH
from .layers import decoder_layers, unwrap

__all__ = ["trace", "TraceError", "load_config"]

DTYPES = {
    torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64",
    torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8",
    torch.uint8: "uint8", torch.bool: "bool",
}
TRAIN_DTYPES = _TORCH  # ckptplan's name → the training dtype

# Ops whose output never needs a gradient, whatever they read.
_FACTORIES = re.compile(
    r"^(empty|empty_like|empty_strided|new_empty|new_empty_strided|zeros|zeros_like|new_zeros|ones|"
    r"ones_like|new_ones|full|full_like|new_full|arange|scalar_tensor|bernoulli_|uniform_|normal_|"
    r"random_|fill_|zero_|lift_fresh|lift_fresh_copy|eq|ne|lt|le|gt|ge|logical_\w+|argmax|argmin|"
    r"argsort|isnan|isinf|sign|bitwise_\w+|triu_indices|tril_indices)$")
# Fused attention kernels: FLOPs 4·b·h·s·s'·d, backward 2.5× (it recomputes
# the scores).
_FUSED_ATTENTION = re.compile(r"^_scaled_dot_product_\w*attention\w*$|^_flash_attention_forward$|^_efficient_attention_forward$")


class TraceError(ValueError):
    """The model or config cannot be traced; the message says why."""


def load_config(path: Union[str, os.PathLike]):
    """The transformers config in a config.json file, or in a directory
    holding one. Raises TraceError for a missing, unreadable or unknown one.
    """
    import transformers

    path = os.fspath(path)
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise TraceError(f"{file}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise TraceError(f"{file}: {getattr(err, 'strerror', None) or err}") from None
    except json.JSONDecodeError as err:
        raise TraceError(f"{file}:{err.lineno}:{err.colno}: {err.msg}") from None
    if not isinstance(data, dict):
        raise TraceError(f"{file}: want a JSON object (a config.json)")
    model_type = data.get("model_type")
    if not isinstance(model_type, str):
        raise TraceError(f"{file}: no model_type")
    try:
        return transformers.AutoConfig.for_model(**data)
    except (ValueError, KeyError, TypeError) as err:
        raise TraceError(f"{file}: transformers {transformers.__version__} cannot build model_type "
                         f"{model_type!r}: {err}") from None


def trace(config_or_model: Any, *, batch: int = 1, seq: int = 2048, dtype: str = "bf16",
          attention: str = "auto", device: str = "cpu", name: Optional[str] = None) -> str:
    """The graph YAML of one training step of a model, traced.

    config_or_model is a config.json path (or a directory holding one), a
    transformers config, or a live model (a PEFT model too), which is
    traced as it is set up: its dtype, adapters, attention and training
    mode; dtype and attention then do not apply. A config builds
    ``AutoModelForCausalLM`` in dtype with the attention implementation
    given ("auto": the one transformers picks for the model, sdpa where it
    has one), in training mode; a multimodal config, its text model. batch
    and seq size the step.
    """
    note = ""
    if not (isinstance(batch, int) and isinstance(seq, int)) or batch <= 0 or seq <= 0:
        raise TraceError(f"batch and seq must be positive integers, got batch={batch!r}, seq={seq!r}")
    if dtype not in TRAIN_DTYPES:
        raise TraceError(f"unknown dtype {dtype!r} (valid: {', '.join(TRAIN_DTYPES)})")
    if attention not in ("auto", "eager", "sdpa"):
        raise TraceError(f"unknown attention {attention!r} (valid: auto, eager, sdpa)")
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake = FakeTensorMode(allow_non_fake_inputs=True)
    if isinstance(config_or_model, nn.Module):
        model = config_or_model
        name = name or type(unwrap(model)).__name__
    else:
        config = config_or_model
        if isinstance(config, (str, os.PathLike)):
            name = name or _stem(config)
            config = load_config(config)
        name = name or getattr(config, "model_type", "model")
        text = text_config(config)
        if text is not config:
            note = (f"the text model ({getattr(text, 'model_type', '?')}) of a "
                    f"{getattr(config, 'model_type', '?')} config; what runs only on images is not counted")
        model = _build(config, fake, TRAIN_DTYPES[dtype], attention, device)
    with fake:
        ids = torch.zeros(batch, seq, dtype=torch.long, device=device)
        labels = torch.zeros(batch, seq, dtype=torch.long, device=device)
    rec = _Recorder(model, fake, device)
    rec.name_input(ids, "input_ids")
    rec.name_input(labels, "labels")
    from torch._subclasses import fake_tensor

    dynamic = tuple(getattr(fake_tensor, n) for n in ("DynamicOutputShapeException", "DataDependentOutputException")
                    if hasattr(fake_tensor, n))
    try:
        loss = rec.run(_step_inputs(model, ids, labels))
    except dynamic as err:
        raise TraceError(
            f"{name}: a shape depends on the data ({err}): the tracer follows shapes, not values, and cannot "
            "trace it (a mixture of experts' routing is such a shape where each expert runs on the tokens routed "
            "to it; transformers 5 runs them as grouped products by default, which the tracer follows)") from None
    return _Graph(rec, loss, name, batch, seq).yaml(note)


def _step_inputs(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> dict:
    """The keyword arguments of one training forward: the tokens, the
    labels, and no key/value cache where the model takes ``use_cache``
    (``ckptplan.apply`` turns it off; from transformers 5 a model in
    training makes one, which copies every layer's keys and values)."""
    import inspect

    out = {"input_ids": ids, "labels": labels}
    try:
        params = inspect.signature(unwrap(model).forward).parameters
    except (TypeError, ValueError):
        return out
    if "use_cache" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        out["use_cache"] = False
    return out


def _stem(path: Union[str, os.PathLike]) -> str:
    p = os.path.abspath(os.fspath(path))
    if os.path.basename(p) == "config.json" or os.path.isdir(p):
        p = os.path.dirname(p) if not os.path.isdir(p) else p
        return os.path.basename(p) or "model"
    return os.path.splitext(os.path.basename(p))[0]


def text_config(config):
    """The config of the causal language model to trace: the text model's,
    for a multimodal config that nests one (Gemma 3, Mistral 3, LLaVA:
    ``text_config``); config itself otherwise. Training on text runs only
    the text model, and a vision tower has no part in its activations.

    Example:
        >>> import transformers
        >>> c = transformers.AutoConfig.for_model("llava", text_config={"model_type": "llama"})
        >>> text_config(c).model_type
        'llama'
    """
    nested = getattr(config, "text_config", None)
    if nested is None or nested is config:
        return config
    return nested


def _build(config, fake, dtype: torch.dtype, attention: str, device: str) -> nn.Module:
    import copy

    import transformers

    config = copy.deepcopy(text_config(config))  # the caller's stays as it was
    kwargs = {} if attention == "auto" else {"attn_implementation": attention}
    # transformers 5 renamed torch_dtype to dtype.
    kwargs["dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"] = dtype
    try:
        with fake, torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(config, **kwargs)
    except ValueError as err:
        raise TraceError(f"transformers cannot build a causal language model of model_type "
                         f"{getattr(config, 'model_type', '?')!r}: {err}") from None
    model.train()
    return model


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


class _Graph:
    """The recorded ops as graph nodes."""

    def __init__(self, rec: _Recorder, loss: torch.Tensor, name: str, batch: int, seq: int):
        self.rec, self.name, self.batch, self.seq = rec, name, batch, seq
        self.lines: list[str] = []
        self.inputs: list[tuple[str, torch.Tensor]] = []
        self.where: dict[tuple, tuple[str, int]] = {}  # tensor key → (node, its output)
        self.storage_of: dict[int, tuple[str, int]] = {}  # storage → (node, output) that made it
        self.param_views: set[int] = set()
        self.names: set[str] = set()
        self.grad: dict[str, bool] = {}
        self.dtype = _weights_dtype(rec)  # None: then the first float output that needs a gradient
        self.loss = loss
        self.made: dict[str, _Op] = {}  # node → the op it records
        self.param_dtypes: dict[int, set] = {}  # line → the dtypes of the parameters its op reads
        self._build()
        self._place_params()

    def _input(self, label: str, t: torch.Tensor) -> tuple[str, int]:
        name = label
        while name in self.names:
            name += "_"
        self.names.add(name)
        self.inputs.append((name, t))
        ref = (name, 0)
        self.where[_key(t)] = ref
        self.storage_of.setdefault(_sid(t), ref)
        self.grad[name] = False
        return ref

    def _ref(self, t: torch.Tensor) -> Optional[tuple[str, int]]:
        """The node output a tensor is; None for a parameter or buffer."""
        key = _key(t)
        if key in self.where:
            return self.where[key]
        sid = _sid(t)
        if sid in self.rec.params or sid in self.rec.buffers or sid in self.param_views:
            return None
        if sid in self.rec.sides:
            return self._input(self.rec.sides[sid], t)
        if sid in self.storage_of:
            return self.storage_of[sid]
        return self._input(f"const{len(self.inputs)}", t)

    def _build(self) -> None:
        rec = self.rec
        ops = rec.ops
        # The embedding ops that lead to the first layer: walk back from its
        # hidden state; the rest of what runs before it (rotary tables,
        # masks) makes the layers' other inputs.
        first = [k for k, op in enumerate(ops) if op.block != "embed"]
        pre_keep = set()
        if rec.hidden:
            need = {_sid(rec.hidden[0])}
            for k in range(first[0] - 1 if first else len(ops) - 1, -1, -1):
                op = ops[k]
                if any(_sid(t) in need for t in op.outs) and not all(_sid(t) in rec.sides for t in op.outs):
                    pre_keep.add(k)
                    need.update(_sid(t) for t in op.args)
        for k, op in enumerate(ops):
            if op.block == "embed" and k not in pre_keep:
                continue
            self._node(op)
        ref = self.where.get(_key(self.loss)) or self.storage_of.get(_sid(self.loss))
        if ref is None:
            raise TraceError("the loss was not made by any op the tracer saw")
        self.output = self._output_node(ref)

    def _node(self, op: _Op) -> None:
        rec = self.rec
        fn = str(op.func)  # aten.mm.default
        short = op.func._schema.name.split("::")[-1]
        if all(t.numel() == 0 for t in op.outs):
            return  # nothing to keep or compute (Phi-3's empty pass-through of a full rotary)
        refs = []
        param_reads = []
        for t in op.args:
            if t.numel() == 0:
                continue  # an empty operand (of a cat) holds nothing
            sid = _sid(t)
            if sid in rec.params or sid in self.param_views:
                param_reads.append(t)
                continue
            r = self._ref(t)
            if r is not None:
                refs.append((t, r))
        out = op.outs[0]
        sid_out = _sid(out)
        in_sids = [_sid(t) for t in op.args]
        if not refs and param_reads and op.func.is_view:
            # A view of a parameter (a transpose for a product): the
            # parameter itself.
            for t in op.outs:
                self.param_views.add(_sid(t))
            return
        if not refs and not param_reads and op.args and all(_sid(t) in rec.buffers or _sid(t) in self.param_views
                                                             for t in op.args) and op.func.is_view:
            for t in op.outs:
                self.param_views.add(_sid(t))
            return
        if op.func.is_view and len(op.outs) > 1 and refs:
            # Several views of one input (split, unbind): a node each.
            for k, t in enumerate(op.outs):
                self._node(_Op(op.func, op.args, [t], op.block, op.scope, saves=op.saves if k == 0 else []))
            return
        # Inputs: activations in order, deduplicated.
        inputs: list[tuple[str, int]] = []
        in_index: dict[tuple, int] = {}
        for t, r in refs:
            if r not in inputs:
                inputs.append(r)
            in_index.setdefault(_key(t), inputs.index(r))
            in_index.setdefault(("sid", _sid(t)), inputs.index(r))
        # A node reads other outputs of a node through a view node of its own.
        names = []
        for r in inputs:
            names.append(self._output_node(r))
        # View: the output lives in input 0's storage.
        view = None
        if inputs and sid_out in in_sids:
            src = next((r for t, r in refs if _sid(t) == sid_out), None)
            if src is not None:
                j = inputs.index(src)
                if j != 0:
                    inputs.insert(0, inputs.pop(j))
                    names.insert(0, names.pop(j))
                    in_index = {k: (0 if v == j else v + (1 if v < j else 0)) for k, v in in_index.items()}
                view = 0
        node = self._name(op, short)
        trains = any(rec.params.get(_sid(t), (0, t.requires_grad))[1] for t in param_reads)
        grad_in = any(self.grad.get(n, False) for n in names) or trains
        is_float = out.dtype.is_floating_point or out.dtype.is_complex
        grad = bool(op.saves) or (grad_in and is_float and not _FACTORIES.match(short))
        extras = op.outs[1:]
        # Saves: inputs and outputs, by what they are.
        saves = []
        for t in op.saves:
            if t.numel() == 0:
                continue
            key = _key(t)
            sid = _sid(t)
            if sid in rec.params or sid in rec.buffers or sid in self.param_views:
                continue
            hit = None
            for k2, o in enumerate(op.outs):
                if _key(o) == key or (hit is None and _sid(o) == sid and view is None):
                    hit = "out" if k2 == 0 else f"out{k2}"
                    if _key(o) == key:
                        break
            if hit is None:
                j = in_index.get(key, in_index.get(("sid", sid)))
                if j is None:
                    r = self._ref(t)
                    if r is None:
                        continue
                    if r not in inputs:
                        inputs.append(r)
                        names.append(self._output_node(r))
                    j = inputs.index(r)
                hit = f"in{j}"
            saves.append(hit)
        fl, bfl = _flops(short, op, [self.grad.get(n, False) for n in names], trains, rec)
        fields = [f"name: {node}", "op: aten", f"fn: {fn}", f"block: {op.block}",
                  f"inputs: [{', '.join(names)}]", f"shape: {_shape(out)}", f"dtype: {_dtype(out)}"]
        if view is not None:
            fields.append("view: 0")
        if extras:
            fields.append("outputs: [" + ", ".join(f"{{shape: {_shape(t)}, dtype: {_dtype(t, op.retype.get(k + 1))}}}"
                                                   for k, t in enumerate(extras)) + "]")
        if grad:
            fields.append("grad: true")
        if saves:
            fields.append(f"saves: [{', '.join(saves)}]")
        if fl:
            fields.append(f"flops: {fl}")
        if bfl and grad:
            fields.append(f"backward_flops: {bfl}")
        if op.host and grad:
            fields.append(f"host_bytes: {op.host}")
        self.param_dtypes[len(self.lines)] = {t.dtype for t in param_reads}
        self.lines.append("    - {" + ", ".join(fields) + "}")
        self.made[node] = op
        self.grad[node] = grad
        for k2, t in enumerate(op.outs):
            ref = (node, k2)
            if not (k2 == 0 and view is not None and _is_view_op(op) and _key(t) == _key(op.args[0])
                    and _key(t) in self.where):
                # A view that changes nothing (a mask sliced to its full
                # length) is the tensor it views: a later reader reads
                # that, not this layer's view of it.
                self.where[_key(t)] = ref
            if k2 == 0 and view is not None:
                continue  # lives in its input's storage
            self.storage_of.setdefault(_sid(t), ref)
        if self.dtype is None and out.dtype in (torch.float32, torch.bfloat16, torch.float16) and grad:
            self.dtype = out.dtype

    def _output_node(self, r: tuple[str, int]) -> str:
        """The node holding output r: a view node for an extra output."""
        node, k = r
        if k == 0:
            return node
        name = f"{node}.out{k}"
        if name not in self.names:
            self.names.add(name)
            op = self.made[node]
            t = op.outs[k]
            grad = bool(self.grad.get(node) and (t.dtype.is_floating_point or t.dtype.is_complex))
            self.lines.append("    - {" + ", ".join([
                f"name: {name}", "op: aten", "fn: getitem", f"block: {op.block}", f"inputs: [{node}]",
                f"shape: {_shape(t)}", f"dtype: {_dtype(t, op.retype.get(k))}", f"view: {k}"]
                + (["grad: true"] if grad else [])) + "}")
            self.grad[name] = grad
        return name

    def _name(self, op: _Op, short: str) -> str:
        scope = op.scope
        if op.block.startswith("layers."):
            i = op.block.split(".")[1]
            m = re.search(r"(?:^|\.)" + re.escape(i) + r"(?:\.|$)", scope)
            rel = scope[m.end():] if m else ""
            base = f"{op.block}.{rel}.{short}" if rel else f"{op.block}.{short}"
        else:
            base = f"{scope}.{short}" if scope else short
        name, n = base, 1
        while name in self.names:
            n += 1
            name = f"{base}.{n}"
        self.names.add(name)
        return name

    def _place_params(self) -> None:
        """Count the model's parameters, each once, for static memory:
        those in the graph's dtype on the first node, those in another
        (PEFT's fp32 adapters over 16-bit weights) on the first node that
        reads one, with their dtype."""
        groups: dict[torch.dtype, list[int]] = {}
        for n, tr, dt in self.rec.params.values():
            g = groups.setdefault(dt, [0, 0])
            g[0] += n
            g[1] += n if tr else 0
        graph = self.dtype or torch.float32
        taken: set[int] = set()
        for dt in sorted(groups, key=lambda d: d != graph):
            n, tr = groups[dt]
            if n == 0:
                continue
            if dt == graph:
                i = 0
            else:
                free = [i for i in range(len(self.lines)) if i not in taken]
                i = next((i for i in free if dt in self.param_dtypes.get(i, ())), free[0] if free else None)
                if i is None:
                    raise TraceError(f"{self.name}: parameters in {dt} have no node to be counted at")
            taken.add(i)
            fields = [f"params: {n}"] + ([f"trainable_params: {tr}"] if tr else [])
            if dt != graph:
                if not dt.is_floating_point or dt not in DTYPES:
                    raise TraceError(f"{self.name}: parameters in {dt}, which ckptplan does not count "
                                     "(a model loaded in 4 or 8 bits is not traced yet)")
                fields.append(f"param_dtype: {DTYPES[dt]}")
            self.lines[i] = self.lines[i][:-1] + ", " + ", ".join(fields) + "}"

    def yaml(self, note: str = "") -> str:
        """The graph YAML, with note (what was traced) as a comment."""
        import transformers

        dtype = DTYPES.get(self.dtype or torch.float32, "fp32")
        by = f"transformers {transformers.__version__}, torch {torch.__version__}"
        device = next((t.device.type for t in self.rec.keep if isinstance(t, torch.Tensor)), "cpu")
        config = getattr(unwrap(self.rec.model), "config", None)
        attention = _ATTENTION.get(getattr(config, "_attn_implementation", None) or "eager")
        attention = f", attention: {attention}" if attention else ""
        out = [
            "# A traced graph: ckptplan plan this file (ckptplan trace wrote it).",
            *([f"# Traced: {note}."] if note else []),
            "graph:",
            f"  name: {_quote(self.name)}",
            f"  dtype: {dtype}",
            f"  traced: {{batch: {self.batch}, seq: {self.seq}, by: {_quote(by + ', ' + device)}, device: {device}"
            f"{attention}}}",
            "  inputs:",
        ]
        for name, t in self.inputs:
            out.append(f"    - {{name: {name}, shape: {_shape(t)}, dtype: {_dtype(t)}}}")
        out.append("  nodes:")
        out.extend(self.lines)
        out.append(f"  output: {self.output}")
        return "\n".join(out) + "\n"


def _weights_dtype(rec: "_Recorder") -> Optional[torch.dtype]:
    """The training dtype: the one most of the model's floating-point
    parameters are in (bf16 under PEFT's fp32 adapters)."""
    counts: dict[torch.dtype, int] = {}
    for n, _, dt in rec.params.values():
        if dt in TRAIN_DTYPES.values():
            counts[dt] = counts.get(dt, 0) + n
    return max(counts, key=counts.get) if counts else None


def _flops(short: str, op: _Op, grads: list, trains: bool, rec: _Recorder) -> tuple[int, int]:
    """Forward and backward FLOPs of an op: products and fused attention."""
    a = op.args

    def rg(t):
        sid = _sid(t)
        if sid in rec.params:
            return rec.params[sid][1]
        return bool(t.requires_grad)

    if short in ("mm", "bmm") and len(a) >= 2:
        x, w = a[0], a[1]
        f = 2 * x.numel() * w.shape[-1]
        return f, f * (rg(x) + rg(w))
    if short in ("addmm", "baddbmm") and len(a) >= 3:
        x, w = a[1], a[2]
        f = 2 * x.numel() * w.shape[-1]
        return f, f * (rg(x) + rg(w))
    if short == "_grouped_mm" and len(a) >= 2:
        # Experts' products (transformers 5): tokens sorted by expert times
        # each expert's weight, whatever the routing.
        x, w = a[0], a[1]
        f = grouped_mm_flops(tuple(x.shape), tuple(w.shape))
        return f, f * (rg(x) + rg(w))
    if _FUSED_ATTENTION.match(short) and len(a) >= 3:
        q, k, v = a[0], a[1], a[2]
        b, h, s, d = q.shape[0], q.shape[1], q.shape[2], q.shape[3]
        f = 2 * b * h * s * k.shape[2] * d + 2 * b * h * s * k.shape[2] * v.shape[3]
        return f, (5 * f) // 2 if (rg(q) or rg(k) or rg(v)) else 0
    return 0, 0


# A complex tensor is written in its real form, as torch.view_as_real sees
# it: a last axis of 2 (real and imaginary parts) in the parts' dtype.
_COMPLEX_PARTS = {torch.complex32: torch.float16, torch.complex64: torch.float32, torch.complex128: torch.float64}


def grouped_mm_flops(a: tuple, b: tuple) -> int:
    """FLOPs of torch._grouped_mm(a, b, offs) by the operands' shapes: 2·m·k·n
    over the groups, whose sizes (offs) do not change the total. a [m, k]
    by b [groups, k, n] (experts' forward), a [k, m] by b [m, n] (their
    weights' gradient, split along m), a [groups, m, k] by b [groups, k, n],
    and a [groups, m, k] by b [k, n] split along n.

    Example:
        >>> grouped_mm_flops((16, 32), (4, 32, 64))  # 16 rows, each by one expert's 32×64
        65536
    """
    if len(a) == 3 and len(b) == 2:
        return 2 * a[1] * a[2] * b[1]
    n = 1
    for d in a:
        n *= d
    return 2 * n * b[-1]


def _shape(t: torch.Tensor) -> str:
    dims = [int(d) for d in t.shape] + ([2] if t.dtype in _COMPLEX_PARTS else [])
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _dtype(t: torch.Tensor, dtype: Optional[torch.dtype] = None) -> str:
    dtype = dtype or t.dtype
    dtype = _COMPLEX_PARTS.get(dtype, dtype)
    try:
        return DTYPES[dtype]
    except KeyError:
        raise TraceError(f"a tensor of {dtype}, which ckptplan does not count") from None


def _quote(s: str) -> str:
    return json.dumps(s)


def main(argv: list[str]) -> int:
    """``ckptplan trace CONFIG [-o FILE] [--batch N] [--seq N] [--dtype D]
    [--attention A] [--device D]``: write the traced graph of the model a
    config.json describes (to standard output without -o). Status 0, 1 on an
    error (its reason on standard error), 2 on a usage error."""
    import argparse
    import sys

    p = argparse.ArgumentParser(
        prog="ckptplan trace",
        description="Trace the model a Hugging Face config.json describes (built on fake tensors, no weights) "
                    "into a graph YAML that 'ckptplan plan' reads.")
    p.add_argument("config", help="a config.json, or a directory holding one")
    p.add_argument("-o", "--output", help="the graph YAML to write (default: standard output)")
    p.add_argument("--batch", type=int, default=1, help="sequences in the batch (default 1)")
    p.add_argument("--seq", type=int, default=2048, help="tokens in a sequence (default 2048)")
    p.add_argument("--dtype", default="bf16", choices=sorted(TRAIN_DTYPES), help="the weights' dtype (default bf16)")
    p.add_argument("--attention", default="auto", choices=("auto", "eager", "sdpa"),
                   help="transformers' attention implementation (default auto: the one transformers picks, "
                        "sdpa where the model has it)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="whose kernels to trace (default cpu; cuda needs a PyTorch with CUDA)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("ckptplan trace: --device cuda needs a PyTorch built with CUDA and a driver", file=sys.stderr)
        return 1
    try:
        text = trace(args.config, batch=args.batch, seq=args.seq, dtype=args.dtype,
                     attention=args.attention, device=args.device)
    except TraceError as err:
        print(f"ckptplan trace: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # a model transformers cannot run this way
        print(f"ckptplan trace: {args.config}: tracing failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as err:
            print(f"ckptplan trace: {args.output}: {err.strerror or err}", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0
