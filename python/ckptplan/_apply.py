"""Applying a plan to a live model: each decoder layer runs as the plan says.

``apply(model, plan)`` sets each decoder layer's forward (an instance
attribute; applying again starts from the forward the layer had before):

store
    unchanged: autograd keeps everything the layer saves.
checkpoint
    ``torch.utils.checkpoint`` (non-reentrant, as PEFT needs): keeps the
    layer's inputs and reruns the layer in backward.
selective
    on PyTorch >= 2.4, selective activation checkpointing: the layer runs in
    a non-reentrant checkpoint whose policy caches exactly the outputs that
    make the plan's kept tensors and recomputes every other op in backward
    (the plan's cost model counts that rerun). The policy is found on the
    layer's first call, by running its forward once with the ops and saved
    tensors recorded: the k-th activation storage the forward saves is the
    plan's k-th ``saved`` entry, sizes checked. Older PyTorch has no such
    policy: ``apply`` refuses a selective layer there.

A plan is for one batch and sequence length: a call with other shapes
fails with a message saying so (plan again for those shapes).

Example:
    >>> import torch, transformers, ckptplan
    >>> config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32,
    ...     num_attention_heads=2, intermediate_size=64, vocab_size=64)
    >>> model = transformers.LlamaForCausalLM(config)
    >>> plan = ckptplan.Plan.every_layer(model, "checkpoint")
    >>> ckptplan.apply(model, plan)
    {'store': 0, 'checkpoint': 2, 'selective': 0}
"""
from __future__ import annotations

import contextlib
import functools
from typing import Iterator, Optional

import torch
import torch.nn as nn
import torch.utils.checkpoint
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .layers import decoder_layers
from .plan import Plan

MODES = ("store", "checkpoint", "selective")

# The ops selective checkpointing runs without asking its policy.
_IGNORED = getattr(torch.utils.checkpoint, "SAC_IGNORED_OPS", frozenset())

_ATTR = "_ckptplan_plan"


def sac_available() -> bool:
    """Whether this PyTorch has selective activation checkpointing (>= 2.4)."""
    return hasattr(torch.utils.checkpoint, "create_selective_checkpoint_contexts")


def apply(model: nn.Module, plan: Plan, *, layers: Optional[nn.ModuleList] = None) -> dict[str, int]:
    """Make each decoder layer of model run as plan says; returns how many
    layers got each mode.

    Raises ValueError when the plan is for another number of layers, does
    not fit its budget, or has a selective layer and this PyTorch has no
    selective checkpointing.
    """
    layers = decoder_layers(model) if layers is None else layers
    if not plan.feasible:
        raise ValueError(f"the plan does not fit its budget of {plan.budget_bytes} bytes: nothing to apply")
    if len(layers) != len(plan.layers):
        raise ValueError(
            f"the plan has {len(plan.layers)} layers but the model has {len(layers)}: "
            "it was made for another model")
    counts = dict.fromkeys(MODES, 0)
    for layer, entry in zip(layers, plan.layers):
        if entry.mode not in MODES:
            raise ValueError(f"{entry.name}: unknown mode {entry.mode!r} (valid: {', '.join(MODES)})")
        if entry.mode == "selective" and not sac_available():
            raise ValueError(
                f"{entry.name}: the plan keeps part of this layer, which needs selective activation "
                f"checkpointing (PyTorch >= 2.4; this is {torch.__version__}): "
                "plan with --solver optimal, which checkpoints whole layers")
    for layer, entry in zip(layers, plan.layers):
        forward = layer.forward
        if isinstance(forward, _Planned):
            forward = forward.inner
        if entry.mode == "store":
            if isinstance(layer.forward, _Planned):
                layer.forward = forward
        else:
            layer.forward = _Planned(forward, layer, entry, plan)
        counts[entry.mode] += 1
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "use_cache", False):
        # Training needs no key/value cache; it would hold every layer's
        # keys and values across the step.
        config.use_cache = False
    setattr(model, _ATTR, plan)
    return counts


def applied(model: nn.Module) -> Optional[Plan]:
    """The plan last applied to model, or None."""
    return getattr(model, _ATTR, None)


@contextlib.contextmanager
def suspended(model: nn.Module) -> Iterator[None]:
    """Run model without its plan inside the block (every layer stored)."""
    layers = decoder_layers(model)
    planned = [(layer, layer.forward) for layer in layers if isinstance(layer.forward, _Planned)]
    for layer, p in planned:
        layer.forward = p.inner
    try:
        yield
    finally:
        for layer, p in planned:
            layer.forward = p


