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
from torch.utils._pytree import tree_leaves

from . import versions
from ._sac import SacPolicy, layer_input_shape, sac_available
from .layers import decoder_layers
from .plan import MODES, Plan

_ATTR = "_ckptplan_plan"


def apply(model: nn.Module, plan: Plan, *, layers: Optional[nn.ModuleList] = None) -> dict[str, int]:
    """Make each decoder layer of model run as plan says; returns how many
    layers got each mode.

    Raises ValueError when the plan is for another number of layers, does
    not fit its budget, or has a selective layer and this PyTorch has no
    selective checkpointing.
    """
    versions.check()
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
        self.policy: Optional[SacPolicy] = None
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
            saved = [(s.name, s.bytes, s.keep) for s in self.entry.saved]
            self.policy = SacPolicy.for_layer(self.inner, self.layer, args, kwargs, self.entry.name,
                                              self.entry.policy, saved)
            if _autocasting(args):
                torch.clear_autocast_cache()  # the probe's casts
        return torch.utils.checkpoint.checkpoint(
            fn, *args, use_reentrant=False, context_fn=self.policy.contexts)

    def _check_shapes(self, args, kwargs) -> None:
        got = layer_input_shape(args, kwargs)
        if got is None:
            return
        want = (self.plan.batch, self.plan.seq)
        if None not in want and got != want:
            raise ValueError(
                f"ckptplan: {self.entry.name} was planned for batch {want[0]} and sequence {want[1]} "
                f"but is called with batch {got[0]} and sequence {got[1]}: its kept tensors and "
                "recompute differ with the shape; plan again for these shapes (ckptplan.plan(..., "
                f"batch={got[0]}, seq={got[1]}))")


def _autocasting(args) -> bool:
    """Whether torch.autocast is on for the device of the layer's input."""
    x = next((t for t in tree_leaves(args) if isinstance(t, torch.Tensor)), None)
    device = x.device.type if x is not None else "cpu"
    try:
        return torch.is_autocast_enabled(device)
    except TypeError:  # PyTorch before 2.4 takes no device
        return torch.is_autocast_cpu_enabled() if device == "cpu" else torch.is_autocast_enabled()

