"""Applying a plan to a live model: each decoder layer runs as the plan says.

``apply(model, plan)`` sets each decoder layer's forward (an instance
attribute; applying again starts from the forward the layer had before) to
run as the plan says, through the runtime the exported modules carry too
(``_runtime``, a link to export/runtime.py):

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

A plan is for a batch and sequence length, and runs any call up to them:
an epoch's short last batch, the batches a data collator pads to their
longest sequence. A plan of ckptplan.plan's is planned again for each
other shape and padding the model is called with (its forward's
attention mask, or positions that restart, say whether a batch is padded), with the same settings
and the planned peak as its budget, once each (the binary plans in a
fraction of a second): the call holds no more than the plan says. Where
no such plan fits (or the plan was read from JSON), the call runs with
the planned decisions, each selective layer checked to save as many
activations as planned, none larger (the same ops, each on a smaller
tensor), or else checkpointed whole. A call beyond the planned shape
fails with a message saying so (plan again for it), or where apply is
told beyond="replan", runs a plan of its own shape within the plan's
budget.

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
import warnings
from typing import Iterator, Optional

import torch
import torch.nn as nn

from . import versions
from ._binary import CkptplanError, CkptplanUsageError
from ._runtime import LayerPlan, LayerRun, Planned, check_modes, set_forward
from ._sac import _probe
from ._sac import sac_available  # noqa: F401 (ckptplan.sac_available)
from .layers import decoder_layers
from .plan import Plan

_ATTR = "_ckptplan_plan"
_HOOK = "_ckptplan_hook"  # the forward pre-hook that sees whether a batch is padded


def apply(model: nn.Module, plan: Plan, *, layers: Optional[nn.ModuleList] = None,
          beyond: str = "error") -> dict[str, int]:
    """Make each decoder layer of model run as plan says; returns how many
    layers got each mode.

    beyond says what a call with a larger batch or sequence than planned
    does: "error" (the default) raises ValueError saying to plan again;
    "replan" plans that shape within the plan's budget (once, in a
    fraction of a second) and runs it, raising CkptplanError where nothing
    fits the budget then.

    Raises ValueError when the plan is for another number of layers, does
    not fit its budget, or has a selective layer and this PyTorch has no
    selective checkpointing.
    """
    if beyond not in ("error", "replan"):
        raise CkptplanUsageError(f'ckptplan.apply: beyond is "error" or "replan", not {beyond!r}')
    if not isinstance(plan, Plan):
        raise CkptplanUsageError(
            f"ckptplan.apply: plan is a ckptplan.Plan (from ckptplan.plan, or Plan.from_json of an exported "
            f"plan), not {type(plan).__name__}")
    if not isinstance(model, nn.Module):
        raise CkptplanUsageError(f"ckptplan.apply: model is a torch.nn.Module, not {type(model).__name__}")
    versions.check()
    if _hf_checkpointing(model):
        # transformers 5.23 renamed gradient_checkpointing_disable and
        # TrainingArguments' gradient_checkpointing, deprecated aliases
        # until 6.
        term = "activation" if hasattr(model, "activation_checkpointing_disable") else "gradient"
        raise CkptplanUsageError(
            "ckptplan.apply: transformers' gradient checkpointing is on for this model, and would checkpoint "
            f"every layer around the plan: call model.{term}_checkpointing_disable() first, and leave "
            f"{term}_checkpointing=False in TrainingArguments")
    layers = decoder_layers(model) if layers is None else layers
    if not plan.feasible:
        raise ValueError(f"the plan does not fit its budget of {plan.budget_bytes} bytes: nothing to apply")
    need = plan.runtime_peak_bytes + plan.reserve_bytes
    if plan.runtime_peak_bytes and need > plan.budget_bytes:
        raise CkptplanError(
            f"ckptplan.apply: run layer by layer, as apply runs it, the plan peaks at {plan.runtime_peak_bytes} "
            f"bytes, past its budget of {plan.budget_bytes} (a plan for a nested runtime): plan again with "
            f"ckptplan.plan, or with a budget of at least {need}", 1, kind="infeasible", min_budget_bytes=need)
    if len(layers) != len(plan.layers):
        raise ValueError(
            f"the plan has {len(plan.layers)} layers but the model has {len(layers)}: "
            "it was made for another model")
    entries = _entries(plan)
    counts = check_modes(entries, hint=": plan with --solver optimal, which checkpoints whole layers")
    shape = (plan.batch, plan.seq)
    retry = "plan again for these shapes (ckptplan.plan(..., batch={batch}, seq={seq}))"
    if beyond == "replan" and plan.replan is None:
        raise CkptplanUsageError(
            'ckptplan.apply: beyond="replan" needs a plan ckptplan.plan made (one read from JSON cannot plan '
            'again)')
    others = _Others(plan, entries) if plan.replan is not None else None
    for i, (layer, e) in enumerate(zip(layers, entries)):
        if e.mode == "store" and others is None:
            set_forward(layer, None)
        else:
            set_forward(layer, LayerRun(e, shape, retry=retry, others=None if others is None else others.layer(i),
                                        beyond=beyond == "replan"))
    hook = getattr(model, _HOOK, None)
    if hook is not None:
        hook.remove()
    if others is not None:
        setattr(model, _HOOK, model.register_forward_pre_hook(others.see, with_kwargs=True))
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "use_cache", False):
        # Training needs no key/value cache; it would hold every layer's
        # keys and values across the step.
        config.use_cache = False
    setattr(model, _ATTR, plan)
    return counts


class _Others:
    """The plans of one request (Plan.replan) for the batches the model is
    called with: for each shape up to the planned one, padded or not (the
    model's forward sees its attention mask: see), the planned plan where
    it is the planned batch, else one made once, within the planned peak;
    None for a batch none fits (the call then runs the planned
    decisions)."""

    def __init__(self, plan: Plan, entries: list[LayerPlan]) -> None:
        self.plan, self.layers = plan, len(entries)
        self.padded = plan.padded  # whether the call the layers run in brings padding
        key = ((plan.batch, plan.seq), plan.padded)
        self.entries: dict[tuple[tuple[int, int], bool], Optional[list[LayerPlan]]] = {key: entries}

    def see(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """The model's forward pre-hook: whether its batch is padded (an
        attention mask with a zero in it, or positions that restart)."""
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        self.padded = isinstance(mask, torch.Tensor) and mask.dim() == 2 and not bool(mask.all())
        if mask is None:
            # A row of sequences end to end (a padding-free collator's),
            # its positions restarting at each: masked as a padded batch.
            at = kwargs.get("position_ids")
            self.padded = isinstance(at, torch.Tensor) and at.dim() == 2 and bool((at.diff(dim=1) != 1).any())

    def layer(self, i: int):
        """Layer i's entry of the plan for a (batch, seq), or None."""
        def entry(shape):
            entries = self.of(shape)
            return None if entries is None else entries[i]
        return entry

    def of(self, shape: tuple[int, int]) -> Optional[list[LayerPlan]]:
        key = (shape, self.padded)
        if key not in self.entries and (shape[0] > self.plan.batch or shape[1] > self.plan.seq):
            # Beyond the planned shape (apply's beyond="replan"): a plan of
            # its own within the budget, or the binary's error.
            with _probe(), torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
                p = self.plan.replan(*shape, budget=self.plan.budget_bytes, padded=self.padded)
            if not p.feasible or len(p.layers) != self.layers:
                raise CkptplanError(
                    f"ckptplan: no plan of batch {shape[0]} and sequence {shape[1]} fits the budget of "
                    f"{p.budget_bytes} bytes (the plan was for batch {self.plan.batch} and sequence "
                    f"{self.plan.seq})", 1, kind="infeasible")
            self.entries[key] = _entries(p)
        if key not in self.entries:
            # Made inside the first layer's call, where describing the
            # model (which asks PyTorch's sdpa which kernel it runs, on a
            # few kilobytes) must be no part of the step: outside the
            # dispatch modes and saved-tensor hooks around the call (a
            # FLOP counter, a memory tracker).
            with _probe(), torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
                try:
                    p = self.plan.replan(*shape, budget=self.plan.peak_bytes + self.plan.reserve_bytes,
                                         padded=self.padded)
                except CkptplanError as err:
                    if err.kind != "infeasible":
                        raise
                    p = None
            ok = p is not None and p.feasible and len(p.layers) == self.layers and p.peak_bytes <= self.plan.peak_bytes
            self.entries[key] = _entries(p) if ok else None
            if not ok and self.padded and not self.plan.padded:
                warnings.warn(
                    f"ckptplan: a padded batch (batch {shape[0]}, sequence {shape[1]}) holds more than the plan, made "
                    "for batches without padding, says: plan with padded=True (prepare_trainer does where the data "
                    "has shorter sequences)", stacklevel=2)
        return self.entries[key]


def _entries(plan: Plan) -> list[LayerPlan]:
    """The runtime's entries of plan's layers."""
    return [LayerPlan(e.name, e.mode, [(s.name, s.bytes, s.keep) for s in e.saved], e.policy) for e in plan.layers]


def _hf_checkpointing(model: nn.Module) -> bool:
    """Whether transformers' gradient checkpointing is on in model: a
    module of it with its gradient_checkpointing flag set (what
    gradient_checkpointing_enable sets)."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def applied(model: nn.Module) -> Optional[Plan]:
    """The plan last applied to model, or None."""
    return getattr(model, _ATTR, None)


@contextlib.contextmanager
def suspended(model: nn.Module) -> Iterator[None]:
    """Run model without its plan inside the block (every layer stored)."""
    layers = decoder_layers(model)
    planned = [(layer, layer.forward) for layer in layers if isinstance(layer.forward, Planned)]
    for layer, p in planned:
        layer.forward = p.inner
    try:
        yield
    finally:
        for layer, p in planned:
            layer.forward = p
