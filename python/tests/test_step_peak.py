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


def build(lora: int = 0, dtype: str = "fp32", attention: str = "sdpa", vocab: int = VOCAB,
          dropout: float = 0.0, targets: tuple = ("q_proj", "v_proj")) -> "torch.nn.Module":
    """The Llama the tests train, in dtype, with that attention,
    vocabulary and attention dropout; with LoRA adapters of that rank on
    targets (PEFT; q and v by default) when lora is not 0."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab,
                                   max_position_embeddings=512, tie_word_embeddings=False,
                                   attention_dropout=dropout)
    cfg._attn_implementation = attention
    return _trained(transformers.LlamaForCausalLM(cfg), dtype, lora, target_modules=list(targets))


def _trained(model, dtype: str, lora: int = 0, **lora_config) -> "torch.nn.Module":
    """model as a step trains it: no key/value cache, in dtype, with LoRA
    adapters of rank lora (PEFT, lora_config) when lora is not 0."""
    model.config.use_cache = False
    if dtype == "bf16":
        model = model.to(torch.bfloat16)
    if lora:
        peft = pytest.importorskip("peft")
        model = peft.get_peft_model(model, peft.LoraConfig(r=lora, lora_alpha=16, **lora_config))
    return model


def train_step(model, optimizer, batch, micro: int = 1, between=None) -> None:
    """One training step as the Trainer runs it: the loss of each of micro
    micro-batches (the same batch each time) backward, the model's outputs
    dropped once the loss is taken; then the optimizer step. between runs
    before each micro-batch after the first."""
    for k in range(micro):
        if between is not None and k > 0:
            between()
        loss = model(**batch).loss / micro
        loss.backward()
        del loss
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def step_peaks(model, optimizer, batch, micro: int = 1) -> dict[str, int]:
    """The most bytes each part of one step holds ("forward", "backward",
    "step"), on the CPU allocator, what the step starts with included;
    the step accumulates gradients over micro micro-batches (the same
    batch each time)."""
    from torch.profiler import ProfilerActivity, profile

    train_step(model, optimizer, batch, micro)  # the optimizer state
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
            train_step(model, optimizer, batch, micro)
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
    (foreach: a square root of every second moment; for-loop: a square
    root and a quotient of one tensor's while the previous tensor's
    quotient is still bound; fused: none), without the rotary tables and
    positions the forward made. The plan is the allocator's to the byte
    but for one CPU effect: on the CPU, incrementing each step counter
    (_foreach_add_ falls back to add_) wraps the scalar 1 in an 8-byte
    tensor and casts it to a 4-byte one, 12 bytes the plan does not
    count (on a GPU the counters are on the host, or the fused kernel
    adds in place)."""
    model = build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, **kwargs)
    assert ckptplan.optimizer_name(optimizer) == impl
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    peaks = step_peaks(model, optimizer, {"input_ids": ids, "labels": ids.clone()})
    plan = ckptplan.plan(model, "1GiB", batch=BATCH, seq=SEQ, solver="none", optimizer=optimizer)
    print(f"{impl}: step measured {peaks['step']}, predicted {plan.step_peak_bytes}; "
          f"whole step measured {max(peaks.values())} at {max(peaks, key=peaks.get)}, "
          f"predicted {plan.peak_bytes} at {plan.peak_at}")
    assert peaks["step"] - plan.step_peak_bytes == 12, (peaks, plan.step_peak_bytes)
    # The step holds less than the forward and backward here: the
    # plan's peak is not the optimizer step's.
    assert plan.peak_at != "optimizer step" and plan.peak_bytes > plan.step_peak_bytes


def _part(at: str) -> str:
    """The part of the step (as step_peaks names them) a plan's peak_at
    falls in."""
    if at == "optimizer step":
        return "step"
    return "backward" if at.startswith("backward") else "forward"


def whole_step(model, optimizer, plan, batch, micro: int = 1) -> tuple[int, str]:
    """The measured peak of one step and the part it falls in, beside the
    plan's."""
    peaks = step_peaks(model, optimizer, batch, micro)
    part = max(peaks, key=peaks.get)
    print(f"measured {peaks[part]} in the {part}; plan {plan.peak_bytes} at {plan.peak_at}: "
          f"{plan.peak_bytes - peaks[part]:+d} bytes")
    return peaks[part], part


