"""The whole step's memory on a CUDA GPU, measured by the caching allocator.

test_step_peak measures one training step on the CPU allocator; this runs
the same steps on a GPU, where other kernels run (flash and
memory-efficient sdpa, cuBLAS, AdamW's CUDA kernels) and the plan is made
for them. The caching allocator rounds each block up to 512 bytes, so the
measure is its count of the bytes asked for (``requested_bytes``), which
it keeps beside the rounded count: at each part's end (forward with the
loss, backward, optimizer step) its peak over what the step began with,
less what the allocator held then that is no tensor of the step (cuBLAS's
workspaces, made in the warm-up step). Skipped, saying so, where PyTorch
sees no GPU (CI has none; docs/validation.md records the runs).

Set CKPTPLAN_RECORD to a file to append each case's figures to it as JSON
lines.
"""
from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ckptplan  # noqa: E402

from test_step_peak import SEQ, VOCAB, _part, build, train_step  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch sees no CUDA GPU")

BATCH = 2


def _requested() -> tuple[int, int]:
    """The bytes the caching allocator's live blocks were asked for, and
    the most since its peak was last reset."""
    s = torch.cuda.memory_stats()
    return s["requested_bytes.all.current"], s["requested_bytes.all.peak"]


def cuda_step_peaks(model, optimizer, batch, micro: int = 1) -> dict[str, int]:
    """The most bytes each part of one step ("forward", "backward",
    "step") holds on the GPU, what the step starts with (weights,
    buffers, optimizer state, inputs, each storage once) included and the
    allocator's other blocks (cuBLAS's workspaces) not; a warm-up step
    first makes the optimizer state and the workspaces."""
    train_step(model, optimizer, batch, micro)
    torch.cuda.synchronize()
    held = [*model.parameters(), *model.buffers(), *batch.values()]
    held += [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in held if t.is_cuda}
    start = sum(storages.values())
    current, _ = _requested()
    other = current - start
    assert other >= 0, (current, start)
    state = {"part": "before"}
    peaks: dict[str, int] = {}

    def mark(name):
        _, peak = _requested()
        part = state["part"]
        peaks[part] = max(peaks.get(part, 0), peak - other)
        torch.cuda.reset_peak_memory_stats()
        state["part"] = name

    hooks = [model.register_forward_pre_hook(lambda *a: mark("forward")),
             model.register_forward_hook(lambda *a: mark("backward")),
             optimizer.register_step_pre_hook(lambda *a: mark("step")),
             optimizer.register_step_post_hook(lambda *a: mark("after"))]
    torch.cuda.reset_peak_memory_stats()
    try:
        train_step(model, optimizer, batch, micro)
        torch.cuda.synchronize()
    finally:
        for h in hooks:
            h.remove()
    mark("end")
    end, _ = _requested()
    assert end == current, f"the step ends holding {end - current} bytes more than it started with"
    return peaks


def _record(case: str, **figures) -> None:
    path = os.environ.get("CKPTPLAN_RECORD")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"case": case, "device": torch.cuda.get_device_name(),
                                "torch": torch.__version__, "transformers": transformers.__version__,
                                **figures}) + "\n")


def _setup(lora: int, micro: int, dtype: str, attention: str = "sdpa", **adamw):
    model = build(lora, dtype, attention).cuda()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, **adamw)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), device="cuda")
    extra = ("--grad-accum", str(micro)) if micro > 1 else ()
    return model, optimizer, {"input_ids": ids, "labels": ids.clone()}, extra


def _measure(case: str, model, optimizer, plan, batch, micro: int) -> tuple[int, str, dict]:
    peaks = cuda_step_peaks(model, optimizer, batch, micro)
    peaks.pop("before", None)
    peaks.pop("after", None)
    part = max(peaks, key=peaks.get)
    print(f"{case}: measured {peaks} (peak in the {part}); plan {plan.peak_bytes} at {plan.peak_at}, "
          f"step {plan.step_peak_bytes}: {plan.peak_bytes - peaks[part]:+d} bytes")
    _record(case, measured=peaks, part=part, plan_peak=plan.peak_bytes, plan_at=plan.peak_at,
            plan_step=plan.step_peak_bytes, plan_static=plan.static_bytes)
    return peaks[part], part, peaks


# (name, LoRA rank, micro-batches a step accumulates gradients over, dtype,
# attention)
SETUPS = [("full", 0, 1, "fp32", "sdpa"), ("lora", 8, 1, "fp32", "sdpa"), ("accumulate", 0, 2, "fp32", "sdpa"),
          ("bf16", 0, 1, "bf16", "sdpa"), ("bf16-lora", 8, 1, "bf16", "sdpa"),
          ("eager", 0, 1, "fp32", "eager"), ("eager-bf16", 0, 1, "bf16", "eager")]


