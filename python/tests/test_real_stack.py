"""ckptplan's predictions against real transformers models on PyTorch 2.

Each test builds a tiny model from a config with random weights (no
download), asks the ckptplan binary for plans through ckptplan.plan, runs a
training step with ckptplan.apply and measures it with ckptplan.measure:
the truth is PyTorch's own saved tensors, live storages and FlopCounterMode.
"""
from __future__ import annotations

import contextlib
import copy
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ckptplan  # noqa: E402
from ckptplan import _binary, apply  # noqa: E402
from ckptplan import measure  # noqa: E402
from ckptplan._measure import forward_kept  # noqa: E402

BATCH, SEQ, VOCAB = 2, 16, 128
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


# The promises these tests check are each layer's; an optimizer with no
# state (and gradients held the whole step, as before it runs) keeps the
# step's peak in the forward and backward, so that budgets between
# checkpointing and storing everything choose between them.
OPTIMIZER = "none"

LORA_TARGETS = {
    # StarCoder2's MLP alone: its c_proj is not GPT-2's, which also names
    # the attention's output projection.
    "mlp": {"starcoder2": ["c_fc", "c_proj"]},
    "attn": {"gpt2": ["c_attn", "c_proj"], "llama": ["q_proj", "k_proj", "v_proj", "o_proj"],
             "phi3": ["qkv_proj", "o_proj"], "starcoder2": ["q_proj", "k_proj", "v_proj", "o_proj"]},
    "all": {"gpt2": ["c_attn", "c_proj", "c_fc"],
            "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
            "starcoder2": ["q_proj", "k_proj", "v_proj", "o_proj", "c_fc", "c_proj"]},
    # One MLP projection whose output a pointwise op saves, before a frozen
    # one that saves only its weight: the replay reruns the adapter's B.
    "fc": {"gpt2": ["c_fc"], "llama": ["up_proj"], "starcoder2": ["c_fc"]},
}


def build(family: str, attention: str, dtype: str, dropout: float = 0.0, lora: str = "",
          kv: "int | None" = None) -> "torch.nn.Module":
    """A tiny model of family with random weights, in training mode; lora
    "attn" adds PEFT LoRA adapters on the attention's projections (GPT-2:
    c_attn, c_proj, so its MLP's c_proj too), "all" on every linear, with
    PEFT's defaults (fp32 adapters over 16-bit weights) and dropout."""
    if family == "gpt2":
        config = transformers.GPT2Config(n_layer=3, n_embd=64, n_head=4, n_positions=64, vocab_size=VOCAB,
                                         attn_pdrop=dropout, resid_pdrop=dropout, embd_pdrop=dropout)
    elif family == "gemma":
        # Heads of their own size, as every Gemma's.
        config = transformers.GemmaConfig(num_hidden_layers=3, hidden_size=64, num_attention_heads=4,
                                          num_key_value_heads=2, head_dim=32, intermediate_size=192,
                                          vocab_size=VOCAB, max_position_embeddings=64, attention_dropout=dropout,
                                          hidden_activation="gelu_pytorch_tanh")
    elif family == "gemma2":
        # Soft-capping, a query scale of its own and windows shorter than
        # the sequence in the even layers, as every Gemma 2's.
        config = transformers.Gemma2Config(num_hidden_layers=3, hidden_size=64, num_attention_heads=4,
                                           num_key_value_heads=2, head_dim=32, intermediate_size=192,
                                           vocab_size=VOCAB, max_position_embeddings=64, attention_dropout=dropout,
                                           query_pre_attn_scalar=24, sliding_window=8,
                                           attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
    elif family == "qwen3":
        # Heads of their own size, as every Qwen 3's; tied, as the small ones.
        config = transformers.Qwen3Config(num_hidden_layers=3, hidden_size=64, num_attention_heads=4,
                                          num_key_value_heads=2, head_dim=32, intermediate_size=192,
                                          vocab_size=VOCAB, max_position_embeddings=64, attention_dropout=dropout,
                                          tie_word_embeddings=True)
    elif family == "phi3":
        config = transformers.Phi3Config(num_hidden_layers=3, hidden_size=64, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=192, vocab_size=VOCAB,
                                         max_position_embeddings=64, original_max_position_embeddings=64,
                                         attention_dropout=dropout, resid_pdrop=dropout,
                                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    elif family == "starcoder2":
        config = transformers.Starcoder2Config(num_hidden_layers=3, hidden_size=64, num_attention_heads=4,
                                               num_key_value_heads=2, intermediate_size=192, vocab_size=VOCAB,
                                               max_position_embeddings=64, attention_dropout=dropout,
                                               residual_dropout=dropout, embedding_dropout=dropout)
    elif family == "granite":
        # Multipliers far from 1, as every Granite's: a misplaced one
        # changes the gradients.
        config = transformers.GraniteConfig(num_hidden_layers=3, hidden_size=64, num_attention_heads=4,
                                            num_key_value_heads=2, intermediate_size=192, vocab_size=VOCAB,
                                            max_position_embeddings=64, attention_dropout=dropout,
                                            embedding_multiplier=12.0, residual_multiplier=0.22,
                                            attention_multiplier=0.0078125, logits_scaling=8.0)
    elif family == "mixtral":
        # Two of four experts a token, renormalized.
        config = transformers.MixtralConfig(num_hidden_layers=3, hidden_size=64, num_attention_heads=4,
                                            num_key_value_heads=2, intermediate_size=96, vocab_size=VOCAB,
                                            max_position_embeddings=64, attention_dropout=dropout,
                                            num_local_experts=4, num_experts_per_tok=2)
    elif family == "qwen2_moe":
        # Three of five experts a token, not renormalized, a shared expert
        # under a sigmoid gate, and a dense middle layer.
        config = transformers.Qwen2MoeConfig(num_hidden_layers=3, hidden_size=64, num_attention_heads=4,
                                             num_key_value_heads=2, intermediate_size=192, moe_intermediate_size=48,
                                             shared_expert_intermediate_size=80, num_experts=5, num_experts_per_tok=3,
                                             mlp_only_layers=[1], vocab_size=VOCAB, max_position_embeddings=64,
                                             attention_dropout=dropout)
    elif family == "qwen3_moe":
        # Qwen 3's attention; two of four experts a token, renormalized.
        config = transformers.Qwen3MoeConfig(num_hidden_layers=3, hidden_size=64, num_attention_heads=4,
                                             num_key_value_heads=2, head_dim=32, intermediate_size=192,
                                             moe_intermediate_size=48, num_experts=4, num_experts_per_tok=2,
                                             norm_topk_prob=True, vocab_size=VOCAB, max_position_embeddings=64,
                                             attention_dropout=dropout)
    else:
        cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
               "mistral-hd": transformers.MistralConfig, "llama-bias": transformers.LlamaConfig,
               "qwen2": transformers.Qwen2Config}[family]
        # mistral-hd: heads of their own size (32, where hidden/heads is 16),
        # as Mistral-NeMo's; llama-bias: biases on every projection.
        extra = {"mistral-hd": {"head_dim": 32},
                 "llama-bias": {"attention_bias": True, "mlp_bias": True}}.get(family, {})
        config = cls(num_hidden_layers=3, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=192, vocab_size=VOCAB, max_position_embeddings=64,
                     attention_dropout=dropout, **extra)
    if kv is not None:
        config.num_key_value_heads = kv
    if attention == "sdpa" and family == "gemma2" and not getattr(transformers.Gemma2PreTrainedModel, "_supports_sdpa", True):
        pytest.skip(f"transformers {transformers.__version__} builds Gemma 2 without sdpa (its scores are soft-capped)")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention,
                                                          torch_dtype=DTYPES[dtype])
    # A training step keeps no key/value cache (ckptplan.apply turns it
    # off): from transformers 5 one in training copies K and V.
    model.config.use_cache = False
    if lora:
        import peft

        targets = LORA_TARGETS[lora].get(family) or LORA_TARGETS[lora]["llama"]
        cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=dropout,
                              fan_in_fan_out=family == "gpt2")
        model = peft.get_peft_model(model, cfg)
    return model