def _slack(plan, measured: int) -> int:
    """What the plan counts beyond the measured peak, less what it is
    known to: on the CPU the allocator counts too what the step keeps in
    host memory (plan.host_bytes, every stage's: the Python numbers
    products keep, and the random-number state torch.utils.checkpoint
    stashes),
    apart from the GPU's budget. nll_loss's count of targets (4 bytes)
    the plan frees as PyTorch does, with nll_loss's own backward, before
    log_softmax's makes the logits' gradient. A stage output
    no op saves (a bf16 layer's, which the next norm reads through an
    fp32 copy; the frozen embedding's under LoRA) the plan frees as
    PyTorch does, once its last reader in the next stored stage has run
    (solver.Chain.UnsavedActs)."""
    return plan.peak_bytes + plan.host_bytes - measured


def _release() -> tuple[int, int]:
    """The installed transformers release, (major, minor)."""
    major, minor = transformers.__version__.split(".")[:2]
    return int(major), int(minor)


# Some runs hold one 8-byte host number fewer than the plan's host_bytes
# where the step peaks: on transformers 5 depending on what the process
# ran before, and Phi-3's on 4.46 (test_whole_step_lora_every_linear_bf16).
# The plan is 0 or 8 bytes over.
_HOST_NUMBER = (0, 8)


def _plan_at(model, optimizer, share: int, **kwargs) -> "ckptplan.Plan":
    """The plan storing everything (share 100), or else the selective
    plan in share% of the activations storing everything holds, applied
    to model; kwargs go to ckptplan.plan."""
    plan = ckptplan.plan(model, "1GiB", batch=BATCH, seq=SEQ, solver="none", optimizer=optimizer, **kwargs)
    if share < 100:
        budget = plan.static_bytes + (plan.peak_bytes - plan.static_bytes) * share // 100
        plan = ckptplan.plan(model, budget, batch=BATCH, seq=SEQ, optimizer=optimizer, **kwargs)
        ckptplan.apply(model, plan)
        assert any(layer.mode != "store" for layer in plan.layers)
    return plan


def _step_at(model, share: int, batch: "dict | None" = None, **kwargs) -> tuple["ckptplan.Plan", int]:
    """_plan_at's plan of model under fused AdamW over its trained
    weights, and the measured peak of a step of batch (random tokens, as
    their own labels, by default), which must fall in the part of the
    step the plan says."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, fused=True)
    if batch is None:
        ids = torch.randint(0, VOCAB, (BATCH, SEQ))
        batch = {"input_ids": ids, "labels": ids.clone()}
    plan = _plan_at(model, optimizer, share, **kwargs)
    measured, part = whole_step(model, optimizer, plan, batch)
    assert part == _part(plan.peak_at), (part, plan.peak_at)
    return plan, measured


# (name, LoRA rank, micro-batches a step accumulates gradients over, dtype)
SETUPS = [("full", 0, 1, "fp32"), ("lora", 8, 1, "fp32"), ("accumulate", 0, 2, "fp32"), ("bf16", 0, 1, "bf16")]


def _setup(lora: int, micro: int, dtype: str = "fp32"):
    model = build(lora, dtype)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, fused=True)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    extra = ("--grad-accum", str(micro)) if micro > 1 else ()
    return model, optimizer, {"input_ids": ids, "labels": ids.clone()}, extra


@pytest.mark.parametrize("name,lora,micro,dtype", SETUPS)
def test_whole_step_store_everything(ckptplan_binary, name, lora, micro, dtype):
    """Storing everything, the whole step's peak — the loss's backward
    here: the log-probabilities, nll_loss's gradient of them and the
    logits' gradient (from transformers 4.49; before, its forward, where
    the loss copies the shifted logits beside them) — is the plan's to
    the byte, and falls where the plan says, full fine-tuning, LoRA, and
    accumulating gradients over two micro-batches (each one's gradients
    made apart and added into those held), but for what _slack says. The
    positions the model makes (cache_position, seq int64s) are freed with
    the forward in both: the plan holds them past it only where a
    checkpointed or selective layer's call does (solver.Chain.ArgBytes)."""
    model, optimizer, batch, extra = _setup(lora, micro, dtype)
    plan = ckptplan.plan(model, "1GiB", batch=BATCH, seq=SEQ, solver="none", optimizer=optimizer, extra_args=extra)
    measured, part = whole_step(model, optimizer, plan, batch, micro)
    assert part == _part(plan.peak_at), (part, plan.peak_at)
    assert _slack(plan, measured) == 0


