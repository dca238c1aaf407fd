"""The graph YAML a trace writes: the recorded ops as ``aten`` nodes.

``_Graph`` turns a ``_Recorder``'s ops into nodes in blocks (``embed``,
``layers.N``, ``head``), their saved tensors by storage, the parameters
each counted once, whether each output needs a gradient, and the FLOPs of
matrix products and fused attention (``_flops``).
"""
from __future__ import annotations

import json
import re
from typing import Optional

import torch

from .introspect import _ATTENTION, _TORCH
from .layers import unwrap
from ._record import TraceError, _Op, _Recorder, _is_view_op, _key, _sid


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