def transformers_major() -> int:
    return int(transformers.__version__.split(".")[0])


def batch(n: int = BATCH) -> dict:
    g = torch.Generator().manual_seed(1)
    return {"input_ids": torch.randint(0, VOCAB, (n, SEQ), generator=g)}


ALL = [(f, a, d, p, lora, None) for f in ("llama", "mistral", "qwen2", "gpt2")
       for a in ("eager", "sdpa") for d in ("fp32", "bf16") for p in (0.0, 0.1) for lora in ("", "attn", "all")]
# fp32 weights under bf16 autocast (the Trainer's bf16=True).
ALL += [(f, a, "fp32", p, lora, "bf16") for f in ("llama", "mistral", "qwen2", "gpt2")
        for a in ("eager", "sdpa") for p in (0.0, 0.1) for lora in ("", "attn", "all")]
ALL += [(f, a, d, 0.0, lora, None) for f in ("mistral-hd", "llama-bias") for a in ("eager", "sdpa")
        for d in ("fp32", "bf16") for lora in ("", "all")]
ALL += [("llama-bias", "sdpa", "fp32", 0.0, "", "bf16")]
# Gemma: GELU, (1 + w) norms in fp32, scaled embeddings; Phi-3: fused
# projections, dropout on the residual branches.
# StarCoder2: LayerNorms with biases, biases on every projection, GPT-2's
# MLP, dropout on the embeddings and both residual branches.
ALL += [(f, a, d, p, lora, None) for f in ("gemma", "phi3", "starcoder2") for a in ("eager", "sdpa")
        for d in ("fp32", "bf16") for p in (0.0, 0.1) for lora in ("", "all")]
ALL += [(f, a, "fp32", p, lora, "bf16") for f in ("gemma", "phi3", "starcoder2") for a in ("eager", "sdpa")
        for p, lora in ((0.0, ""), (0.1, "attn"))]
ALL += [("starcoder2", a, "bf16", 0.0, "mlp", None) for a in ("eager", "sdpa")]
ALL += [(f, a, d, 0.0, "fc", None) for f in ("gpt2", "llama", "starcoder2") for a, d in (("eager", "fp32"), ("sdpa", "bf16"))]
# Granite: Llama's layer with multipliers on the embeddings, the residual
# branches, the attention scores and the logits.
ALL += [("granite", a, d, p, lora, None) for a in ("eager", "sdpa") for d in ("fp32", "bf16")
        for p, lora in ((0.0, ""), (0.1, "all"))]
ALL += [("granite", a, "fp32", 0.1, "attn", "bf16") for a in ("eager", "sdpa")]
# Gemma 2: Gemma's layer with norms after the attention and the MLP,
# soft-capped scores (eager) and logits, sliding-window layers (under sdpa
# each keeps a mask of its own).
ALL += [("gemma2", a, d, p, lora, None) for a in ("eager", "sdpa") for d in ("fp32", "bf16")
        for p, lora in ((0.0, ""), (0.1, "all"))]
ALL += [("gemma2", a, "fp32", p, lora, "bf16") for a in ("eager", "sdpa") for p, lora in ((0.0, ""), (0.1, "attn"))]
# Qwen 3 (transformers 4.51 and later; .ci/run runs these with a newer
# transformers than the pinned one): Llama's layer with each query and key
# head RMS-normalized, and sdpa handed contiguous copies, as every model
# is from 4.48.
# CKPTPLAN_NEWER=1 (.ci/run's run of them) makes a missing family a failure.
NEWER = [pytest.mark.newer,
         pytest.mark.skipif(not hasattr(transformers, "Qwen3Config") and not os.environ.get("CKPTPLAN_NEWER"),
                            reason=f"transformers {transformers.__version__} has no Qwen 3")]