class _Planned:
    """A layer's forward as its plan entry says. An object rather than a
    closure, so that a deep copy of the model runs its own layers."""

    def __init__(self, inner, layer: nn.Module, entry, plan: Plan):
        self.inner, self.layer, self.entry, self.plan = inner, layer, entry, plan
        self.ckptplan_mode = entry.mode
        self.policy: Optional[_Policy] = None
        self.shapes: Optional[tuple] = None

    def __call__(self, *args, **kwargs):
        if not torch.is_grad_enabled():
            return self.inner(*args, **kwargs)
        self._check_shapes(args, kwargs)
        if not _autocasting(args):
            return self._run(args, kwargs)
        # torch.autocast caches its casts of the weights until it exits.
        # Cleared around the layer, its weights are cast inside it every
        # time — the forward, the policy's probe and the recomputation then
        # run the same ops — and the copies it does not save go with it.
        torch.clear_autocast_cache()
        try:
            return self._run(args, kwargs)
        finally:
            torch.clear_autocast_cache()

    def _run(self, args, kwargs):
        fn = functools.partial(self.inner, **kwargs) if kwargs else self.inner
        if self.ckptplan_mode == "checkpoint":
            return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)
        if self.policy is None:
            self.policy = _Policy.find(self.inner, self.layer, args, kwargs, self.entry)
            if _autocasting(args):
                torch.clear_autocast_cache()  # the probe's casts
        return torch.utils.checkpoint.checkpoint(
            fn, *args, use_reentrant=False, context_fn=self.policy.contexts)

    def _check_shapes(self, args, kwargs) -> None:
        x = args[0] if args else kwargs.get("hidden_states")
        if not isinstance(x, torch.Tensor) or x.dim() < 2:
            return
        got = (int(x.shape[0]), int(x.shape[1]))
        want = (self.plan.batch, self.plan.seq)
        if None not in want and got != want:
            raise ValueError(
                f"ckptplan: {self.entry.name} was planned for batch {want[0]} and sequence {want[1]} "
                f"but is called with batch {got[0]} and sequence {got[1]}: its kept tensors and "
                "recompute differ with the shape; plan again for these shapes (ckptplan.plan(..., "
                f"batch={got[0]}, seq={got[1]}))")


class _Recorder(TorchDispatchMode):
    """Records each op call: its number, and for every storage, the last op
    that made it (an address freed and allocated again is a new storage,
    made by the later op)."""

    def __init__(self):
        super().__init__()
        self.made: dict[int, int] = {}  # storage address -> op number that last made it
        self.mutated: dict[int, int] = {}  # storage address -> op number that last wrote it in place
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _IGNORED:
            return out  # the checkpoint's policy is not asked about these
        n, self.count = self.count, self.count + 1
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor) and t.layout == torch.strided}
        mutable = func._schema.is_mutable
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                p = t.untyped_storage().data_ptr()
                if p not in inputs:
                    self.made[p] = n
                elif mutable:
                    self.mutated[p] = n
        return out


class _Policy:
    """Which op calls of a layer's forward the checkpoint caches."""

    def __init__(self, save: frozenset[int], name: str):
        self.save, self.name = save, name

    @classmethod
    def find(cls, inner, layer: nn.Module, args, kwargs, entry) -> "_Policy":
        """Run inner once, recording which op makes each activation storage
        it saves, and match them to the plan's saved list."""
        fixed = {t.untyped_storage().data_ptr() for t in (*layer.parameters(), *layer.buffers())}
        fixed |= {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        rec = _Recorder()
        # (bytes, the op that made the storage) in first-saved order. A
        # saved storage is alive from the op that made it to its packing,
        # and held from then on, so the last op to make its address before
        # the packing made it.
        order: list[tuple[int, Optional[int], int]] = []
        seen: set[int] = set()
        held = []

        def pack(t):
            st = t.untyped_storage()
            p = st.data_ptr()
            if st.nbytes() > 0 and p not in fixed and p not in seen:
                seen.add(p)
                order.append((st.nbytes(), rec.made.get(p), p))
            # Held here, so that no address is reused while recording; the
            # graph gets a placeholder, for a tensor packed as itself by its
            # own node would make a cycle through autograd that Python's
            # collector cannot see, and the probe's graph would never be
            # freed. Its backward never runs.
            held.append(t)
            return None

        with torch.random.fork_rng(devices=_devices(args, kwargs)), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), rec:
            out = inner(*args, **kwargs)
        del out, held
        saved = entry.saved
        sizes = [n for n, _, _ in order]
        if sizes != [s.bytes for s in saved]:
            raise ValueError(
                f"ckptplan: {entry.name} saves activations of {sizes} bytes, in that order, but the "
                f"plan lists {[s.bytes for s in saved]}: the model is not the one planned "
                "(plan again from this model)")
        save = set()
        for (_, op, p), s in zip(order, saved):
            if not s.keep or op is None:
                continue
            if rec.mutated.get(p, -1) > op:
                # Selective checkpointing caches an op's output as it is
                # returned; one changed in place afterwards cannot be.
                raise ValueError(
                    f"ckptplan: {entry.name}: the plan keeps {s.name}, which the layer changes in place "
                    "after making it, so selective checkpointing cannot keep it: plan again with this "
                    "version of ckptplan, or with --solver optimal")
            save.add(op)
        return cls(frozenset(save), entry.name)

    def contexts(self):
        """The checkpoint's context_fn: the forward and the recomputation
        number the ops alike, so op i is cached in one and taken in the
        other."""
        cp = torch.utils.checkpoint
        save, count = self.save, {False: 0, True: 0}

        def policy(ctx, func, *args, **kwargs):
            r = bool(ctx.is_recompute)
            i = count[r]
            count[r] = i + 1
            return cp.CheckpointPolicy.MUST_SAVE if i in save else cp.CheckpointPolicy.PREFER_RECOMPUTE

        return cp.create_selective_checkpoint_contexts(policy)


def _autocasting(args) -> bool:
    """Whether torch.autocast is on for the device of the layer's input."""
    x = next((t for t in tree_leaves(args) if isinstance(t, torch.Tensor)), None)
    device = x.device.type if x is not None else "cpu"
    try:
        return torch.is_autocast_enabled(device)
    except TypeError:  # PyTorch before 2.4 takes no device
        return torch.is_autocast_cpu_enabled() if device == "cpu" else torch.is_autocast_enabled()


def _devices(args, kwargs) -> list[int]:
    return sorted({t.get_device() for t in tree_leaves((args, kwargs))
                   if isinstance(t, torch.Tensor) and t.is_cuda})
