"""The whole step under FSDP2 (``--zero 3``), measured by the CPU allocator.

Ranks of a gloo group train test_step_peak's Llama (fp32) under FSDP2's
fully_shard, each decoder layer and then the model passed to it, for three
steps under the profiler; rank 0 reports the most its CPU allocator held
in the forward, the backward and the optimizer step of the third. The
plan (``--dp N --zero 3``) counts what FSDP2 gathers and reduce-scatters
at its moments (costmodel.Gather): the root's unsharded weights and one
all-gather output through the forward and backward (none in the first
layer's backward, which has no layer to prefetch), a layer's unsharded
weights while it runs, the reduce-scatter input of the layer after it
through its backward, its unsharded gradients as autograd makes them;
the root's unsharded gradients from the backward that makes each; and
the rank's shard of each group's gradients from the reduce-scatter that
makes it (a layer's in its backward, the root's when the backward ends)
to the optimizer step, as FSDP2 frees them all at zero_grad
(costmodel.ShardsInBackward; DeepSpeed's stage 3 keeps them in a flat
buffer the whole step, ``--sharding deepspeed``).

Checkpointing is torch.utils.checkpoint's non-reentrant variant, as
ckptplan's exports and transformers 5 set it: its recomputation runs no
FSDP2 hook. (The reentrant one, transformers 4's default, gathers a layer
again when it recomputes it, and its backward prefetches miss: each holds
an output buffer, one more for each layer done, until the backward ends.)

What FSDP2 holds on the CPU that the plan does not count: the step
counters' increments (12 bytes, test_optimizer_step; 20 under 2.7's
for-loop over DTensors); gloo's temporaries, one of a collective's output
size while it runs (never at a peak here); and, at times, what gloo's
work objects keep of a reduce-scatter past the backward and into the
optimizer step or the next step (NCCL reduce-scatters in place): its
input and gloo's copy of it, a layer's or the root's, run to run none,
one, three, or the root's two and a layer's. The ranks meet at barriers
after each backward, which makes that rarer (and holds a byte under
PyTorch 2.7). From PyTorch 2.9 FSDP2 gathers nothing on one rank: there
the plan is over by the one output buffer it counts (a layer's bytes)
wherever one would be held.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ckptplan  # noqa: E402
from test_fsdp2_export import FSDP2  # noqa: E402
from test_step_peak import BATCH, SEQ, VOCAB, _part, _slack, build  # noqa: E402

pytestmark = FSDP2


def _worker(rank: int, port: int, ranks: int, impl: str, checkpointing: bool, lora: int, micro: int, reshard: str,
            out: str) -> None:
    """One of ranks ranks training the Llama under FSDP2 with AdamW (impl:
    fused, foreach or forloop) for three steps, under the profiler from
    before the model is made, each layer resharded after its forward but
    the last where reshard is all-but-last; rank 0 writes the most its CPU
    allocator held in each part of the third."""
    import json
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from allocator_events import part_peaks, profiled_steps

    if lora:
        import peft  # noqa: F401 (its import makes tensors of its own: before the profiler)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=ranks)

    def setup():
        model = build(lora)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        layers = _layers(model)
        for k, layer in enumerate(layers):
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard == "all" or k < len(layers) - 1)
        fully_shard(model, mesh=mesh)
        kwargs = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, **kwargs)
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
        return model, optimizer, {"input_ids": ids, "labels": ids.clone()}

    def barriers():
        for _ in range(4 if ranks > 1 else 0):
            dist.barrier()  # gloo's worker threads run again

    try:
        mesh = init_device_mesh("cpu", (ranks,))
        prof, _ = profiled_steps(setup, after_backward=barriers, micro=micro)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(part_peaks(prof, 2), f)


def _layers(model) -> list:
    """The model's decoder layers, under PEFT's wrappers too."""
    return ckptplan.layers.decoder_layers(model)


def _sizes(lora: int = 0) -> tuple[int, int]:
    """From the model itself: the unsharded bytes of a decoder layer and
    of the root (the embedding, the final norm, the head)."""
    model = build(lora)
    whole = sum(p.numel() for p in model.parameters()) * 4
    layer = sum(p.numel() for p in _layers(model)[0].parameters()) * 4
    return layer, whole - len(_layers(model)) * layer


def measure(tmp_path, ranks: int, impl: str, checkpointing: bool, lora: int = 0,
            micro: int = 1, reshard: str = "all") -> tuple[dict, "ckptplan.Plan"]:
    """FSDP2's peaks on ranks ranks and the plan's, storing everything or
    (checkpointing) checkpointing every layer: gradient checkpointing, the
    plan's every-k; with LoRA adapters of rank lora when not 0; with micro
    micro-batches a step (the peaks of the forward and backward of the
    last); the layers resharded after their forward as reshard says (all,
    or all-but-last)."""
    from test_deepspeed_zero3 import spawn

    measured = spawn(tmp_path, "test_fsdp2_step", ranks, impl, checkpointing, lora, micro, reshard, ranks=ranks)
    plan = ckptplan.plan(build(lora), "1GiB", batch=BATCH, seq=SEQ, solver="every-k" if checkpointing else "none",
                         optimizer=f"adamw-{impl}", extra_args=("--dp", str(ranks), "--zero", "3", "--grad-accum", str(micro),
                                                                "--reshard", reshard))
    assert {layer.mode for layer in plan.layers} == {"checkpoint" if checkpointing else "store"}
    print(f"{ranks} rank(s), {impl}{', checkpointed' if checkpointing else ''}{f', LoRA {lora}' if lora else ''}"
          f"{f', {micro} micro-batches' if micro > 1 else ''}: "
          f"measured {measured}; plan {plan.peak_bytes} at {plan.peak_at}, step {plan.step_peak_bytes}")
    return measured, plan


def _gathers_nothing_alone() -> bool:
    """Whether FSDP2 gathers nothing on one rank: PyTorch 2.9 and later
    copy each group's shard into its unsharded weights, with no
    all-gather output."""
    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    return (major, minor) >= (2, 9)


def _host_alive(plan) -> int:
    """The host bytes the step still holds at the plan's peak: in a
    layer's backward those of that layer and the ones before it (the
    random-number state each checkpointed layer stashes until its
    backward has run), elsewhere every stage's."""
    at = plan.peak_at
    if not at.startswith("backward of layers."):
        return plan.host_bytes
    k = int(at.rsplit(".", 1)[1])
    return sum(layer.host_bytes for layer in plan.layers if int(layer.name.rsplit(".", 1)[1]) <= k)