@pytest.mark.parametrize("impl,kwargs", [("adamw-foreach", {"foreach": True}),
                                          ("adamw-fused", {"fused": True}),
                                          ("adamw-forloop", {"foreach": False})])
def test_cuda_optimizer_step(ckptplan_binary, impl, kwargs):
    """The optimizer step on the GPU holds what the plan says, to the
    byte: the weights, AdamW's moments (and the fused kernel's step
    counters, on the GPU), every gradient, the inputs and the working
    memory of its implementation."""
    model, optimizer, batch, _ = _setup(0, 1, "fp32", **kwargs)
    assert ckptplan.optimizer_name(optimizer) == impl
    plan = ckptplan.plan(model, "1GiB", batch=BATCH, seq=SEQ, solver="none", optimizer=optimizer)
    _, _, peaks = _measure(f"step {impl}", model, optimizer, plan, batch, 1)
    assert peaks["step"] == plan.step_peak_bytes, (peaks, plan.step_peak_bytes)


@pytest.mark.parametrize("name,lora,micro,dtype,attention", SETUPS)
def test_cuda_whole_step_store_everything(ckptplan_binary, name, lora, micro, dtype, attention):
    """Storing everything, the step's GPU peak is the plan's to the byte
    and falls where the plan says: the positions the model makes, and
    eager attention's causal mask, are freed with the forward in both,
    and nll_loss's count of targets before log_softmax's backward
    (test_step_peak)."""
    model, optimizer, batch, extra = _setup(lora, micro, dtype, attention, fused=True)
    plan = ckptplan.plan(model, "1GiB", batch=BATCH, seq=SEQ, solver="none", optimizer=optimizer, extra_args=extra)
    measured, part, _ = _measure(f"store {name}", model, optimizer, plan, batch, micro)
    assert part == _part(plan.peak_at), (part, plan.peak_at)
    assert plan.peak_bytes == measured


@pytest.mark.parametrize("share", [80, 60])
@pytest.mark.parametrize("name,lora,micro,dtype,attention", SETUPS)
def test_cuda_whole_step_planned(ckptplan_binary, name, lora, micro, dtype, attention, share):
    """A plan below storing everything, applied on the GPU: the step's
    peak is the plan's, where sdpa runs a fused kernel and the peak is the
    head's.

    Where sdpa runs its math path (fp32 with grouped K and V: the
    memory-efficient kernel takes no enable_gqa), the peak falls in the
    last layer's attention backward, in _safe_softmax's backward, whose
    CUDA kernel multiplies the gradient by the output into a
    scores-sized temporary (the plan counts it: before it did, the step
    measured 473,600 bytes over the plan here). There the plan holds what
    PyTorch holds, to the byte, as on the CPU
    (test_step_peak.test_whole_step_peak_in_a_layer); and so where eager
    attention's peak falls there (test_step_peak.test_whole_step_eager).
    """
    model, optimizer, batch, extra = _setup(lora, micro, dtype, attention, fused=True)
    store = ckptplan.plan(model, "1GiB", batch=BATCH, seq=SEQ, solver="none", optimizer=optimizer, extra_args=extra)
    budget = store.static_bytes + (store.peak_bytes - store.static_bytes) * share // 100
    plan = ckptplan.plan(model, budget, batch=BATCH, seq=SEQ, optimizer=optimizer, extra_args=extra)
    assert plan.peak_bytes < store.peak_bytes
    ckptplan.apply(model, plan)
    measured, part, _ = _measure(f"planned {name} {share}%", model, optimizer, plan, batch, micro)
    assert part == _part(plan.peak_at), (part, plan.peak_at)
    assert plan.peak_bytes == measured


@pytest.mark.parametrize("share", [100, 65])
def test_cuda_whole_step_larger(ckptplan_binary, share):
    """A larger Llama in bf16 (hidden 1024, 8 layers, sequence 2048,
    batch 4), where sdpa runs the flash kernel: stored, and planned at
    65% of the activations (the least it fits is 55%), the plan's
    peak to the byte."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                   num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                                   max_position_embeddings=4096, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).cuda()
    model.config.use_cache = False
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(0, 32000, (4, 2048), device="cuda")
    batch = {"input_ids": ids, "labels": ids.clone()}
    store = ckptplan.plan(model, "80GiB", batch=4, seq=2048, solver="none", optimizer=optimizer)
    plan = store
    if share < 100:
        budget = store.static_bytes + (store.peak_bytes - store.static_bytes) * share // 100
        plan = ckptplan.plan(model, budget, batch=4, seq=2048, optimizer=optimizer)
        ckptplan.apply(model, plan)
    measured, part, _ = _measure(f"larger {share}%", model, optimizer, plan, batch, 1)
    assert part == _part(plan.peak_at), (part, plan.peak_at)
    assert plan.peak_bytes == measured