ALL += [pytest.param("qwen3", a, d, p, lora, None, marks=NEWER) for a in ("eager", "sdpa") for d in ("fp32", "bf16")
        for p, lora in ((0.0, ""), (0.1, "all"))]
ALL += [pytest.param("qwen3", a, "fp32", p, lora, "bf16", marks=NEWER) for a in ("eager", "sdpa")
        for p, lora in ((0.0, ""), (0.1, "attn"))]
# Mixtures of experts: Mixtral and Qwen2-MoE (a shared expert, a dense
# layer) on the pinned transformers, Qwen 3 MoE on the newer one; LoRA on
# the attention (the experts frozen). Their layers are stored or
# checkpointed whole.
MOE = ("mixtral", "qwen2_moe", "qwen3_moe")


def traced(family: str) -> bool:
    """Whether ckptplan.plan traces the family's model on this transformers
    (from 5 its mixtures of experts run through experts kernels, which the
    builders do not model)."""
    return family in MOE and transformers_major() >= 5
ALL += [(f, a, d, p, lora, None) for f in ("mixtral", "qwen2_moe") for a in ("eager", "sdpa") for d in ("fp32", "bf16")
        for p, lora in ((0.0, ""), (0.1, "attn"))]
NEWER_MOE = [pytest.mark.newer,
             pytest.mark.skipif(not hasattr(transformers, "Qwen3MoeConfig") and not os.environ.get("CKPTPLAN_NEWER"),
                                reason=f"transformers {transformers.__version__} has no Qwen 3 MoE")]
ALL += [pytest.param("qwen3_moe", a, d, p, lora, None, marks=NEWER_MOE) for a in ("eager", "sdpa")
        for d in ("fp32", "bf16") for p, lora in ((0.0, ""), (0.1, "attn"))]
AUTOCAST = {None: None, "bf16": torch.bfloat16}


@pytest.mark.parametrize("family,attention,dtype,dropout,lora,autocast", ALL)
def test_stored_layers_keep_what_ckptplan_predicts(ckptplan_binary, family, attention, dtype, dropout, lora, autocast):
    """Bytes each layer saves (saved-tensor hooks, one count per storage)
    and holds after the forward equal the plan's, every layer stored.

    The hooks count a layer's input when its ops save it and not its
    output, which the next layer saves; the plan counts the output while
    something holds it. The two agree but for the first layer under LoRA,
    whose input (the frozen embedding's) needs no gradient: its hooks count
    lacks the output that the kept bytes have."""
    model = build(family, attention, dtype, dropout, lora)
    plan = ckptplan.plan(model, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="none", autocast=autocast)
    assert plan.batch == BATCH and plan.seq == SEQ and plan.dtype == dtype
    # On CPU, sdpa with dropout runs PyTorch's math path (a traced plan
    # names the attention the model was set up with).
    assert plan.attention == ("sdpa-math" if attention == "sdpa" and dropout and not traced(family) else attention)
    m = measure(model, batch(), autocast=AUTOCAST[autocast])
    # Host memory: the Python numbers each layer's products keep, as
    # autograd's own nodes hold them.
    assert [l.host_bytes for l in plan.layers] == wrapped_numbers(model, batch(), AUTOCAST[autocast])
    for i, (layer, got) in enumerate(zip(plan.layers, m.layers)):
        assert layer.mode == "store"
        assert got.host_bytes == layer.host_bytes, f"{layer.name}: host {got.host_bytes}, plan {layer.host_bytes}"
        if not (lora and i == 0):
            assert got.saved_bytes == layer.kept_bytes, f"{layer.name}: PyTorch saves {got.saved_bytes}, plan {layer.kept_bytes}"
        assert got.kept_bytes == layer.kept_bytes, f"{layer.name}: PyTorch holds {got.kept_bytes}, plan {layer.kept_bytes}"


# Every family again on the newer transformers, whose models (4.48 and
# later) run one attention function and hand sdpa contiguous copies: what
# each stored layer keeps. Only .ci/run's run with it (CKPTPLAN_NEWER=1)
# runs them; the pinned run tests the same setups above.
NEWER_RUN = [pytest.mark.newer, pytest.mark.skipif(not os.environ.get("CKPTPLAN_NEWER"),
                                                   reason="run with python/requirements-newer.txt's transformers")]
NEWER_STORED = [pytest.param(f, a, d, p, lora, None, marks=NEWER_RUN)
                for f in ("llama", "mistral", "qwen2", "gpt2", "gemma", "gemma2", "phi3", "starcoder2", "granite",
                          "mistral-hd", "llama-bias")
                for a in ("eager", "sdpa") for d in ("fp32", "bf16") for p, lora in ((0.0, ""), (0.1, "all"))]
NEWER_STORED += [pytest.param(f, a, d, p, lora, None, marks=NEWER_RUN) for f in ("mixtral", "qwen2_moe")
                 for a in ("eager", "sdpa") for d in ("fp32", "bf16") for p, lora in ((0.0, ""), (0.1, "attn"))]
NEWER_STORED += [pytest.param(f, "sdpa", "fp32", 0.0, "", "bf16", marks=NEWER_RUN)
                 for f in ("llama", "gemma", "gemma2", "phi3", "starcoder2", "granite")]


@pytest.mark.parametrize("family,attention,dtype,dropout,lora,autocast", NEWER_STORED)
def test_stored_layers_on_newer_transformers(ckptplan_binary, family, attention, dtype, dropout, lora, autocast):
    """test_stored_layers_keep_what_ckptplan_predicts on the newer transformers."""
    test_stored_layers_keep_what_ckptplan_predicts(ckptplan_binary, family, attention, dtype, dropout, lora, autocast)


