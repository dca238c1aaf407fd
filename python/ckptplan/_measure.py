"""What a training step really keeps and recomputes, measured on the live model.

``measure(model, batch)`` runs one forward and backward of ``model`` on
``batch`` and reports, per decoder layer:

saved_bytes
    the activations the layer's forward saves for backward, as autograd's
    saved-tensor hooks see them, each storage counted once: what the layer
    keeps when it is stored. The layer's input counts when it is saved; the
    parameters, buffers and the other arguments the model passes every layer
    (attention mask, rotary cos/sin) do not. A checkpointed layer saves
    through PyTorch's own hooks, which hide from these: its saved_bytes is
    what the checkpoint itself saves (its input).
kept_bytes
    the bytes of every storage the layer's forward allocated that is still
    alive when the forward (loss included) is done, its output included:
    what the layer holds across the step under whatever plan runs it (the
    tensors autograd keeps, a checkpoint's cache). Found by a dispatch mode
    that takes a weak reference to each new storage (a constant made
    with ``torch.tensor`` too, which reaches it through ``lift_fresh``).
    On a GPU, the storages in host memory are not in it but apart:
host_bytes
    what the layer keeps in host memory apart from kept_bytes, on any
    device: the Python numbers its products keep (PyTorch wraps each in an
    8-byte float64 tensor, which no hook sees), the random-number state
    torch.utils.checkpoint stashes for a checkpointed or selective layer
    (the CPU generator's, and a CUDA device's), and on a GPU the seed and
    offset CUDA's memory-efficient attention keeps on the host: memory, but
    not the GPU's, which the plan's budget is.

and for the step: the FLOPs of forward and backward as PyTorch's
``FlopCounterMode`` counts them (matrix products and attention; CPU's fused
attention counted as CUDA's is), the FLOPs recomputed in backward (the
backward's FLOPs less those of the same backward with the plan suspended),
and on CUDA the peak allocated bytes over the step above what was allocated
before it.

Example:
    >>> import torch, transformers
    >>> config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32,
    ...     num_attention_heads=2, intermediate_size=64, vocab_size=64)
    >>> model = transformers.LlamaForCausalLM(config)
    >>> m = measure(model, {"input_ids": torch.zeros(1, 8, dtype=torch.long)})
    >>> len(m.layers)
    2
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Iterator, Mapping, Optional

import torch
import torch.nn as nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ._binary import CkptplanUsageError
from .layers import decoder_layers

try:
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass
except ImportError:  # PyTorch before 2.1 has no tensor subclasses that wrap others
    def is_traceable_wrapper_subclass(t: object) -> bool:
        return False

aten = torch.ops.aten


@dataclasses.dataclass
class LayerMeasurement:
    """One decoder layer's bytes, as measure describes them."""

    name: str
    saved_bytes: int
    kept_bytes: int
    host_bytes: int = 0  # kept in host memory, apart from kept_bytes


@dataclasses.dataclass
class Measurement:
    """One training step of a model, measured."""

    layers: list[LayerMeasurement]
    forward_flops: int
    backward_flops: int
    recomputed_flops: Optional[int]  # None when no plan is applied
    peak_bytes: Optional[int]  # CUDA only
    loss: float

    def to_dict(self) -> dict[str, Any]:
        """The measurement as plain data (for JSON)."""
        return dataclasses.asdict(self)