@pytest.mark.parametrize("share", [80, 60])
@pytest.mark.parametrize("name,lora,micro,dtype", SETUPS)
def test_whole_step_planned(ckptplan_binary, name, lora, micro, dtype, share):
    """A plan in a budget below storing everything, applied: the step's
    measured peak is the plan's (_slack), and falls where the plan says."""
    model, optimizer, batch, extra = _setup(lora, micro, dtype)
    from ckptplan.introspect import describe

    if describe(model, batch=BATCH, seq=SEQ).gqa_kernel == "math" and _release() >= (4, 54):
        # PyTorch 2.5 to 2.7 on the CPU run sdpa's math path for grouped
        # K and V (transformers 4.54 and later), one C++ function whose
        # locals (the scaled q, the repeated K and V, the causal mask it
        # builds) live until it returns, and which, under a dispatch mode
        # (a selective layer's), adds the mask out of place: rerun in a
        # selective layer's backward it holds about 1.06 MB here beyond
        # the plan, which counts the ops' tensors as Python frees them
        # (and _safe_softmax's working memory).
        pytest.xfail("sdpa's math path for grouped K and V: its C++ locals live to its end, beyond the plan's rerun")
    store = ckptplan.plan(model, "1GiB", batch=BATCH, seq=SEQ, solver="none", optimizer=optimizer, extra_args=extra)
    budget = store.static_bytes + (store.peak_bytes - store.static_bytes) * share // 100
    plan = ckptplan.plan(model, budget, batch=BATCH, seq=SEQ, optimizer=optimizer, extra_args=extra)
    assert plan.peak_bytes < store.peak_bytes
    ckptplan.apply(model, plan)
    measured, part = whole_step(model, optimizer, plan, batch, micro)
    assert any(layer.host_bytes >= 5056 for layer in plan.layers), "no layer checkpointed or selective"
    assert part == _part(plan.peak_at), (part, plan.peak_at)
    assert _slack(plan, measured) == 0