class FixedRouter(torch.nn.Module):
    """A router whose logits are its own plus fixed logits per token, which
    decide where each token goes: it runs the router it wraps (a linear on
    transformers 4, a top-k router module on 5), adding the table to the
    product with the router's weight, and so keeps what that router keeps
    (adding the table keeps nothing)."""

    def __init__(self, gate: torch.nn.Module, table: "torch.Tensor"):
        super().__init__()
        self.gate = gate
        self.register_buffer("table", table.to(gate.weight.dtype))

    def forward(self, x):
        import unittest.mock

        linear = torch.nn.functional.linear

        def fixed(a, w, bias=None):
            out = linear(a, w, bias)
            return out + self.table if w is self.gate.weight else out

        with unittest.mock.patch.object(torch.nn.functional, "linear", fixed):
            return self.gate(x)


def routing_table(routing: str, tokens: int, experts: int, k: int) -> "torch.Tensor":
    """Logits that send token t to k experts: "worst", all to experts
    0…k−1; "balanced", round robin; "skewed", most to expert 0 and none
    to the last expert."""
    table = torch.zeros(tokens, experts)
    for t in range(tokens):
        if routing == "worst":
            chosen = range(k)
        elif routing == "balanced":
            chosen = [(t * k + j) % experts for j in range(k)]
        else:
            chosen = [0] + [1 + (t + j) % (experts - 2) for j in range(k - 1)]
        for rank, e in enumerate(chosen):
            table[t, e] = 100.0 - rank
    return table


@pytest.mark.parametrize("family,attention,dtype,dropout,lora,autocast",
                         [(f, "sdpa", d, 0.0, "", None) for f in ("mixtral", "qwen2_moe") for d in ("fp32", "bf16")]
                         + [pytest.param("qwen3_moe", "eager", "fp32", 0.0, "", None, marks=NEWER_MOE)])
@pytest.mark.parametrize("routing", ["worst", "balanced", "skewed"])
def test_experts_keep_the_same_bytes_under_any_routing(ckptplan_binary, family, attention, dtype, dropout, lora,
                                                       autocast, routing):
    """Routing forced by fixed router logits: all tokens on the same k
    experts, spread evenly, or skewed with an expert left idle. Each
    layer keeps what the plan says, which does not depend on the
    routing: every token sends k rows, whichever experts take them."""
    model = build(family, attention, dtype, dropout, lora)
    plan = ckptplan.plan(model, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="none")
    counts = []
    for layer in model.model.layers:
        block = getattr(layer, "block_sparse_moe", None) or layer.mlp
        if not hasattr(block, "experts"):
            continue  # a dense layer
        k = getattr(block, "top_k", None) or block.gate.top_k
        table = routing_table(routing, BATCH * SEQ, block.gate.weight.shape[0], k)
        block.gate = FixedRouter(block.gate, table)
        chosen = table.topk(k, dim=-1).indices
        counts.append(torch.bincount(chosen.flatten(), minlength=table.shape[1]).tolist())
    assert counts, "no layer routes"
    m = measure(model, batch())
    for layer, got in zip(plan.layers, m.layers):
        assert got.kept_bytes == layer.kept_bytes, f"{routing} routing {counts[0]}: {layer.name} holds {got.kept_bytes}, plan {layer.kept_bytes}"


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_cached_rotary_tables_are_static_memory(ckptplan_binary, dtype):
    """Mixtral before transformers 4.48: each layer holds cos and sin tables
    of every position, in the model's dtype, and indexes them. The plan's
    static memory, held the whole step, is the weights and PyTorch's
    AdamW state (12 bytes a parameter: fp32 weights and moments; or 6:
    bf16 weights and moments, no master copy; and a 4-byte step counter a
    trained tensor, on the CPU the step runs on), the model's registered buffers
    (those tables and each layer's inv_freq), to the byte (the positions
    the model makes are not: they go with the forward, or with the
    backward of a checkpointed layer whose call holds them); the gradients (4 or 2 bytes a
    parameter) appear in the backward, and the optimizer step holds
    them."""
    model = build("mixtral", "sdpa", dtype)
    tables = [b for n, b in model.named_buffers() if n.endswith(("cos_cached", "sin_cached"))]
    if not tables:
        pytest.skip(f"transformers {transformers.__version__} makes Mixtral's rotary tables in the model")
    plan = ckptplan.plan(model, "1GiB", batch=BATCH, seq=SEQ, solver="none")
    grad = 4 if dtype == "fp32" else 2
    buffers = {b.untyped_storage().data_ptr(): b.untyped_storage().nbytes() for b in model.buffers()}
    counters = 4 * sum(1 for p in model.parameters() if p.requires_grad)
    assert plan.static_bytes == 3 * grad * model.num_parameters() + counters + sum(buffers.values())
    assert plan.step_peak_bytes >= plan.static_bytes + grad * model.num_parameters()


def wrapped_numbers(model, data: dict, autocast=None) -> list:
    """Bytes of the Python numbers each decoder layer's autograd nodes keep
    (PyTorch wraps each in a 0-dim float64 or int64 tensor on the CPU),
    read off the nodes of one forward: those made between the layer's
    input and its output."""
    from ckptplan.layers import decoder_layers

    outs = {}

    def hook(i):
        def f(mod, args, kwargs, out):
            x = args[0] if args else kwargs["hidden_states"]
            outs[i] = (out[0] if isinstance(out, tuple) else out, x)
        return f

    layers = decoder_layers(model)
    hooks = [l.register_forward_hook(hook(i), with_kwargs=True) for i, l in enumerate(layers)]
    try:
        with torch.autocast("cpu", dtype=autocast) if autocast else contextlib.nullcontext():
            out = model(**data, labels=data["input_ids"])
    finally:
        for h in hooks:
            h.remove()
    seen, sizes = set(), []
    for i in range(len(layers)):
        o, x = outs[i]
        if x.grad_fn is not None:
            seen.add(x.grad_fn)
        stack, n = [o.grad_fn], 0
        while stack:
            g = stack.pop()
            if g is None or g in seen:
                continue
            seen.add(g)
            for name in dir(g):
                if name.startswith("_saved_"):
                    v = getattr(g, name, None)
                    if isinstance(v, torch.Tensor) and v.dim() == 0 and v.device.type == "cpu" \
                            and v.dtype in (torch.float64, torch.int64):
                        n += v.untyped_storage().nbytes()
            stack.extend(f for f, _ in g.next_functions)
        sizes.append(n)
    del out
    return sizes


