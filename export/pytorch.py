"""ckptplan PyTorch runtime: applies PLAN to a model's transformer layers.

Call apply_plan(layers) once, after building the model and before training,
with the model's transformer layers in order (model.model.layers for a
Hugging Face Llama, model.transformer.h for GPT-2). Each layer then runs as
the plan says (the runtime above). Works with PyTorch 1.13 and 2.x.
"""


def apply_plan(layers, plan=None):
    """Make each of layers run as the matching entry of plan["layers"] says.

    plan defaults to this module's PLAN. Sets each layer's forward (an
    instance attribute; applying a plan again starts from the forward the
    layer had before the first). Returns how many layers got each mode.
    """
    if plan is None:
        plan = PLAN  # noqa: F821 (defined above this text in the exported module)
    layers = list(layers)
    entries = [LayerPlan.from_dict(e) for e in plan["layers"]]  # noqa: F821 (the runtime, above)
    if len(layers) != len(entries):
        raise ValueError(
            f"the plan for {plan.get('model', 'the model')} has {len(entries)} layers "
            f"but {len(layers)} were given: pass the model's transformer layers, in order")
    counts = check_modes(entries, rerun=True)  # noqa: F821
    shape = (plan.get("batch"), plan.get("seq"))
    retry = "export a plan for these shapes (ckptplan export ... --batch {batch} --seq {seq})"
    for layer, e in zip(layers, entries):
        run = None if e.mode == "store" else LayerRun(e, shape, rerun=True, retry=retry)  # noqa: F821
        set_forward(layer, run)  # noqa: F821
    return counts
