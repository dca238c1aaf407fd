"""The whole step's memory, measured by the CPU allocator.

One training step of a small transformers Llama (fp32, CPU, a warm-up step
first so that the optimizer state exists) runs under the profiler with
``profile_memory=True``; the running total of its allocator events, over
what the step starts with (weights, buffers, optimizer state, inputs, each
storage once), is the memory the step holds. Markers from module and
optimizer hooks say which part of the step each event falls in. The step
runs as Hugging Face's Trainer runs it: the model's outputs are dropped
once the loss is taken, before the backward.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ckptplan  # noqa: E402

BATCH, SEQ, VOCAB = 2, 256, 1000


def build() -> "torch.nn.Module":
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                   max_position_embeddings=512, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(cfg)
    model.config.use_cache = False
    return model


def step_peaks(model, optimizer, batch) -> dict[str, int]:
    """The most bytes each part of one step holds ("forward", "backward",
    "step"), on the CPU allocator, what the step starts with included."""
    from torch.profiler import ProfilerActivity, profile

    def run():
        loss = model(**batch).loss
        loss.backward()
        del loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    run()  # the optimizer state
    held = [*model.parameters(), *model.buffers(), *batch.values()]
    held += [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in held}
    start = sum(storages.values())

    def mark(name):
        with torch.profiler.record_function("ckptplan-mark::" + name):
            pass

    hooks = [model.register_forward_pre_hook(lambda *a: mark("forward")),
             model.register_forward_hook(lambda *a: mark("backward")),
             optimizer.register_step_pre_hook(lambda *a: mark("step")),
             optimizer.register_step_post_hook(lambda *a: mark("after"))]
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            run()
    finally:
        for h in hooks:
            h.remove()
    events = sorted(enumerate(prof.profiler.kineto_results.events()), key=lambda x: (x[1].start_ns(), x[0]))
    live, part, peaks = 0, "before", {}
    for _, e in events:
        if e.name().startswith("ckptplan-mark::"):
            part = e.name().split("::", 1)[1]
        elif e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU:
            live += e.nbytes()
            peaks[part] = max(peaks.get(part, 0), start + live)
    assert live == 0, f"the step ends holding {live} bytes more than it started with"
    return peaks


@pytest.mark.parametrize("impl,kwargs", [("adamw-foreach", {"foreach": True}),
                                          ("adamw-fused", {"fused": True}),
                                          ("adamw-forloop", {"foreach": False})])
def test_optimizer_step(ckptplan_binary, impl, kwargs):
    """What the optimizer step holds: the weights, AdamW's moments, every
    gradient, the inputs, and the working memory of its implementation
    (foreach: a square root of every second moment; for-loop: two of the
    largest tensor's; fused: none). The plan holds, beyond the allocator's,
    only the rotary cos and sin tables, which transformers makes in the
    forward and frees before the step (the cost model holds them the whole
    step), less under a KiB of the step's counters and scalars."""
    model = build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, **kwargs)
    assert ckptplan.optimizer_name(optimizer) == impl
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    peaks = step_peaks(model, optimizer, {"input_ids": ids, "labels": ids.clone()})
    plan = ckptplan.plan(model, "1GiB", batch=BATCH, seq=SEQ, solver="none", optimizer=optimizer)
    tables = 2 * SEQ * (128 // 4) * 4 + 8 * SEQ  # cos and sin, seq × head size, fp32; positions, int64
    excess = plan.step_peak_bytes - peaks["step"]
    print(f"{impl}: step measured {peaks['step']}, predicted {plan.step_peak_bytes}; "
          f"whole step measured {max(peaks.values())} at {max(peaks, key=peaks.get)}, "
          f"predicted {plan.peak_bytes} at {plan.peak_at}")
    assert 0 <= tables - excess <= 1024, (peaks, plan.step_peak_bytes)
    # The step holds less than the forward and backward here: the
    # plan's peak is not the optimizer step's.
    assert plan.peak_at != "optimizer step" and plan.peak_bytes > plan.step_peak_bytes


def _part(at: str) -> str:
    """The part of the step (as step_peaks names them) a plan's peak_at
    falls in."""
    if at == "optimizer step":
        return "step"
    return "backward" if at.startswith("backward") else "forward"


def whole_step(model, optimizer, plan, batch) -> tuple[int, str]:
    """The measured peak of one step and the part it falls in, beside the
    plan's."""
    peaks = step_peaks(model, optimizer, batch)
    part = max(peaks, key=peaks.get)
    print(f"measured {peaks[part]} in the {part}; plan {plan.peak_bytes} at {plan.peak_at}: "
          f"{plan.peak_bytes - peaks[part]:+d} bytes")
    return peaks[part], part


def test_whole_step_store_everything(ckptplan_binary):
    """Storing everything, the whole step's peak — the loss's backward
    here: the log-probabilities, nll_loss's gradient of them and the
    logits' gradient (from transformers 4.49; before, its forward, where
    the loss copies the shifted logits beside them) — is the plan's to
    the byte, and falls where the plan says, but for the positions the
    model makes (cache_position, seq int64s), which the plan holds the
    whole step for a checkpointed layer's sake and PyTorch frees with the
    forward here, and where the backward peaks 4 bytes: nll_loss's count
    of targets, which PyTorch frees once nll_loss's own backward has run."""
    model = build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    plan = ckptplan.plan(model, "1GiB", batch=BATCH, seq=SEQ, solver="none", optimizer=optimizer)
    measured, part = whole_step(model, optimizer, plan, {"input_ids": ids, "labels": ids.clone()})
    assert part == _part(plan.peak_at), (part, plan.peak_at)
    positions = 8 * SEQ
    assert plan.peak_bytes - measured == positions + (4 if part == "backward" else 0)


@pytest.mark.parametrize("share", [80, 60])
def test_whole_step_planned(ckptplan_binary, share):
    """A plan in a budget below storing everything, applied: the step's
    measured peak is the plan's, and falls where the plan says. On the CPU
    the allocator counts too what a checkpointed or selective layer keeps
    in host memory (plan.layers' host_bytes: the random-number state
    torch.utils.checkpoint stashes), apart from the GPU's budget; and where
    the backward peaks the plan counts 4 bytes more (nll_loss's count of
    targets, as storing everything)."""
    model = build()
    from ckptplan.introspect import describe

    if describe(model, batch=BATCH, seq=SEQ).gqa_kernel == "math":
        # PyTorch 2.5 to 2.7 on the CPU run sdpa's math path for grouped
        # K and V (transformers 4.54 and later); rerun in a selective
        # layer's backward, its _safe_softmax holds temporaries (a copy of
        # the probabilities, a mask) the plan's rerun does not count:
        # 1.4 MB over the plan here.
        pytest.xfail("sdpa's math path for grouped K and V: its rerun's _safe_softmax temporaries are not counted")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    store = ckptplan.plan(model, "1GiB", batch=BATCH, seq=SEQ, solver="none", optimizer=optimizer)
    budget = store.static_bytes + (store.peak_bytes - store.static_bytes) * share // 100
    plan = ckptplan.plan(model, budget, batch=BATCH, seq=SEQ, optimizer=optimizer)
    assert plan.peak_bytes < store.peak_bytes
    ckptplan.apply(model, plan)
    measured, part = whole_step(model, optimizer, plan, {"input_ids": ids, "labels": ids.clone()})
    host = sum(layer.host_bytes for layer in plan.layers)
    assert host > 0, "no layer checkpointed or selective"
    assert part == _part(plan.peak_at), (part, plan.peak_at)
    assert plan.peak_bytes + host - measured == (4 if part == "backward" else 0)