@pytest.mark.parametrize("share", [80, 60])
def test_whole_step_peak_in_a_layer(ckptplan_binary, share):
    """With a vocabulary of 64 the loss is small and a planned step peaks
    in the backward of the last decoder layer, where the loop still holds
    the loss and its gradient (8 bytes, which the plan counts to the
    backward's end). There the plan holds what PyTorch holds, to the
    byte, with what the CPU allocator counts of the host bytes (_slack;
    nll_loss's count of targets is gone in both by then): the layer's
    output leaves the layer's tape once the head's backward has run, as no
    op of the layer saves it (solver.Chain.MakerUnsaved), and the
    gradient handed to the layer becomes the gradient of the layer's
    input, as the residual adds hand it on as it is (autograd's
    AddBackward; stage.Share). Each of those, counted as held, put the
    plan above the measure by one hidden state (batch × seq × hidden fp32)
    before."""
    model = build(vocab=64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    ids = torch.randint(0, 64, (BATCH, SEQ))
    batch = {"input_ids": ids, "labels": ids.clone()}
    store = ckptplan.plan(model, "1GiB", batch=BATCH, seq=SEQ, solver="none", optimizer=optimizer)
    budget = store.static_bytes + (store.peak_bytes - store.static_bytes) * share // 100
    plan = ckptplan.plan(model, budget, batch=BATCH, seq=SEQ, optimizer=optimizer)
    ckptplan.apply(model, plan)
    measured, part = whole_step(model, optimizer, plan, batch)
    assert part == "backward" and plan.peak_at == "backward of layers.3", (part, plan.peak_at)
    host = plan.host_bytes  # on the CPU allocator too (_slack)
    over = plan.peak_bytes + host - measured
    assert over in _HOST_NUMBER, over


@pytest.mark.parametrize("share", [100, 80, 60])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_whole_step_eager(ckptplan_binary, dtype, share):
    """Eager attention, stored and planned: the model makes a causal mask
    each forward, [batch, 1, seq, seq] in its dtype, and hands it to every
    layer; a checkpointed or selective layer's call holds it to its
    backward, and storing everything PyTorch frees it with the forward.
    The plan holds it so, as the positions (solver.Chain.ArgBytes), and
    counts F.softmax's fp32 copy of 16-bit scores, whose gradient is fp32
    until the copy's backward.
    Where a planned step peaks in the last layer's backward, the plan is
    the measure, as test_whole_step_peak_in_a_layer says.
    Before transformers 4.53 a batch without an attention mask gets a
    view of one [seq, seq] mask, which the plan counts as the copy per
    sequence a batch with one gets: the plan is above by at most that."""
    model = build(0, dtype, "eager")
    plan, measured = _step_at(model, share)
    size = 4 if dtype == "fp32" else 2
    mask = BATCH * SEQ * SEQ * size
    over = _slack(plan, measured)
    if _release() >= (4, 53):
        assert over == 0
    else:
        # Storing everything the mask is gone by the backward: the copy
        # counted beyond the view shows only where the forward peaks, or
        # a layer's call holds it.
        assert 0 <= over <= (BATCH - 1) * SEQ * SEQ * size


@pytest.mark.parametrize("name,lora,micro,dtype", SETUPS)
def test_memtracker_agrees(ckptplan_binary, name, lora, micro, dtype):
    """PyTorch's own tracker (torch.distributed._tools.mem_tracker,
    which attributes every tensor to parameters, buffers, gradients,
    optimizer state, activations and temporaries) sees the step's peak
    where the allocator does, to the byte; the plan says the same peak as
    measured against the allocator (test_whole_step_store_everything)."""
    mem_tracker = pytest.importorskip("torch.distributed._tools.mem_tracker")
    model, optimizer, batch, extra = _setup(lora, micro, dtype)
    plan = ckptplan.plan(model, "1GiB", batch=BATCH, seq=SEQ, solver="none", optimizer=optimizer, extra_args=extra)
    train_step(model, optimizer, batch, micro)  # the optimizer state
    tracker = mem_tracker.MemTracker()
    tracker.track_external(model, optimizer, *batch.values())
    try:
        with tracker:
            # It tracks a module's call once a step: reset between micro-batches.
            train_step(model, optimizer, batch, micro, between=tracker.reset_mod_stats)
    except RuntimeError as e:
        if "doesn't require gradient" not in str(e):
            raise
        # Under LoRA the frozen embedding's output needs no gradient, on
        # which MemTracker's backward hooks cannot be registered.
        pytest.skip(f"MemTracker does not run this step: {e}")
    tracked = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    measured, part = whole_step(model, optimizer, plan, batch, micro)
    assert tracked == measured
    assert _slack(plan, tracked) == 0


def _worker(rank: int, port: int, out: str) -> None:
    """One of two ranks of a gloo group training the Llama under PyTorch's
    DistributedDataParallel (AdamW fused) for five steps under the
    profiler; rank 0 writes the most its CPU allocator held in the
    forward, the backward and the optimizer step, each the least over the
    last three steps (the first rebuilds DDP's buckets in the gradients'
    order; on a loaded machine gloo's thread may free the buffer of a
    step's last all-reduce, a bucket's size, only in the next step's
    forward, while a term the plan lacked would show in every step).

    The model and its DDP wrapper are made before the profiler starts and
    their weights' bytes added to what it counts. DDP's constructor
    broadcasts the weights through one flat buffer; whichever of the
    calling thread and gloo's worker drops it last frees it, and the
    profiler's running total drops only for frees on a profiled thread,
    so when gloo's thread wins the race the buffer would stay in every
    later total. The buckets DDP rebuilds in the first step's forward are
    made under the profiler."""
    import json
    import os

    import torch.distributed as dist

    from allocator_events import part_peaks, profiled_steps

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model = torch.nn.parallel.DistributedDataParallel(build())
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in [*model.parameters(), *model.buffers()]}
    weights = sum(storages.values())

    def setup():
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
        return model, optimizer, {"input_ids": ids, "labels": ids.clone()}

    try:
        prof, (_, optimizer, _) = profiled_steps(setup, steps=5)
        # ckptplan.plan over the wrapped model: its ranks are the plan's --dp.
        planned = ckptplan.plan(model, "1GiB", batch=BATCH, seq=SEQ, solver="none", optimizer=optimizer).peak_bytes
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return
    steady = [part_peaks(prof, k) for k in (2, 3, 4)]
    with open(out, "w") as f:
        json.dump({"planned": planned, **{part: weights + min(p[part] for p in steady) for part in steady[0]}}, f)


