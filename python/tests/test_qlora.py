"""QLoRA measured on bitsandbytes itself, on the CPU.

bitsandbytes (python/requirements-quant.txt) quantizes a tiny Llama's
decoder linears as transformers does when it loads a model in 4 or 8 bits
(``Params4bit`` / ``Int8Params`` moved to the device), PEFT adds LoRA
adapters over them, and the tests count what the model then holds — every
storage of its parameters and of the quantization states, each once —
against ckptplan's static memory; bitsandbytes' 8-bit and paged optimizers
make their state as their first step does, counted against ckptplan's
optimizer bytes; and one training step of the 4-bit model keeps, layer by
layer, what ckptplan's plan says. Only .ci/run's run with bitsandbytes
(CKPTPLAN_QUANT=1) runs them.
"""
from __future__ import annotations

import copy
import json
import os
import tempfile
from typing import Optional

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

pytestmark = [pytest.mark.quant,
              pytest.mark.skipif(not os.environ.get("CKPTPLAN_QUANT"),
                                 reason="run with python/requirements-quant.txt's bitsandbytes")]

import ckptplan  # noqa: E402
from ckptplan import _binary, apply, measure  # noqa: E402
from ckptplan.introspect import describe  # noqa: E402

BATCH, SEQ, VOCAB = 2, 16, 128
ALL_LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def quantize(model: "torch.nn.Module", quant: str, double: bool) -> None:
    """Replace the decoder layers' linears of model by bitsandbytes' 4- or
    8-bit ones holding the same weights, quantized as transformers' loader
    quantizes them (the parameter built on the CPU, then moved)."""
    import bitsandbytes as bnb

    dtype = next(model.parameters()).dtype
    for name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if not isinstance(child, torch.nn.Linear) or ".layers." not in f".{name}.":
                continue
            bias = child.bias is not None
            if quant == "int8":
                new = bnb.nn.Linear8bitLt(child.in_features, child.out_features, bias=bias, has_fp16_weights=False)
                new.weight = bnb.nn.Int8Params(child.weight.data, requires_grad=False, has_fp16_weights=False)
            else:
                new = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=bias, compute_dtype=dtype,
                                        compress_statistics=double, quant_type=quant)
                new.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False,
                                               compress_statistics=double, quant_type=quant)
            if bias:
                new.bias = child.bias
            setattr(parent, child_name, new.to("cpu"))


def build(quant: Optional[str], double: bool, dtype=None, rank: int = 16, targets=ALL_LINEARS) -> "torch.nn.Module":
    """A tiny Llama in bf16 with random weights, its decoder linears
    quantized (unless quant is None), and PEFT's rank-rank adapters (fp32,
    its default) over
    targets. The sizes make some adapters' tensors small enough for fp32
    optimizer state (< 4096 elements) and some large enough for 8-bit, and
    give weights whose 64-blocks do not fill a 256-block of maxima."""
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=272, vocab_size=VOCAB,
                                      max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                          torch_dtype=dtype or torch.bfloat16)
    if quant is not None:
        quantize(model, quant, double)
    cfg = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(targets), lora_dropout=0.0)
    return peft.get_peft_model(model, cfg)


def storages(tensors) -> int:
    """The bytes of the distinct storages behind tensors (None skipped)."""
    seen = {}
    for t in tensors:
        if t is not None:
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def held_by_model(model: "torch.nn.Module") -> int:
    """What model holds: its parameters and the tensors of every
    quantization state, each storage once."""
    tensors = list(model.parameters())
    for m in model.modules():
        w = getattr(m, "weight", None)
        state = getattr(w, "quant_state", None)
        if state is not None:
            tensors += [state.absmax, state.code]
            if state.nested:
                tensors += [state.state2.absmax, state.state2.code, state.offset]
        for name in ("CB", "SCB"):
            tensors.append(getattr(w, name, None))
        lt = getattr(m, "state", None)
        tensors += [getattr(lt, "CB", None), getattr(lt, "SCB", None)]
    return storages(tensors)