def measure(model: nn.Module, batch: Mapping[str, Any], *,
            loss_fn: Optional[Callable[[Any], torch.Tensor]] = None,
            layers: Optional[nn.ModuleList] = None,
            autocast: Optional[torch.dtype] = None) -> Measurement:
    """Run one forward and backward of model on batch and measure it.

    batch is passed as keyword arguments (``input_ids``, ``labels``, ...);
    without ``labels`` the input ids are used as labels. loss_fn maps the
    model's output to the loss (default: ``output.loss``). autocast runs
    the forward under ``torch.autocast`` in that dtype, as a trainer with
    mixed precision does. Gradients are accumulated into the parameters as
    a training step would.
    """
    if not isinstance(model, nn.Module):
        raise CkptplanUsageError(f"ckptplan.measure: model is a torch.nn.Module, not {type(model).__name__}")
    if not isinstance(batch, Mapping) or not all(isinstance(k, str) for k in batch):
        raise CkptplanUsageError(
            "ckptplan.measure: batch is the model's keyword arguments, a dict such as "
            f"{{'input_ids': ids, 'labels': ids}}, not {type(batch).__name__}")
    ids = batch.get("input_ids")
    if ids is not None and not (isinstance(ids, torch.Tensor) and not ids.is_floating_point() and ids.dim() == 2):
        what = f"a {ids.dtype} tensor of {ids.dim()} dimensions" if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise CkptplanUsageError(f"ckptplan.measure: input_ids is an integer tensor of [batch, seq], not {what}")
    layers = decoder_layers(model) if layers is None else layers
    batch = dict(batch)
    if "labels" not in batch and "input_ids" in batch:
        batch["labels"] = batch["input_ids"]
    loss_fn = loss_fn or _loss
    names = [f"layers.{i}" for i in range(len(layers))]
    cuda = any(p.is_cuda for p in model.parameters())
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    device = next(model.parameters()).device.type

    def run_forward():
        if autocast is None:
            return loss_fn(model(**batch))
        with torch.autocast(device, dtype=autocast):
            return loss_fn(model(**batch))

    saved = _SavedBytes(model, layers)
    alloc = _Allocations(len(layers))
    counter = _flop_counter()
    with contextlib.ExitStack() as stack:
        for i, layer in enumerate(layers):
            stack.enter_context(_in_layer(layer, i, (saved, alloc)))
        stack.enter_context(alloc.rng_stashes())
        with counter, saved.hooks(), alloc:
            loss = run_forward()
    forward = counter.get_total_flops()
    kept, host = alloc.alive(host_apart=cuda)
    counter = _flop_counter()
    with counter:
        loss.backward()
    backward = counter.get_total_flops()
    peak = None
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    recomputed = None
    from ._apply import applied, suspended  # a plan's runtime, if any
    if applied(model) is not None:
        with suspended(model):
            out = run_forward()
            counter = _flop_counter()
            with counter:
                # The parameters' gradients must not change: backward into
                # a copy of the graph's leaves' gradients is not possible,
                # so save and restore them.
                grads = [(p, None if p.grad is None else p.grad.clone()) for p in model.parameters()]
                out.backward()
                for p, g in grads:
                    p.grad = g
            recomputed = backward - counter.get_total_flops()
    return Measurement(
        layers=[LayerMeasurement(n, s, k, h) for n, s, k, h in zip(names, saved.bytes(), kept, host)],
        forward_flops=forward, backward_flops=backward, recomputed_flops=recomputed,
        peak_bytes=peak, loss=float(loss.detach()))


@contextlib.contextmanager
def forward_kept(model: nn.Module, layers: Optional[nn.ModuleList] = None) -> Iterator[Callable[[], list[int]]]:
    """Around a forward of model (a trainer's compute_loss, say): yields a
    function that, called after the forward and before its backward, gives
    the bytes each decoder layer's forward made and still holds, as
    ``measure`` counts a layer's kept_bytes (host memory apart on a GPU).

    Example:
        >>> import transformers
        >>> config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32,
        ...     num_attention_heads=2, intermediate_size=64, vocab_size=64)
        >>> model = transformers.LlamaForCausalLM(config)
        >>> ids = torch.zeros(2, 16, dtype=torch.long)
        >>> with forward_kept(model) as kept:
        ...     loss = model(input_ids=ids, labels=ids).loss
        >>> kept() == [l.kept_bytes for l in measure(model, {"input_ids": ids}).layers]
        True
    """
    layers = decoder_layers(model) if layers is None else layers
    alloc = _Allocations(len(layers))
    cuda = any(p.is_cuda for p in model.parameters())
    with contextlib.ExitStack() as stack:
        for i, layer in enumerate(layers):
            stack.enter_context(_in_layer(layer, i, (alloc,)))
        stack.enter_context(alloc.rng_stashes())
        with alloc:
            yield lambda: alloc.alive(host_apart=cuda)[0]


def _loss(output: Any) -> torch.Tensor:
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, (tuple, list)) and output:
        loss = output[0]
    if not isinstance(loss, torch.Tensor):
        raise ValueError("the model returned no loss: pass labels in the batch, or a loss_fn")
    return loss


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    return (t for t in tree_leaves(obj) if isinstance(t, torch.Tensor))