def grads_close(a, b) -> bool:
    """The gradients of a and b agree to a few units in their last place:
    a GPU's kernels may sum in another order when a layer is rerun."""
    def close(p, q):
        if p.grad is None or q.grad is None:
            return p.grad is None and q.grad is None
        tol = 2e-2 if p.grad.dtype == torch.bfloat16 else 1e-4
        return torch.allclose(p.grad.float(), q.grad.float(), rtol=tol, atol=tol * 1e-2)
    return all(close(p, q) for p, q in zip(a.parameters(), b.parameters()))


def grads_equal(a, b) -> bool:
    return all((p.grad is None) == (q.grad is None) and (p.grad is None or torch.equal(p.grad, q.grad))
               for p, q in zip(a.parameters(), b.parameters()))


SOLVERS = ("selective", "optimal", "every-k")


def under_solvers(cases: list) -> list:
    """Each setup of cases under each solver; with CKPTPLAN_SUBSET=1 (set
    by .ci/run on every stack but the newest, which runs them all), each
    setup under one solver, taken in turn, so that every solver still
    meets every family under each attention and each dtype."""
    out = []
    for i, case in enumerate(cases):
        values, marks = (case.values, case.marks) if hasattr(case, "values") else (case, ())
        chosen = [SOLVERS[i % len(SOLVERS)]] if os.environ.get("CKPTPLAN_SUBSET") else SOLVERS
        out += [pytest.param(s, *values, marks=marks) for s in chosen]
    return out


@pytest.mark.parametrize("solver,family,attention,dtype,dropout,lora,autocast", under_solvers(ALL))
def test_plans_hold(ckptplan_binary, family, attention, dtype, dropout, lora, autocast, solver):
    """Plans at three budgets, applied with ckptplan.apply (selective
    layers through selective activation checkpointing): each layer holds
    what the plan says, the gradients are those of the run
    without a plan, and the FLOPs recomputed in backward are the plan's."""
    ref = build(family, attention, dtype, dropout, lora)
    cast = AUTOCAST[autocast]
    # The run without a plan, once: its gradients and backward FLOPs are
    # every budget's reference (the same dropout masks in every run).
    base = copy.deepcopy(ref)
    torch.manual_seed(2)
    base_flops = measure(base, batch(), autocast=cast).backward_flops
    store = ckptplan.plan(ref, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="none", autocast=autocast)
    # Budgets between checkpointing everything and storing everything.
    every = ckptplan.plan(ref, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="every-k", autocast=autocast)
    low, high = every.peak_bytes, store.peak_bytes
    budgets = [low, (low + high) // 2, high] if solver == "every-k" else [low + (high - low) * f // 4 for f in (1, 2, 3)]
    modes = set()
    for budget in budgets:
        plan = ckptplan.plan(ref, budget, optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver=solver, autocast=autocast)
        model = copy.deepcopy(ref)
        apply(model, plan)
        torch.manual_seed(2)
        m = measure(model, batch(), autocast=cast)
        assert grads_equal(model, base), f"{solver} at {budget}: gradients differ"
        for layer, got in zip(plan.layers, m.layers):
            modes.add(layer.mode)
            assert got.kept_bytes == layer.kept_bytes, f"{solver} at {budget}, {layer.name} ({layer.mode}): PyTorch holds {got.kept_bytes}, plan {layer.kept_bytes}"
            assert got.host_bytes == layer.host_bytes, f"{solver} at {budget}, {layer.name} ({layer.mode}): host {got.host_bytes}, plan {layer.host_bytes}"
        assert m.recomputed_flops == plan.recompute_flops, f"{solver} at {budget}: recomputed {m.recomputed_flops} FLOPs, plan {plan.recompute_flops}"
        assert m.backward_flops - base_flops == plan.recompute_flops
    assert ("selective" if solver == "selective" and (family not in MOE or traced(family)) else "checkpoint") in modes


def test_time_plans_hold(ckptplan_binary):
    """A plan chosen for step time on a roofline (here a CPU's figures)
    applies as a FLOPs plan does: each layer holds what it says, the
    gradients are those of the run without a plan, and the FLOPs
    recomputed in backward are its figure."""
    ref = build("llama", "sdpa", "fp32")
    base = copy.deepcopy(ref)
    torch.manual_seed(2)
    base_flops = measure(base, batch()).backward_flops
    store = ckptplan.plan(ref, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="none")
    every = ckptplan.plan(ref, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="every-k")
    budget = (every.peak_bytes + store.peak_bytes) // 2
    plan = ckptplan.plan(ref, budget, optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, objective="time",
                         roofline="matrix=5e10,bandwidth=2e10,launch=1e-5,sync")
    assert plan.peak_bytes <= budget and {"selective", "checkpoint"} & {l.mode for l in plan.layers}, plan.layers
    model = copy.deepcopy(ref)
    apply(model, plan)
    torch.manual_seed(2)
    m = measure(model, batch())
    assert grads_equal(model, base)
    assert [got.kept_bytes for got in m.layers] == [l.kept_bytes for l in plan.layers]
    assert m.recomputed_flops == plan.recompute_flops == m.backward_flops - base_flops


@pytest.mark.newer
@pytest.mark.parametrize("family,attention,kv,n", [(f, a, kv, n) for f in ("llama", "gemma") for a in ("eager", "sdpa")
                                                   for kv in (1, 2, 4) for n in (1, 2)])
def test_kv_heads_and_batches(ckptplan_binary, family, attention, kv, n):
    """One key/value head (repeat_kv's expand is then a view at any batch,
    which a product reads as it is for one sequence and copies for two),
    some, and as many as the query heads, at batch 1 and 2: every stored
    layer keeps what the plan says, and a selective plan between storing
    and checkpointing everything applies, keeping and recomputing what it
    says, with the gradients of the run without it."""
    stored_and_selective_hold(build(family, attention, "fp32", kv=kv), batch(n), grads_equal)


SLIDING = {"mistral": ("MistralConfig", {}), "starcoder2": ("Starcoder2Config", {}), "phi3": ("Phi3Config", {}),
           # Qwen2's window from its second layer on.
           "qwen2": ("Qwen2Config", {"use_sliding_window": True, "max_window_layers": 1})}


@pytest.mark.newer
@pytest.mark.parametrize("family,attention,window", [(f, a, w) for f in SLIDING for a in ("eager", "sdpa")
                                                     for w in (8, SEQ)])
def test_sliding_windows(ckptplan_binary, family, attention, window):
    """Sliding-window layers, the window shorter than the sequence or as
    long: from transformers 4.53 such a layer's sdpa gets a mask (and K and
    V repeated) once the sequence reaches the window. Every stored layer
    keeps what the plan says, and a selective plan applies."""
    name, extra = SLIDING[family]
    config = getattr(transformers, name)(num_hidden_layers=3, hidden_size=64, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=192, vocab_size=VOCAB,
                                         max_position_embeddings=64, sliding_window=window, pad_token_id=0,
                                         bos_token_id=1, eos_token_id=2, **extra)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention)
    model.config.use_cache = False
    model.train()
    stored_and_selective_hold(model, batch(), grads_equal)


