"""ckptplan FSDP2 runtime: applies PLAN to a model before fully_shard.

Call apply_plan(model) once, after building the model and before sharding
it, the way torchtitan applies activation checkpointing:

    apply_plan(model)                   # wraps the planned layers in place
    for layer in model.model.layers:    # GPT-2: model.transformer.h
        fully_shard(layer)
    fully_shard(model)

apply_plan calls torch.distributed's apply_activation_checkpointing on the
model's decoder layers with a check_fn that picks each layer the plan does
not store, and wraps each in checkpoint_wrapper (non-reentrant):

  store       left alone: autograd keeps everything the layer saves.
  checkpoint  keeps the layer's inputs and reruns the layer in backward.
  selective   selective activation checkpointing: the wrapper's policy
              caches exactly the op outputs that make the plan's kept
              tensors and recomputes the other ops in backward. The policy
              is found on the layer's first call in training, by running
              its forward once with the ops and saved tensors recorded.

A plan is for one batch and sequence length: a call with other shapes
fails with a message saying so. Needs PyTorch 2.4 or later.
"""
import functools

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)

MODES = ("store", "checkpoint", "selective")


def apply_plan(model, plan=None):
    """Wrap each decoder layer of model (or of the nn.ModuleList model) as
    plan["layers"] says; returns how many layers got each mode.

    plan defaults to this module's PLAN. Apply it before fully_shard: the
    wrappers are what fully_shard then shards, layer by layer.
    """
    if plan is None:
        plan = PLAN  # noqa: F821 (defined above this text in the exported module)
    layers, entries = decoder_layers(model), plan["layers"]
    if len(layers) != len(entries):
        raise ValueError(
            f"the plan for {plan.get('model', 'the model')} has {len(entries)} layers "
            f"but the model has {len(layers)}: it was made for another model")
    if any(type(layer).__name__.startswith("FSDP") for layer in layers):
        raise ValueError("the layers are already sharded: apply the plan before fully_shard")
    modes = {}
    counts = dict.fromkeys(MODES, 0)
    for layer, entry in zip(layers, entries):
        name, mode = entry.get("name", "?"), entry.get("mode")
        if mode not in MODES:
            raise ValueError(f"{name}: unknown mode {mode!r} (valid: {', '.join(MODES)})")
        if mode == "selective" and not sac_available():
            raise ValueError(
                f"{name}: the plan keeps part of this layer, which needs selective activation "
                f"checkpointing (PyTorch >= 2.4; this is {torch.__version__})")
        if mode != "store":
            modes[id(layer)] = entry
        counts[mode] += 1
    shape = (plan.get("batch"), plan.get("seq"))

    def wrap(layer):
        entry = modes[id(layer)]
        run = functools.partial(_run_checkpoint, entry["name"], shape)
        if entry["mode"] == "selective":
            saved = [(s["name"], int(s["bytes"]), bool(s["keep"])) for s in entry["saved"]]
            run = _Selective(entry["name"], shape, layer, entry.get("policy", ""), saved)
        return checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT, checkpoint_fn=run)

    apply_activation_checkpointing(layers, checkpoint_wrapper_fn=wrap, check_fn=lambda m: id(m) in modes)
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "use_cache", False):
        # Training needs no key/value cache; a checkpoint's rerun would
        # append to it again.
        config.use_cache = False
    return counts


def _check_shape(name, shape, args, kwargs):
    got = layer_input_shape(args, kwargs)
    if got is not None and None not in shape and got != tuple(shape):
        raise ValueError(
            f"ckptplan: {name} was planned for batch {shape[0]} and sequence {shape[1]} but is "
            f"called with batch {got[0]} and sequence {got[1]}: what it keeps and recomputes "
            "differs with the shape; export a plan for these shapes (--batch B --seq S)")


def _run_checkpoint(name, shape, layer, *args, **kwargs):
    """checkpoint_wrapper's checkpoint_fn for a checkpointed layer."""
    if torch.is_grad_enabled():
        _check_shape(name, shape, args, kwargs)
    fn = functools.partial(layer, **kwargs) if kwargs else layer
    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)


class _Selective:
    """checkpoint_wrapper's checkpoint_fn for a selective layer: finds the
    policy on the first call in training, then checkpoints with it."""

    def __init__(self, name, shape, layer, policy, saved):
        self.name, self.shape, self.policy_name, self.saved = name, shape, policy, saved
        self.policy = None

    def __call__(self, layer, *args, **kwargs):
        if not torch.is_grad_enabled():
            return layer(*args, **kwargs)
        _check_shape(self.name, self.shape, args, kwargs)
        if self.policy is None:
            self.policy = SacPolicy.for_layer(layer, layer, args, kwargs, self.name, self.policy_name, self.saved)
        fn = functools.partial(layer, **kwargs) if kwargs else layer
        return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False, context_fn=self.policy.contexts)