def _exact(excess: int, kept: int, layer: int, root: int) -> bool:
    """Whether a peak excess bytes over the plan's is the plan's: none, or
    whole buffers gloo kept (_gloo_kept) and kept into the optimizer step
    too, kept bytes over the plan's step (what it kept of the layers'
    reduce-scatters after the peak the step shows as well, so the
    backward's peak holds at most that much)."""
    return excess == 0 or 0 < excess <= kept + 1 and _gloo_kept(excess, layer, root)


def _gloo_kept(over: int, layer: int, root: int) -> bool:
    """Whether over bytes are what gloo's work objects may keep of
    reduce-scatters past their backward (the module's docstring): whole
    inputs and copies, up to three a layer's and two the root's, and the
    barriers' byte."""
    return any(over - extra == a * layer + b * root for a in range(4) for b in range(3) for extra in (0, 1))


@pytest.mark.parametrize("impl,checkpointing,lora,reshard", [
    ("fused", False, 0, "all"), ("forloop", False, 0, "all"), ("foreach", False, 0, "all"), ("fused", True, 0, "all"),
    ("fused", False, 8, "all"), ("fused", True, 8, "all"),
    ("fused", False, 0, "all-but-last"), ("fused", True, 0, "all-but-last")])
def test_fsdp2_step(ckptplan_binary, tmp_path, impl, checkpointing, lora, reshard):
    """On one rank, FSDP2 all-gathers and reduce-scatters every group as
    on several, each layer resharded after its forward, or each but the
    last (all-but-last, torchtitan 0.1's default policy: the last layer's
    weights stay gathered through the head's forward and the loss, which
    on transformers 4 holds the stored step's peak, a layer's weights
    above every layer resharded; --reshard all-but-last): storing
    everything, full fine-tuning or LoRA, the step's
    peak falls where the plan says and is the plan's (but for what the
    module's docstring says) and for what storing
    everything on one rank leaves out (test_step_peak._slack), and the
    optimizer step is the plan's but for the counters; checkpointing
    every layer, the peak is in the backward of the layer the plan says,
    and the plan's to the byte, but for the random-number states the
    layers not yet done hold in host memory. (On a loaded machine gloo may
    keep reduce-scatter inputs into the step and the next forward: the
    module's docstring; from PyTorch 2.9 one rank gathers nothing.)"""
    measured, plan = measure(tmp_path, 1, impl, checkpointing, lora, reshard=reshard)
    layer, root = _sizes(lora)
    counters = (12, 20) if impl == "forloop" else (12,)
    gloo = 2 * root + 3 * layer + 1  # as on two ranks (test_fsdp2_step_two_ranks)
    assert any(0 <= measured["step"] - plan.step_peak_bytes - c <= gloo for c in counters), measured
    part = max(measured, key=measured.get)
    assert part == _part(plan.peak_at), (part, plan.peak_at)
    if checkpointing:
        # What gloo kept of the backward's reduce-scatters into the step
        # (a layer's inputs or two: 738,304 bytes each here), it held at
        # the backward's peak too.
        kept = measured["step"] - plan.step_peak_bytes - counters[0]
        excess = measured[part] - plan.peak_bytes - _host_alive(plan)
        if _gathers_nothing_alone():
            # The layer's prefetched output buffer the plan counts; the
            # peak falls in the first layer's backward, which has none,
            # and the plan's in a later one, which does: over by less.
            assert 0 <= -excess <= layer, (measured, kept, excess)
        else:
            assert _exact(excess, kept, layer, root), (measured, kept, excess)
        return
    # What gloo may keep of a step's reduce-scatters into the next step's
    # forward: whole groups' trained gradients, layers' and the root's (the
    # module's docstring).
    model = build(lora)
    trained = sum(p.numel() for p in _layers(model)[0].parameters() if p.requires_grad) * 4
    root_trained = sum(p.numel() for p in model.parameters() if p.requires_grad) * 4 - len(_layers(model)) * trained
    kept = {-k * trained - r * root_trained for k in range(len(_layers(model)) + 1) for r in (0, 1)}
    # From 2.9 one rank holds no output buffer where the plan's peak
    # falls: the head's backward (transformers 5; 4's is in the head's
    # forward, which holds the last layer's).
    alone = layer if _gathers_nothing_alone() and part == "backward" else 0
    assert _slack(plan, measured[part]) - alone in kept