def test_ddp_buckets(ckptplan_binary, tmp_path):
    """Data parallelism without ZeRO (--dp 2) is PyTorch's
    DistributedDataParallel, whose gradient buckets hold a copy of every
    trained gradient the whole step: on two gloo ranks the step's peak is
    the plan's (less what _slack says, as storing everything on one
    rank), where the plan says, and its optimizer step
    the plan's but for the CPU's 12 bytes (test_optimizer_step), each
    with what gloo's threads may hold then. ckptplan.plan, given the DDP
    model, plans for its ranks."""
    from test_deepspeed_zero3 import spawn

    measured = spawn(tmp_path, "test_step_peak")
    model, optimizer, _, _ = _setup(0, 1)
    plan = ckptplan.plan(model, "1GiB", batch=BATCH, seq=SEQ, solver="none", optimizer=optimizer,
                         extra_args=("--dp", "2"))
    assert measured.pop("planned") == plan.peak_bytes  # ckptplan.plan read the ranks off the DDP model
    part = max(measured, key=measured.get)
    print(f"DDP over 2 ranks: measured {measured}; plan {plan.peak_bytes} at {plan.peak_at}, "
          f"its step {plan.step_peak_bytes}")
    assert part == _part(plan.peak_at), (part, plan.peak_at)
    # Beyond the plan, at times, gloo's threads hold a few small tensors
    # (8, 320 and, on a loaded machine, 1,104 bytes seen): host memory
    # under NCCL. The buckets are 3,977,728 bytes.
    gloo = 16 << 10
    assert 0 <= -_slack(plan, measured[part]) <= gloo
    assert 0 <= measured["step"] - plan.step_peak_bytes - 12 <= gloo


@pytest.mark.parametrize("share", [100, 60])
def test_whole_step_padded(ckptplan_binary, share):
    """A padded batch (the second sequence 56 tokens short, masked, its
    labels -100), planned padded: the loop holds the batch's attention
    mask ([batch, seq] int64) through the step beside the tokens and
    labels, which the plan counts. Storing everything, the plan is above
    the measure, where the step peaks in the backward, by the mask the
    model makes for its sdpa layers (from transformers 4.53 a boolean
    [batch, 1, seq, seq]; before, additive in the model's dtype), which
    the plan holds through the backward, as CUDA's memory-efficient
    kernel saves it for its backward, and PyTorch frees with the forward
    on the CPU. The positions are freed with the forward in both
    (solver.Chain.ArgBytes). Planned, a layer's call holds both to its
    backward: the plan is the measure."""
    model = build()
    plan, measured = _step_at(model, share, _padded_batch(), padded=True)
    over = _slack(plan, measured)
    if share < 100:
        assert over == 0
        return
    freed = BATCH * SEQ * SEQ * (1 if _release() >= (4, 53) else 4) if _part(plan.peak_at) == "backward" else 0
    assert over == freed


def _padded_batch() -> dict:
    """A batch whose second sequence is 56 tokens short, masked, its
    labels -100."""
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, SEQ - 56:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


@pytest.mark.parametrize("share", [100, 80, 60])
def test_whole_step_padded_math(ckptplan_binary, share):
    """A padded batch under attention dropout: on the CPU sdpa runs its
    math path, which adds the model's mask to its scores and saves none.
    The mask (from transformers 4.53 a boolean [batch, 1, seq, seq],
    before, additive in the model's dtype) is then each layer's call
    argument, as eager attention's: freed with the forward storing
    everything, held by a checkpointed or selective layer's call to its
    backward. The plan is the measure, stored and planned (it was below
    by the boolean mask, 131,072 bytes, planned on transformers 5.24)."""
    plan, measured = _step_at(build(dropout=0.1), share, _padded_batch(), padded=True)
    assert plan.attention == "sdpa-math"
    assert _slack(plan, measured) == 0