def _storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _storages(tensors) -> set[int]:
    """Addresses of the storages holding tensors' data: a tensor subclass
    that wraps others (FSDP2's sharded parameters are DTensors) by the
    tensors it wraps."""
    out = set()
    for t in tensors:
        if is_traceable_wrapper_subclass(t):
            attrs, _ = t.__tensor_flatten__()
            # Its inner tensors (a DTensor of PyTorch 2.15 names its mesh too).
            out |= _storages(x for x in (getattr(t, a) for a in attrs) if isinstance(x, torch.Tensor))
        else:
            out.add(_storage_ptr(t))
    return out


@contextlib.contextmanager
def _in_layer(layer: nn.Module, i: int, meters: tuple) -> Iterator[None]:
    """Tell meters when layer i's forward starts and ends."""
    def pre(module, args, kwargs):
        for m in meters:
            m.enter(i, args, kwargs)

    def post(module, args, kwargs, out):
        for m in meters:
            m.leave(i)

    hooks = [layer.register_forward_pre_hook(pre, with_kwargs=True),
             layer.register_forward_hook(post, with_kwargs=True)]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


class _SavedBytes:
    """Distinct storages each layer's forward saves for backward."""

    def __init__(self, model: nn.Module, layers: nn.ModuleList):
        self.model = model
        self.fixed: set[int] = set()
        self.layers = layers
        self.per = [dict() for _ in layers]
        self.layer: Optional[int] = None
        self.exempt: set[int] = set()

    def enter(self, i: int, args: tuple, kwargs: dict) -> None:
        self.layer = i
        # The hidden state is the layer's own input; everything else the
        # model hands every layer (masks, rotary cos/sin, positions) is not.
        rest = (args[1:], {k: v for k, v in kwargs.items() if k != "hidden_states"})
        if not args:
            rest = ({k: v for k, v in kwargs.items() if k != "hidden_states"},)
        # The layer's parameters as it runs: under FSDP2 they are gathered
        # for the forward, into storages the model did not have before.
        self.exempt = _storages(_tensors(rest)) | _storages(self.layers[i].parameters())
        # As they are now: a model may replace a buffer on its first step,
        # and the old one's address then holds an activation.
        self.fixed = _storages((*self.model.parameters(), *self.model.buffers()))

    def leave(self, i: int) -> None:
        self.layer = None

    def hooks(self):
        def pack(t: torch.Tensor):
            if self.layer is not None:
                st = t.untyped_storage()
                p = st.data_ptr()
                if st.nbytes() > 0 and p not in self.fixed and p not in self.exempt:
                    self.per[self.layer].setdefault(p, st.nbytes())
            return t

        return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)

    def bytes(self) -> list[int]:
        return [sum(d.values()) for d in self.per]


class _Allocations(TorchDispatchMode):
    """Weak references to the storages each layer's forward creates, and
    to what it keeps in host memory that no op allocates: the Python
    numbers PyTorch wraps in tensors before an op runs, and the generator
    states a checkpoint stashes."""

    def __init__(self, n: int):
        super().__init__()
        self.refs: list[list[tuple[StorageWeakRef, int, bool]]] = [[] for _ in range(n)]
        self.host: list[list[tuple[StorageWeakRef, int]]] = [[] for _ in range(n)]
        self.scalars = [0] * n  # Python numbers each layer's products keep
        self.layer: Optional[int] = None

    @contextlib.contextmanager
    def rng_stashes(self) -> Iterator[None]:
        """Inside, the generator states taken in a layer (a checkpoint's
        stash) are recorded as its host memory."""
        patched = [(torch, "get_rng_state")]
        if torch.cuda.is_available():
            patched.append((torch.cuda, "get_rng_state"))
        originals = [(m, name, getattr(m, name)) for m, name in patched]

        def recording(fn):
            def get_rng_state(*args, **kwargs):
                state = fn(*args, **kwargs)
                if self.layer is not None and isinstance(state, torch.Tensor):
                    st = state.untyped_storage()
                    self.host[self.layer].append((StorageWeakRef(st), st.nbytes()))
                return state
            return get_rng_state

        for m, name, fn in originals:
            setattr(m, name, recording(fn))
        try:
            yield
        finally:
            for m, name, fn in originals:
                setattr(m, name, fn)

    def enter(self, i: int, args: tuple, kwargs: dict) -> None:
        self.layer = i

    def leave(self, i: int) -> None:
        self.layer = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.layer is not None:
            self.scalars[self.layer] += keeps_number(func, args)
        if self.layer is not None:
            inputs = {_storage_ptr(t) for t in _tensors((args, kwargs)) if t.layout == torch.strided}
            if func is aten.lift_fresh.default:
                # A constant the forward made outside any op
                # (torch.tensor([-2]) for an index): new memory all the same.
                inputs = set()
            for t in _tensors(out):
                if t.layout != torch.strided or t.device.type == "meta":
                    continue
                st = t.untyped_storage()
                if st.nbytes() == 0 or st.data_ptr() in inputs:
                    continue  # a view or an in-place result: not new memory
                self.refs[self.layer].append((StorageWeakRef(st), st.nbytes(), t.device.type == "cpu"))
        return out

    def alive(self, host_apart: bool) -> tuple[list[int], list[int]]:
        """Each layer's live bytes, and its host bytes: the numbers its
        products keep (by autograd's rule, a call each), the stashed
        generator states still alive, and where host_apart
        (the model is on a GPU) the CPU storages its ops made (the state
        a fused attention keeps for its random numbers)."""
        kept, host = [], []
        for refs, extra, scalars in zip(self.refs, self.host, self.scalars):
            live = {r.cdata: (n, cpu and host_apart) for r, n, cpu in refs if not r.expired()}
            kept.append(sum(n for n, h in live.values() if not h))
            apart = {r.cdata: n for r, n in extra if not r.expired()}
            apart.update({c: n for c, (n, h) in live.items() if h})
            host.append(sum(apart.values()) + scalars)
        return kept, host


