"""ckptplan FSDP2 runtime: applies PLAN to a model before fully_shard.

Call apply_plan(model) once, after building the model and before sharding
it, the way torchtitan applies activation checkpointing:

    apply_plan(model)                   # wraps the planned layers in place
    for layer in model.model.layers:    # GPT-2: model.transformer.h
        fully_shard(layer)
    fully_shard(model)

apply_plan calls torch.distributed's apply_activation_checkpointing on the
model's decoder layers with a check_fn that picks each layer the plan does
not store (checkpointed or selective), and wraps each in checkpoint_wrapper
(non-reentrant) whose checkpoint_fn runs the layer as the runtime above
says; a stored layer is left alone. A plan is for one
batch and sequence length: a call with other shapes fails with a message
saying so. Needs PyTorch 2.4 or later.
"""
import functools

from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)


def apply_plan(model, plan=None):
    """Wrap each decoder layer of model (or of the nn.ModuleList model) as
    plan["layers"] says; returns how many layers got each mode.

    plan defaults to this module's PLAN. Apply it before fully_shard: the
    wrappers are what fully_shard then shards, layer by layer.
    """
    if plan is None:
        plan = PLAN  # noqa: F821 (defined above this text in the exported module)
    layers = decoder_layers(model)  # noqa: F821 (layers.py, above)
    entries = [LayerPlan.from_dict(e) for e in plan["layers"]]  # noqa: F821 (the runtime, above)
    if len(layers) != len(entries):
        raise ValueError(
            f"the plan for {plan.get('model', 'the model')} has {len(entries)} layers "
            f"but the model has {len(layers)}: it was made for another model")
    if any(type(layer).__name__.startswith("FSDP") for layer in layers):
        raise ValueError("the layers are already sharded: apply the plan before fully_shard")
    counts = check_modes(entries)  # noqa: F821
    shape = (plan.get("batch"), plan.get("seq"))
    retry = "export a plan for these shapes (--batch {batch} --seq {seq})"
    runs = {id(layer): LayerRun(e, shape, retry=retry)  # noqa: F821
            for layer, e in zip(layers, entries) if e.mode != "store"}

    def wrap(layer):
        return checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT,
                                  checkpoint_fn=functools.partial(_checkpoint_fn, runs[id(layer)]))

    apply_activation_checkpointing(layers, checkpoint_wrapper_fn=wrap, check_fn=lambda m: id(m) in runs)
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "use_cache", False):
        # Training needs no key/value cache; a checkpoint's rerun would
        # append to it again.
        config.use_cache = False
    return counts


def _checkpoint_fn(run, layer, *args, **kwargs):
    """checkpoint_wrapper's checkpoint_fn: layer runs as run (a LayerRun) says."""
    return run(layer, layer, args, kwargs)