@pytest.mark.parametrize("share", [100, 80])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_whole_step_gemma(ckptplan_binary, dtype, share):
    """Gemma, stored and planned: the measure is the plan's (_slack).
    Gemma scales its embeddings by √hidden, a 0-dim tensor the product
    keeps: made each forward in the model's dtype before transformers
    5.4, from 5.4 a registered buffer in it (the model's dtype conversion
    converts it; its cast to the weights' dtype is no copy), which the
    plan then counts once, with the buffers (it was 4 bytes above in
    fp32, counting both)."""
    torch.manual_seed(0)
    cfg = transformers.GemmaConfig(hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=VOCAB,
                                   max_position_embeddings=512, hidden_activation="gelu_pytorch_tanh")
    cfg._attn_implementation = "sdpa"
    plan, measured = _step_at(_trained(transformers.GemmaForCausalLM(cfg), dtype), share)
    assert _slack(plan, measured) == 0


def build_gpt2(dropout: float, dtype: str = "fp32", lora: int = 0) -> "torch.nn.Module":
    """A GPT-2 of the Llama's size (h128, 4 layers, vocabulary VOCAB),
    its input and output embeddings tied, learned positions, LayerNorm
    and gelu_new; with that dropout on the embeddings, the attention
    probabilities and both residual branches; in dtype; with LoRA
    adapters of that rank on c_attn (PEFT) when lora is not 0."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=4, n_embd=128, n_head=4, n_positions=512, vocab_size=VOCAB,
                                  attn_pdrop=dropout, resid_pdrop=dropout, embd_pdrop=dropout)
    cfg._attn_implementation = "sdpa"
    return _trained(transformers.GPT2LMHeadModel(cfg), dtype, lora, target_modules=["c_attn"], fan_in_fan_out=True)


def _bf16_linear_buffer(rows: int, features: list[tuple[int, int]]) -> int:
    """The most working memory the CPU allocator gives the backward of a
    bf16 linear of rows rows, over the (in, out) features given: what its
    products hold at their peak beyond the gradients they leave. PyTorch's
    CPU kernel (oneDNN) packs bf16 operands in a buffer it takes from the
    allocator (689,792 bytes for the MLP's down projection here, on
    PyTorch 2.5); CUDA's cuBLAS takes none per product, and the plan
    counts none."""
    from torch.profiler import ProfilerActivity, profile

    most = 0
    for fan_in, fan_out in features:
        x = torch.randn(rows, fan_in, dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(fan_out, fan_in, dtype=torch.bfloat16, requires_grad=True)
        y = torch.nn.functional.linear(x, w)
        dy = torch.randn_like(y)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            y.backward(dy)
        live, peak = 0, 0
        for e in prof.profiler.kineto_results.events():
            if e.name() == "[memory]":
                live += e.nbytes()
                peak = max(peak, live)
        most = max(most, peak - live)
    return most


@pytest.mark.parametrize("share", [100, 80, 60])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_whole_step_gpt2(ckptplan_binary, dropout, dtype, share):
    """GPT-2, stored and planned, with and without dropout, fp32 and
    bf16: the step's measured peak is the plan's (_slack), and falls
    where the plan says. What differs from the Llama: tied embeddings (one
    weight, one gradient); learned positions, which the position
    embedding saves to its backward, the step's last (so a layer's call
    taking them holds nothing more); each dropout's mask, which the CPU
    kernel keeps scaled in its input's dtype (CUDA's fused kernel one
    byte an element); sdpa with dropout on the CPU runs its math path;
    gelu_new runs in Python ops, whose backward makes its last
    product's two gradients at once (a selective layer that reruns it
    peaks there); and before transformers 4.48 GPT-2's loss is its own,
    over the logits in the model's dtype, whose nll_loss counts its
    targets in that dtype too.
    One CPU effect: where a bf16 step peaks in a layer's backward, a
    product there may hold oneDNN's packing buffer (_bf16_linear_buffer),
    which the plan, modelling CUDA, does not count: the measure is above
    the plan by at most that."""
    model = build_gpt2(dropout, dtype)
    plan, measured = _step_at(model, share)
    over = _slack(plan, measured)
    if dtype == "bf16" and plan.peak_at.startswith("backward of layers."):
        hidden = model.config.n_embd
        linears = [(hidden, 3 * hidden), (hidden, hidden), (hidden, 4 * hidden), (4 * hidden, hidden)]
        assert 0 <= -over <= _bf16_linear_buffer(BATCH * SEQ, linears), over
        return
    assert over == 0


@pytest.mark.parametrize("share", [100, 60])
def test_whole_step_gpt2_lora(ckptplan_binary, share):
    """GPT-2 under LoRA: its position embedding is frozen and saves no
    positions, which PyTorch then frees with the model's forward, or a
    checkpointed layer's call holds where its layers take them
    (transformers 4.53 and later). The plan counts them with the batch,
    held the whole step: stored, it is above the measure by them
    (seq int64s); planned, by them where the layers do not take them,
    else it is the measure."""
    model = build_gpt2(0.1, lora=8)
    plan, measured = _step_at(model, share)
    taken = _release() >= (4, 53)
    assert _slack(plan, measured) == (0 if share < 100 and taken else 8 * SEQ)


@pytest.mark.parametrize("dropout,dtype", [(0.0, "fp32"), (0.1, "fp32"), (0.1, "bf16")])
def test_memtracker_agrees_gpt2(ckptplan_binary, dropout, dtype):
    """On GPT-2, storing everything, PyTorch's own tracker sees the plan's
    peak to the byte. The CPU allocator sees the host bytes beside it
    (_slack): gelu_new's products with Python numbers wrap each number in
    a tensor the layer's backward keeps, which C++ makes outside the
    tracker's dispatch mode."""
    mem_tracker = pytest.importorskip("torch.distributed._tools.mem_tracker")
    model = build_gpt2(dropout, dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    batch = {"input_ids": ids, "labels": ids.clone()}
    plan = ckptplan.plan(model, "1GiB", batch=BATCH, seq=SEQ, solver="none", optimizer=optimizer)
    train_step(model, optimizer, batch)  # the optimizer state
    tracker = mem_tracker.MemTracker()
    tracker.track_external(model, optimizer, *batch.values())
    with tracker:
        train_step(model, optimizer, batch)
    tracked = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    measured, _ = whole_step(model, optimizer, plan, batch)
    host = plan.host_bytes
    assert host > 0
    assert tracked == plan.peak_bytes
    assert measured == tracked + host



ALL_LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.mark.parametrize("family,attention,share", [("llama", "sdpa", 100), ("llama", "eager", 100),
                                                    ("gpt2", "sdpa", 100), ("gpt2", "sdpa", 60),
                                                    ("phi3", "sdpa", 100)])
def test_whole_step_lora_every_linear_bf16(ckptplan_binary, family, attention, share):
    """LoRA on every linear of a bf16 model, PEFT's fp32 adapters, on
    models whose step peaks in the last layer's forward (a small
    vocabulary): the measure is the plan's. Each adapted layer adds its
    fp32 output to the base's bf16 one, a promoted fp32 copy of the base
    beside the scaled output and their sum (stage.peftBytes); a
    module holds its arguments until it returns, the model's loop a
    layer's input until the layer returns (stage.moduleArgEnds), GPT-2's
    block its attention's output to its end (ir.Attrs.HeldTo), as Phi-3's
    layer does before transformers 4.48 (ir.Numerics.Phi3AttnOutputs),
    and the model's forward its embeddings until it is past its layers
    (solver.Chain.Embeds). Without these the plan was below the measure
    on transformers 5.24, by 30,704 bytes (Llama) and 24,056 (GPT-2), and
    Phi-3's on 4.46 by 16,376. The stages that have not run by a
    forward's peak keep no host bytes yet (_slack counts them all)."""
    model = _small_lora(family, attention, "bf16")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, fused=True)
    ids = torch.randint(0, 128, (2, 64))
    plan = ckptplan.plan(model, "1GiB", batch=2, seq=64, solver="none", optimizer=optimizer)
    if share < 100:
        budget = plan.static_bytes + (plan.peak_bytes - plan.static_bytes) * share // 100
        plan = ckptplan.plan(model, budget, batch=2, seq=64, optimizer=optimizer)
        ckptplan.apply(model, plan)
    assert _over_in_forward(model, optimizer, plan, ids) in _HOST_NUMBER