# A product with (or quotient by) a Python number: PyTorch wraps the number
# in a 0-dim float64 (or int64) tensor in host memory, which autograd saves
# for the tensor's gradient, past every saved-tensor hook, and which reaches
# a dispatch mode as the number again. Autograd's formulas for mul and div
# (derivatives.yaml) save it when the tensor needs a gradient.
_KEEPS_NUMBER = (aten.mul.Tensor, aten.div.Tensor)
_WRAPPED_BYTES = 8


def keeps_number(func, args: tuple) -> int:
    """The host bytes op func keeps for backward on args, as a dispatch
    mode sees them: a Python number's 8 bytes for a product with it (or a
    quotient by it) of a tensor that needs a gradient, 0 otherwise."""
    if func not in _KEEPS_NUMBER or len(args) < 2:
        return 0
    x, c = args[0], args[1]
    if (isinstance(x, torch.Tensor) and isinstance(c, (int, float)) and not isinstance(c, bool)
            and x.requires_grad and torch.is_grad_enabled()):
        return _WRAPPED_BYTES
    return 0


def _flop_counter():
    """FlopCounterMode that also counts CPU's fused attention, with the
    formula PyTorch uses for the CUDA kernels, and every fused attention
    over grouped K and V (enable_gqa) as over K and V repeated to every
    query head (each query head's products are the same; PyTorch's own
    formula refuses the shapes before 2.15), and the experts' grouped
    products (torch._grouped_mm, which it does not count)."""
    from torch.utils import flop_counter as fc

    if not hasattr(fc, "sdpa_flop_count"):
        return fc.FlopCounterMode(display=False)

    def heads(q, *kv):
        """k and v with q's heads (shapes [b, heads, s, d])."""
        return [tuple(t[:1]) + (q[1],) + tuple(t[2:]) if len(t) == 4 and len(q) == 4 else t for t in kv]

    def forward(q, k, v, *args, out_shape=None, **kwargs):
        return fc.sdpa_flop_count(q, *heads(q, k, v))

    def backward(grad_out, q, k, v, *args, out_shape=None, **kwargs):
        return fc.sdpa_backward_flop_count(grad_out, q, *heads(q, k, v))

    custom = {}
    if hasattr(aten, "_grouped_mm"):  # experts' products, forward and backward
        from ._tracegraph import grouped_mm_flops

        custom[aten._grouped_mm] = lambda a, b, *args, out_shape=None, **kwargs: grouped_mm_flops(a, b)
    for name in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"):
        op = getattr(aten, name, None)
        if op is not None:
            custom[op] = forward
        op = getattr(aten, name + "_backward", None)
        if op is not None:
            custom[op] = backward
    return fc.FlopCounterMode(display=False, custom_mapping=custom)