def cost(model: "torch.nn.Module", *flags: str) -> dict:
    """ckptplan's cost of model (as describe reads it) with flags."""
    setup = describe(model, batch=BATCH, seq=SEQ)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "config.json")
        with open(path, "w") as f:
            json.dump(setup.config, f)
        return json.loads(_binary.call(["cost", "--format", "json", *setup.flags(), *flags, path]))


def batch() -> dict:
    g = torch.Generator().manual_seed(1)
    return {"input_ids": torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)}


@pytest.mark.parametrize("quant,double", [("nf4", False), ("nf4", True), ("fp4", False), ("fp4", True)])
def test_4bit_weights_are_what_bitsandbytes_stores(ckptplan_binary, quant, double):
    """ckptplan reads the quantization off the live model, and its weight
    bytes are every storage the model holds: the packed values, each
    weight's maxima (double quantized: their bytes, 256-blocks' maxima and
    offset) and maps, the bf16 embeddings, norms and head, the adapters."""
    model = build(quant, double)
    setup = describe(model, batch=BATCH, seq=SEQ)
    assert (setup.quant, setup.double_quant) == (quant, double)
    static = cost(model)["static"]
    assert static["weights_bytes"] == held_by_model(model)


def test_int8_weights_are_what_bitsandbytes_stores(ckptplan_binary):
    """The int8 values and the fp32 scale a row of every decoder linear;
    ckptplan.plan refuses the model (its product keeps inputs checkpointing
    cannot free), so the flag is given to the binary here."""
    model = build("int8", False)
    with pytest.raises(ValueError, match="8 bits"):
        describe(model, batch=BATCH, seq=SEQ)
    got = cost(build(None, False), "--quant", "int8")  # the same model before quantization
    assert got["static"]["weights_bytes"] == held_by_model(model)


@pytest.mark.parametrize("name,cls", [("adamw8bit", "AdamW8bit"), ("paged-adamw8bit", "PagedAdamW8bit"),
                                      ("paged-adamw", "PagedAdamW")])
def test_optimizer_state_is_what_bitsandbytes_makes(ckptplan_binary, name, cls):
    """After one backward, the adapters' gradients are ckptplan's gradient
    bytes; bitsandbytes' optimizer makes its state as its first step does
    (init_state, parameter by parameter; the update itself runs on CUDA
    only), and that state, each storage once, is ckptplan's optimizer
    bytes: 8-bit moments with a maximum a 256-block for tensors of 4096
    elements or more, fp32 ones below, the two maps once."""
    import bitsandbytes as bnb

    model = build("nf4", True)
    out = model(**batch(), labels=batch()["input_ids"])
    out.loss.backward()
    trained = [p for p in model.parameters() if p.requires_grad]
    assert {p.numel() >= 4096 for p in trained} == {True, False}, "the sizes no longer test both states"
    opt = getattr(bnb.optim, cls)(trained)
    for gi, group in enumerate(opt.param_groups):
        for pi, p in enumerate(group["params"]):
            opt.init_state(group, p, gi, pi)
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    static = cost(model, "--optimizer", name)["static"]
    assert static["gradients_bytes"] == storages(p.grad for p in trained)
    assert static["optimizer_bytes"] == storages(state)
    assert static.get("paged", False) == ("paged" in name)