def _small_lora(family: str, attention: str, dtype: str, **lora_config) -> "torch.nn.Module":
    """A model of family (llama, gpt2, phi3) of test_real_stack's size
    (h64, 3 layers, vocabulary 128), whose step peaks in its last layer's
    forward, with that attention, in dtype, with rank-4 LoRA adapters
    (PEFT, lora_config) on every linear of its layers."""
    torch.manual_seed(0)
    if family == "gpt2":
        cfg = transformers.GPT2Config(n_layer=3, n_embd=64, n_head=4, n_positions=64, vocab_size=128,
                                      attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
        cls, targets = transformers.GPT2LMHeadModel, ["c_attn", "c_proj", "c_fc"]
        lora_config["fan_in_fan_out"] = True
    elif family == "phi3":
        cfg = transformers.Phi3Config(num_hidden_layers=3, hidden_size=64, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=192, vocab_size=128,
                                      max_position_embeddings=64, original_max_position_embeddings=64,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
        cls, targets = transformers.Phi3ForCausalLM, ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    else:
        cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=192, num_hidden_layers=3,
                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                       max_position_embeddings=64, tie_word_embeddings=False)
        cls, targets = transformers.LlamaForCausalLM, ALL_LINEARS
    cfg._attn_implementation = attention
    return _trained(cls(cfg), dtype, 4, target_modules=targets, **lora_config)


def _over_in_forward(model, optimizer, plan, ids) -> int:
    """What plan counts beyond the measured peak of a step of ids, which
    must fall in a forward, as the plan's: _slack, less the host bytes of
    the stages that have not run by a layer's forward."""
    measured, part = whole_step(model, optimizer, plan, {"input_ids": ids, "labels": ids.clone()})
    assert part == _part(plan.peak_at) == "forward", (part, plan.peak_at)
    host = plan.host_bytes
    if plan.peak_at.startswith("forward of layers."):
        last = int(plan.peak_at.rsplit(".", 1)[1])
        host = sum(layer.host_bytes for layer in plan.layers[:last + 1])
    return plan.peak_bytes + host - measured


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_whole_step_lora_dropout_fp32(ckptplan_binary, family):
    """LoRA with dropout on every linear of an fp32 model, storing
    everything: the step peaks in the last layer's forward, in an adapted
    product, where PEFT holds the base's output and the scaled adapters'
    beside their sum (stage.peftBytes). The plan counted the executor's
    LoRA scratch instead: GPT-2's was 63,492 bytes below the measure on
    both stacks, the Llama's 1,036 on 4.46 and in the wrong part of the
    step on 5.24. The allocator counts too the 4-byte fp32 copy of the
    adapters' scale, a Python number, made for the product (host
    memory)."""
    model = _small_lora(family, "sdpa", "fp32", lora_dropout=0.1)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, fused=True)
    plan = ckptplan.plan(model, "1GiB", batch=2, seq=64, solver="none", optimizer=optimizer)
    over = _over_in_forward(model, optimizer, plan, torch.randint(0, 128, (2, 64)))
    assert over in tuple(n - 4 for n in _HOST_NUMBER), over