@pytest.mark.parametrize("checkpointing", [False, True])
def test_fsdp2_step_two_ranks(ckptplan_binary, tmp_path, checkpointing):
    """On two ranks the plan shards as FSDP2 does: storing everything or
    checkpointing every layer, the part of the step where the plan's peak
    falls holds the plan's peak to the byte, and the optimizer step the
    plan's but for the counters, each with what gloo may keep (the
    module's docstring) and the random-number states of the layers not
    yet done."""
    measured, plan = measure(tmp_path, 2, "fused", checkpointing)
    layer, root = _sizes()
    gloo = 2 * root + 3 * layer + 1
    # Where the plan's peak falls; the other part holds less, but for what
    # gloo kept there, which can be more than it kept at the peak.
    part = _part(plan.peak_at)
    other = "forward" if part == "backward" else "backward"
    # What gloo kept: whole buffers as a rule (_gloo_kept), but on a
    # loaded machine its two ranks have held part of one at the peak too
    # (840,256 B once, checkpointed on PyTorch 2.15): up to its bound.
    assert 0 <= measured[part] - plan.peak_bytes - _host_alive(plan) <= gloo, measured
    assert measured[other] <= plan.peak_bytes + plan.host_bytes + gloo, measured
    assert 0 <= measured["step"] - (plan.step_peak_bytes + 12) <= gloo


@pytest.mark.parametrize("checkpointing", [False, True])
def test_fsdp2_step_accumulated(ckptplan_binary, tmp_path, checkpointing):
    """Over two micro-batches a step FSDP2 reduce-scatters each backward's
    gradients and adds them into the shards the step holds: in the second
    micro-batch, storing everything or checkpointing every layer, the
    peak falls where the plan says and is the plan's to the byte, but for
    the random-number states of the layers not yet done and what gloo may
    keep (the module's docstring)."""
    measured, plan = measure(tmp_path, 1, "fused", checkpointing, micro=2)
    layer, root = _sizes()
    part = max(measured, key=measured.get)
    assert part == _part(plan.peak_at), (part, plan.peak_at)
    kept = measured["step"] - plan.step_peak_bytes - 12
    excess = measured[part] - plan.peak_bytes - _host_alive(plan)
    if _gathers_nothing_alone():
        # One rank gathers nothing: a layer's output buffer below the plan.
        assert _exact(excess + layer, kept, layer, root), (measured, kept, excess)
    else:
        assert _exact(excess, kept, layer, root), (measured, kept, excess)