@pytest.mark.parametrize("name,cls", [("paged-adamw8bit", "PagedAdamW8bit"), ("paged-adamw", "PagedAdamW")])
def test_paged_state_is_what_bitsandbytes_pages(ckptplan_binary, monkeypatch, name, cls):
    """A fully fine-tuned tiny Llama whose embedding and head have more
    than 10^5 elements, whose MLP weights exactly 10^5, and whose attention
    weights and norms fewer: bitsandbytes' paged optimizer makes its state as its
    first step does, asking for unified memory (``get_paged``, CUDA's
    managed memory, here a CPU tensor marked as it marks its own) for the
    tensors it pages. Those are ckptplan's paged bytes, and all the state
    its optimizer bytes."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as F

    def get_paged(*shape, dtype=torch.float32, device=None):
        out = torch.empty(*shape, dtype=dtype)
        out.is_paged = True
        return out

    monkeypatch.setattr(F, "get_paged", get_paged)
    monkeypatch.setattr(F, "fill", lambda t, value: t.fill_(value))
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=100, num_attention_heads=5,
                                      num_key_value_heads=1, intermediate_size=1000, vocab_size=1024,
                                      max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                                          torch_dtype=torch.bfloat16)
    sizes = {min(p.numel() - 100_000, 1) for p in model.parameters()}
    assert {-1, 0, 1} <= {max(n, -1) for n in sizes}, "the sizes no longer test both sides of 10^5 and 10^5 itself"
    opt = getattr(bnb.optim, cls)(model.parameters())
    for gi, group in enumerate(opt.param_groups):
        for pi, p in enumerate(group["params"]):
            opt.init_state(group, p, gi, pi)
    state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    paged = [t for t in state if getattr(t, "is_paged", False)]
    static = cost(model, "--optimizer", name)["static"]
    assert paged and static["paged_bytes"] == storages(paged)
    assert static["optimizer_bytes"] == storages(state)


@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], ALL_LINEARS])
def test_4bit_layers_keep_what_ckptplan_predicts(ckptplan_binary, targets):
    """A training step of the nf4 model (double quantized, fp32 adapters
    over bf16): every layer stored keeps what the plan says; planned at a
    budget between checkpointing everything and storing everything and
    applied, each layer holds what the plan says, the gradients are those
    of the run without a plan and the recomputed FLOPs the plan's."""
    ref = build("nf4", True, rank=4, targets=targets)
    store = ckptplan.plan(ref, "1GiB", batch=BATCH, seq=SEQ, solver="none")
    m = measure(copy.deepcopy(ref), batch())
    for layer, got in zip(store.layers, m.layers):
        assert got.kept_bytes == layer.kept_bytes, f"{layer.name}: PyTorch holds {got.kept_bytes}, plan {layer.kept_bytes}"
    every = ckptplan.plan(ref, "1GiB", batch=BATCH, seq=SEQ, solver="every-k")
    budget = (every.peak_bytes + store.peak_bytes) // 2
    plan = ckptplan.plan(ref, budget, batch=BATCH, seq=SEQ)
    assert {l.mode for l in plan.layers} != {"store"}
    model = copy.deepcopy(ref)
    apply(model, plan)
    torch.manual_seed(2)
    got = measure(model, batch())
    base = copy.deepcopy(ref)
    torch.manual_seed(2)
    measure(base, batch())
    for p, q in zip(model.parameters(), base.parameters()):
        assert (p.grad is None) == (q.grad is None) and (p.grad is None or torch.equal(p.grad, q.grad))
    for layer, g in zip(plan.layers, got.layers):
        assert g.kept_bytes == layer.kept_bytes, f"{layer.name} ({layer.mode}): PyTorch holds {g.kept_bytes}, plan {layer.kept_bytes}"
    assert got.recomputed_flops == plan.recompute_flops


def test_a_model_cast_for_kbit_training_is_refused():
    """prepare_model_for_kbit_training casts the other weights to fp32
    while the 4-bit linears compute in bf16: not one dtype, said so."""
    model = build("nf4", True)
    model = peft.prepare_model_for_kbit_training(model.get_base_model(), use_gradient_checkpointing=False)
    with pytest.raises(ValueError, match="compute in torch.bfloat16 over torch.float32"):
        describe(model, batch=BATCH, seq=SEQ)


def test_partly_quantized_layers_are_refused():
    model = build("nf4", False)
    layer = model.get_base_model().model.layers[1].mlp
    layer.down_proj = torch.nn.Linear(272, 64, bias=False, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="are in 4 bits, but not"):
        describe(model, batch=BATCH, seq=SEQ)