def stored_and_selective_hold(ref, data: dict, same_grads) -> None:
    """Every stored layer of ref keeps what the plan says, on data, and a
    selective plan between storing and checkpointing everything applies,
    keeping and recomputing what it says, with gradients same_grads as
    those of the run without it."""
    n = data["input_ids"].shape[0]
    store = ckptplan.plan(ref, "1GiB", optimizer=OPTIMIZER, batch=n, seq=SEQ, solver="none")
    base = copy.deepcopy(ref)
    torch.manual_seed(2)
    m = measure(base, data)
    for layer, got in zip(store.layers, m.layers):
        assert got.kept_bytes == layer.kept_bytes, f"batch {n}, {layer.name}: PyTorch holds {got.kept_bytes}, plan {layer.kept_bytes}"
    low = ckptplan.plan(ref, "1GiB", optimizer=OPTIMIZER, batch=n, seq=SEQ, solver="every-k").peak_bytes
    plan = ckptplan.plan(ref, (low + store.peak_bytes) // 2, optimizer=OPTIMIZER, batch=n, seq=SEQ, solver="selective")
    model = copy.deepcopy(ref)
    apply(model, plan)
    torch.manual_seed(2)
    got = measure(model, data)
    assert same_grads(model, base)
    for layer, g in zip(plan.layers, got.layers):
        assert g.kept_bytes == layer.kept_bytes, f"batch {n}, {layer.name} ({layer.mode}): PyTorch holds {g.kept_bytes}, plan {layer.kept_bytes}"
    assert got.recomputed_flops == plan.recompute_flops


@pytest.mark.skipif(transformers_major() < 5, reason="transformers 4 runs experts as ckptplan builds them")
def test_experts_on_transformers_5_are_traced(ckptplan_binary, tmp_path):
    """transformers 5 runs a mixture of experts through its experts kernels
    (grouped_mm), which the builders do not model: ckptplan.plan traces
    such a model (test_plans_hold checks the plans), and the binary asked
    to build one for 5 says to trace it instead of planning other bytes."""
    model = build("mixtral", "sdpa", "fp32")
    store = ckptplan.plan(model, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="none")
    every = ckptplan.plan(model, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="every-k")
    plan = ckptplan.plan(model, (store.peak_bytes + every.peak_bytes) // 2, optimizer=OPTIMIZER, batch=BATCH, seq=SEQ)
    # Named by the trace: the experts' grouped products, as aten ops.
    saved = [s.name for layer in plan.layers for s in layer.saved]
    assert any(".mlp.experts._grouped_mm" in n for n in saved), saved
    config = tmp_path / "config.json"
    model.config.to_json_file(config)
    release = ".".join(transformers.__version__.split(".")[:2])
    with pytest.raises(ckptplan.CkptplanError, match=f"transformers {release} runs a mixture of experts.*ckptplan trace") as err:
        _binary.call(["plan", "--budget", "1GiB", "--transformers", release, str(config)])
    assert err.value.kind == "needs_trace"


def test_shapes_beyond_the_planned_one_are_refused(ckptplan_binary):
    model = build("llama", "sdpa", "fp32")
    plan = ckptplan.plan(model, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="every-k")
    apply(model, plan)
    for n, seq in ((BATCH + 1, SEQ), (1, SEQ + 1)):
        ids = torch.zeros(n, seq, dtype=torch.long)
        with pytest.raises(ValueError, match=f"called with batch {n} and sequence {seq}.*not beyond; plan again"):
            model(input_ids=ids, labels=ids)


def test_shapes_beyond_the_planned_one_replan_where_asked(ckptplan_binary):
    """apply(..., beyond="replan"): a call beyond the planned shape runs a
    plan of its own shape within the plan's budget, and keeps what that
    plan says; where none fits the budget, the binary's error says what
    would."""
    model = build("llama", "sdpa", "fp32")
    store = ckptplan.plan(model, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="none")
    budget = store.static_bytes + (store.peak_bytes - store.static_bytes) * 9 // 10
    plan = ckptplan.plan(model, budget, optimizer=OPTIMIZER, batch=BATCH, seq=SEQ)
    apply(model, plan, beyond="replan")
    model.train()
    for n, seq in ((BATCH + 1, SEQ), (BATCH, SEQ + 3)):
        want = plan.replan(n, seq, budget=plan.budget_bytes)
        assert want.feasible and {"selective", "checkpoint"} & {l.mode for l in want.layers}, want.layers
        ids = torch.zeros(n, seq, dtype=torch.long)
        with forward_kept(model) as kept:
            out = model(input_ids=ids, labels=ids)
            assert kept() == [l.kept_bytes for l in want.layers], (n, seq)
        out.loss.backward()
    ids = torch.zeros(4 * BATCH, 4 * SEQ, dtype=torch.long)
    with pytest.raises(ckptplan.CkptplanError, match="does not fit") as err:
        model(input_ids=ids, labels=ids)
    assert err.value.kind == "infeasible"
    with pytest.raises(ckptplan.CkptplanUsageError, match='beyond is "error" or "replan"'):
        apply(model, plan, beyond="grow")


def padded_batch(n: int, seq: int, lengths: "list[int]") -> dict:
    """A batch as a data collator pads it: n sequences of those lengths,
    padded on the right to seq, the padding masked and its labels -100."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, VOCAB, (n, seq), generator=g)
    mask = torch.zeros(n, seq, dtype=torch.long)
    for i, k in enumerate(lengths):
        mask[i, :k] = 1
    ids = ids.masked_fill(mask == 0, 0)
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


SMALLER = [("one sequence", 1, SEQ, None), ("shorter", BATCH, SEQ - 5, None),
           ("padded", BATCH, SEQ, [SEQ, SEQ - 6]), ("padded and shorter", BATCH, SEQ - 3, [SEQ - 3, 4])]


def bool_masks(attention: str) -> bool:
    """Whether a padded batch gives each layer's sdpa a boolean mask, which
    PyTorch's sdpa turns into one of the query's dtype and saves in every
    layer: from transformers 4.53 (its masking_utils), where 4.46 gives
    every layer one additive mask the model made."""
    release = tuple(int(x) for x in transformers.__version__.split(".")[:2])
    return attention == "sdpa" and release >= (4, 53)


@pytest.mark.parametrize("family,attention,dtype,lora", [("llama", "sdpa", "fp32", ""), ("llama", "eager", "fp32", "attn"),
                                                         ("qwen2", "sdpa", "bf16", ""), ("gpt2", "eager", "fp32", "")])
@pytest.mark.parametrize("source,padded", [("plan", False), ("plan", True), ("json", False)])
def test_shapes_up_to_the_planned_one_hold(ckptplan_binary, family, attention, dtype, lora, source, padded):
    """A selective plan for batch 2 and sequence 16 (of padded batches, or
    not) runs what a training loop brings it: one sequence (an epoch's
    short last batch), shorter sequences, batches a collator padded (with
    their attention mask), in turn on the same applied model; each call's
    gradients are those of the run without the plan. ckptplan.plan's plan
    runs each batch but the planned one as planned again for its shape and
    padding within the planned peak: each layer keeps what that plan says,
    to the byte. A plan read from JSON runs its own decisions: each layer
    keeps less than the plan says at a smaller shape, and recomputes no
    more."""
    ref = build(family, attention, dtype, lora=lora)
    kw = dict(optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, padded=padded)
    low = ckptplan.plan(ref, "1GiB", solver="every-k", **kw).peak_bytes
    high = ckptplan.plan(ref, "1GiB", solver="none", **kw).peak_bytes
    plan = ckptplan.plan(ref, (low + high) // 2, solver="selective", **kw)
    assert "selective" in {l.mode for l in plan.layers}
    if source == "json":
        plan = ckptplan.Plan.from_json(plan.raw)
    model = copy.deepcopy(ref)
    apply(model, plan)
    # A plan read from JSON knows no padding: under sdpa from 4.53 a
    # padded batch's layers save a mask it does not have.
    shapes = [(name, n, seq, lengths) for name, n, seq, lengths in SMALLER
              if source == "plan" or lengths is None or not bool_masks(attention)]
    for name, n, seq, lengths in [*shapes, ("planned", BATCH, SEQ, None)]:
        data = padded_batch(n, seq, lengths or [seq] * n)
        if lengths is None:
            del data["attention_mask"]
        base = copy.deepcopy(ref)
        torch.manual_seed(2)
        measure(base, data)
        model.zero_grad(set_to_none=True)
        torch.manual_seed(2)
        got = measure(model, data)
        assert grads_equal(model, base), f"{name}: gradients differ"
        pads = lengths is not None and min(lengths) < seq
        if source == "json" or (n, seq, pads) == (BATCH, SEQ, padded):
            expected = plan
        elif source == "plan":
            # The plan ckptplan.apply runs this call with.
            expected = plan.replan(n, seq, budget=plan.peak_bytes + plan.reserve_bytes, padded=pads)
            assert expected.feasible and expected.peak_bytes <= plan.peak_bytes
        for layer, g in zip(plan.layers, got.layers):
            if source == "json" and (n, seq) != (BATCH, SEQ):
                assert 0 < g.kept_bytes < layer.kept_bytes, f"{name}, {layer.name}: {g.kept_bytes}, plan {layer.kept_bytes}"
            else:
                want = expected.layers[int(layer.name.split(".")[-1])]
                assert g.kept_bytes == want.kept_bytes, f"{name}, {layer.name} ({want.mode}): {g.kept_bytes} != {want.kept_bytes}"
        if source == "plan" or (n, seq) == (BATCH, SEQ):
            assert got.recomputed_flops == expected.recompute_flops, name
        else:
            assert got.recomputed_flops <= plan.recompute_flops, name


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_padded_plans_count_the_masks(ckptplan_binary, attention):
    """Storing everything, a padded batch's layers keep what the plan for
    padded batches says: under sdpa from transformers 4.53 a copy of the
    mask in each layer, [batch, 1, seq, seq] in the model's dtype, with K
    and V repeated, which the plan for unpadded batches does not have;
    under eager, or sdpa before 4.53, what that plan says."""
    ref = build("llama", attention, "fp32")
    flat = ckptplan.plan(ref, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="none")
    plan = ckptplan.plan(ref, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="none", padded=True)
    got = measure(copy.deepcopy(ref), padded_batch(BATCH, SEQ, [SEQ, SEQ - 6]))
    assert [g.kept_bytes for g in got.layers] == [l.kept_bytes for l in plan.layers]
    # From 4.53 the unpadded plan is not what a padded batch keeps: each
    # layer keeps the mask too, and without grouped K and V (sdpa takes
    # them, enable_gqa, only without a mask) what its kernel saves differs.
    same = [l.kept_bytes for l in plan.layers] == [f.kept_bytes for f in flat.layers]
    assert same != bool_masks(attention)


def test_a_layer_that_saves_otherwise_is_named(ckptplan_binary):
    """A selective plan applied to a layer that saves other tensors (here:
    made for an MLP of 192, run with one of 128) fails at the layer's first
    call, naming the first saved activation that differs, the op that made
    it, the plan's tensor there and the versions."""
    planned = build("llama", "sdpa", "fp32")
    low = ckptplan.plan(planned, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="every-k").peak_bytes
    high = ckptplan.plan(planned, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="none").peak_bytes
    plan = ckptplan.plan(planned, (low + high) // 2, optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="selective")
    assert "selective" in {l.mode for l in plan.layers}
    config = copy.deepcopy(planned.config)
    config.intermediate_size = 128
    other = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    other.train()
    apply(other, plan)
    with pytest.raises(ValueError) as err:
        other(**batch(), labels=batch()["input_ids"])
    msg = str(err.value)
    assert "does not save what its plan says: its saved activation" in msg
    assert "made by aten." in msg and "where the plan has layers." in msg
    assert f"runs transformers {transformers.__version__} and torch {torch.__version__}" in msg


def test_unplannable_budget_is_a_clear_error(ckptplan_binary):
    model = build("llama", "sdpa", "fp32")
    with pytest.raises(ckptplan.CkptplanError, match="LlamaForCausalLM does not fit"):
        ckptplan.plan(model, "1KiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ)


def test_a_mask_changed_in_place_cannot_be_kept(ckptplan_binary):
    """A plan that keeps the CPU dropout's mask, which PyTorch fills in
    place after allocating it, is refused with a message, not PyTorch's
    error from inside the backward."""
    import dataclasses

    model = build("gpt2", "eager", "fp32", 0.1)
    low = ckptplan.plan(model, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="every-k").peak_bytes
    high = ckptplan.plan(model, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="none").peak_bytes
    for k in range(1, 8):  # a budget where some layer is selective
        plan = ckptplan.plan(model, low + (high - low) * k // 8, optimizer=OPTIMIZER, batch=BATCH, seq=SEQ,
                             solver="selective")
        layers = list(plan.layers)
        i = next((i for i, l in enumerate(layers) if l.mode == "selective"), None)
        if i is not None:
            break
    assert i is not None, "no budget between every-k's peak and storing everything has a selective layer"
    saved = tuple(dataclasses.replace(s, keep=s.name.endswith("attn_dropout:mask")) for s in layers[i].saved)
    assert any(s.keep for s in saved)
    layers[i] = dataclasses.replace(layers[i], saved=saved)
    apply(model, dataclasses.replace(plan, layers=tuple(layers)))
    with pytest.raises(ValueError, match="changes in place"):
        model(**batch(), labels=batch()["input_ids"])


def test_bad_arguments_say_what_is_wrong(ckptplan_binary):
    """An argument the binary refuses comes back as its one-line reason."""
    model = build("llama", "sdpa", "fp32")
    with pytest.raises(ckptplan.CkptplanError, match="invalid byte count") as err:
        ckptplan.plan(model, "lots", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ)
    assert err.value.code == 2 and "usage:" not in str(err.value)
    with pytest.raises(ckptplan.CkptplanError, match="unknown device"):
        ckptplan.plan(model, optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, device="tpu")


@pytest.mark.parametrize("name", ["mistral-nemo", "gemma-7b", "phi-3-mini-4k", "starcoder2-3b", "granite-3.3-8b",
                                  "gemma-2-9b", "mixtral-8x7b", "qwen1.5-moe-a2.7b", "llama-3.2-1b", "qwen2.5-7b",
                                  "phi-4",
                                  pytest.param("qwen3-0.6b", marks=NEWER),
                                  pytest.param("qwen3-30b-a3b", marks=NEWER_MOE)])
def test_parameters_of_a_full_size_config(ckptplan_binary, name):
    """Full-size configs: Mistral-NeMo's (heads of 128 where hidden/heads is
    160), Gemma-7B's (tied, heads of 256), Phi-3-mini's (fused
    projections), the mixtures of experts' (Qwen1.5-MoE's shared expert):
    ckptplan counts the parameters transformers builds, on the meta
    device."""
    import json
    import os

    from ckptplan import _binary

    path = os.path.join(os.path.dirname(__file__), "..", "..", "graphio", "testdata", "hf", name + ".json")
    config = transformers.AutoConfig.for_model(**{k: v for k, v in json.load(open(path)).items()
                                                   if k not in ("architectures", "transformers_version")
                                                   and not k.startswith("_")})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    out = json.loads(_binary.call(["inspect", "--format", "json", path]))
    assert out["parameters"] == model.num_parameters()