@pytest.mark.parametrize("share", [80, 60])
def test_whole_step_lora_every_linear_planned(ckptplan_binary, share):
    """LoRA on every linear of a bf16 Llama, planned: the step peaks in the
    rerun of the last layer, a selective one (transformers 5), where the
    measure is the plan's but for host memory. torch.utils.checkpoint
    reruns a layer when its backward first unpacks a saved tensor, and
    PEFT's backward of the down projection has by then made the gradient
    of the base's bf16 output and the adapters' scaled fp32 one
    (stage.beforeUnpack); the rerun runs the layer's own code, whose
    variables hold what the forward's do (the residual to the layer's
    last add). Without these the plan was 99,400 bytes below the measure
    on transformers 5.24. The CPU allocator counts the rerun's host
    memory besides the plan's host_bytes: the random-number state it
    forks, and the Python numbers of the adapters it has rerun (8 bytes each)."""
    plan, measured = _step_at(build(8, "bf16", targets=ALL_LINEARS), share)
    if _release() >= (5, 0):  # before 4.49 the loss's shifted copy peaks in the head's forward
        assert plan.peak_at.startswith("backward of layers."), plan.peak_at
    rerun = torch.get_rng_state().numel() + 8 * len(ALL_LINEARS)
    assert -rerun <= _slack(plan, measured) <= 0, (_slack(plan, measured), rerun)
