"""The tracer against the builders and against PyTorch.

A traced graph is planned by the same binary as a built one: for every
family ckptplan builds, the traced layers must keep the bytes and cost the
FLOPs the builder's do; for model types it does not build, the bytes each
layer saves must be the bytes PyTorch saves (saved-tensor hooks, measured
in the test), and the parameters those transformers builds.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ckptplan import _binary  # noqa: E402
from ckptplan.introspect import describe  # noqa: E402
from ckptplan import measure  # noqa: E402
from ckptplan import trace  # noqa: E402
from test_real_stack import BATCH, SEQ, VOCAB, DTYPES, batch, build  # noqa: E402


# The promises these tests check are each layer's; an optimizer with no
# state (and gradients held the whole step, as before it runs) keeps the
# step's peak in the forward and backward, so that budgets between
# checkpointing and storing everything choose between them.
OPTIMIZER = "none"

def cost(path: str, flags=()) -> dict:
    """The binary's cost JSON: block name → block."""
    out = json.loads(_binary.call(["cost", "--format", "json", *flags, path]))
    return out


def traced_cost(model, tmp_path) -> dict:
    path = tmp_path / "traced.yaml"
    path.write_text(trace(model, batch=BATCH, seq=SEQ))
    return cost(str(path))


BUILT = [(f, a, d, p, lora) for f in ("llama", "mistral", "qwen2", "gpt2", "gemma", "gemma2", "phi3", "starcoder2",
                                       "granite", "mistral-hd", "llama-bias")
         for a in ("eager", "sdpa") for d in ("fp32", "bf16") for p, lora in ((0.0, ""), (0.1, "attn"))]


@pytest.mark.parametrize("family,attention,dtype,dropout,lora", BUILT)
def test_traced_layers_agree_with_the_builder(ckptplan_binary, tmp_path, family, attention, dtype, dropout, lora):
    """Each traced layer keeps the builder's bytes and costs its FLOPs,
    forward and backward; the parameters are the same."""
    model = build(family, attention, dtype, dropout, lora)
    setup = describe(model, batch=BATCH, seq=SEQ)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(setup.config))
    built = cost(str(config), setup.flags())
    traced = traced_cost(model, tmp_path)
    got = {b["name"]: b for b in traced["blocks"]}
    layers = [b for b in built["blocks"] if b["name"].startswith("layers.")]
    assert len(layers) == 3
    for b in layers:
        t = got[b["name"]]
        for key in ("saved_bytes", "forward_flops", "backward_flops"):
            assert t[key] == b[key], f"{b['name']} {key}: traced {t[key]}, built {b[key]}"
    assert traced["static"]["parameters"] == built["static"]["parameters"] == model.num_parameters()
    assert traced["static"]["trainable_parameters"] == built["static"]["trainable_parameters"]
    # PEFT's fp32 adapters over 16-bit weights are counted in fp32.
    for key in ("weights_bytes", "gradients_bytes", "optimizer_bytes"):
        assert traced["static"][key] == built["static"][key], key
    assert traced["static"]["weights_bytes"] == sum(p.numel() * p.element_size() for p in model.parameters())


# A mixture of experts whose experts each run on the tokens routed to them
# (transformers 4, and 5 asked for its "eager" experts).
ROUTED = {"model_type": "mixtral", "num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
          "num_key_value_heads": 2, "intermediate_size": 32, "vocab_size": 64, "num_local_experts": 4,
          "experts_implementation": "eager"}


def test_routing_cannot_be_traced():
    """A mixture of experts' shapes depend on its routing: the tracer says
    so rather than guess."""
    from ckptplan import TraceError

    config = transformers.AutoConfig.for_model(**ROUTED)
    with pytest.raises(TraceError, match="depends on the data.*mixture of experts"):
        trace(config, batch=BATCH, seq=SEQ)


# Model types ckptplan has no builder for, as small as transformers allows.
UNBUILT = {
    "gpt_neox": dict(rotary_pct=0.25),  # parallel residual, partial rotary, fused qkv
    "olmo": dict(),  # LayerNorm without weights
    "cohere": dict(),  # parallel residual, interleaved rotary, logit scale
    "phi": dict(partial_rotary_factor=0.5),  # Phi-2: LayerNorm, GELU MLP, partial rotary
    "falcon": dict(new_decoder_architecture=False, multi_query=True),  # one kv head
    "stablelm": dict(num_key_value_heads=4, partial_rotary_factor=0.25),
}
# And two the pinned transformers lacks (.ci/run runs them with the newer
# one): Gemma 3's text model (q and k norms, five sliding-window layers
# to one global, each with rotary tables of its own base) and OLMo 2
# (norms after attention and MLP, q and k normalized over all heads).
NEWER_TYPES = {
    "gemma3_text": dict(num_key_value_heads=2, head_dim=32, sliding_window=8, sliding_window_pattern=2,
                        query_pre_attn_scalar=24),
    "olmo2": dict(num_key_value_heads=2),
}
UNBUILT.update(NEWER_TYPES)


def types_with(*rest, newer_only=False):
    """pytest params of every unbuilt model type with rest, those that need
    the newer transformers marked."""
    out = []
    for t in UNBUILT:
        if t in NEWER_TYPES:
            marks = [pytest.mark.newer, pytest.mark.skipif(
                t not in transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES
                and not os.environ.get("CKPTPLAN_NEWER"), reason=f"transformers {transformers.__version__} has no {t}")]
            out += [pytest.param(t, *r, marks=marks) for r in rest]
        elif not newer_only:
            out += [(t, *r) for r in rest]
    return out


def build_unbuilt(model_type: str, attention: str, dtype: str, dropout: float = 0.0):
    kw = dict(num_hidden_layers=3, hidden_size=64, num_attention_heads=4, intermediate_size=192,
              vocab_size=VOCAB, max_position_embeddings=64, **UNBUILT[model_type])
    if dropout:
        kw.update(attention_dropout=dropout, hidden_dropout=dropout)
    config = transformers.AutoConfig.for_model(model_type, **kw)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention,
                                                          torch_dtype=DTYPES[dtype])
    model.config.use_cache = False  # as ckptplan.apply leaves it
    model.train()
    return model


@pytest.mark.parametrize("model_type,attention,dtype", types_with(*[(a, d) for a in ("eager", "sdpa")
                                                                       for d in ("fp32", "bf16")]))
def test_traced_model_keeps_what_pytorch_saves(ckptplan_binary, tmp_path, model_type, attention, dtype):
    """For a model type with no builder, the traced plan's bytes per layer
    are the bytes PyTorch saves, and its parameters transformers'."""
    model = build_unbuilt(model_type, attention, dtype)
    traced = traced_cost(model, tmp_path)
    got = {b["name"]: b for b in traced["blocks"]}
    m = measure(model, batch())
    assert len(m.layers) == 3
    for layer in m.layers:
        assert got[layer.name]["saved_bytes"] == layer.saved_bytes, (
            f"{layer.name}: PyTorch saves {layer.saved_bytes}, traced {got[layer.name]['saved_bytes']}")
    assert traced["static"]["parameters"] == model.num_parameters()


def test_traced_dropout_keeps_its_masks(ckptplan_binary, tmp_path):
    """GPT-NeoX with attention and residual dropout: the masks each layer
    keeps are counted as PyTorch keeps them."""
    model = build_unbuilt("gpt_neox", "eager", "fp32", dropout=0.1)
    traced = traced_cost(model, tmp_path)
    got = {b["name"]: b for b in traced["blocks"]}
    m = measure(model, batch())
    plain = traced_cost(build_unbuilt("gpt_neox", "eager", "fp32"), tmp_path)
    for layer in m.layers:
        assert got[layer.name]["saved_bytes"] == layer.saved_bytes
        assert layer.saved_bytes > next(b for b in plain["blocks"] if b["name"] == layer.name)["saved_bytes"]


def with_lora(model, targets):
    """model with PEFT LoRA adapters of rank 4 on targets, PEFT's defaults
    otherwise (fp32 adapters over 16-bit weights), dropout 0.1."""
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=targets)
    torch.manual_seed(3)
    model = peft.get_peft_model(model, config)
    model.train()
    return model


TRACED_PLANS = [
    ("gpt_neox", "sdpa", "fp32", 0.0, ""), ("gpt_neox", "sdpa", "bf16", 0.0, ""),
    ("gpt_neox", "eager", "fp32", 0.1, "query_key_value,dense"), ("gpt_neox", "sdpa", "bf16", 0.1, "query_key_value,dense"),
    ("olmo", "sdpa", "bf16", 0.0, ""), ("phi", "eager", "fp32", 0.0, ""), ("falcon", "sdpa", "bf16", 0.0, ""),
    ("cohere", "sdpa", "fp32", 0.0, ""), ("stablelm", "eager", "bf16", 0.0, ""),
    # A family ckptplan builds, traced when asked.
    ("llama", "sdpa", "bf16", 0.1, "q_proj,v_proj"),
] + types_with(("sdpa", "bf16", 0.1, "q_proj,v_proj"), ("eager", "fp32", 0.0, ""), newer_only=True)


def build_any(model_type, attention, dtype, dropout, lora):
    if model_type in UNBUILT:
        model = build_unbuilt(model_type, attention, dtype, dropout)
    else:
        model = build(model_type, attention, dtype, dropout)
    return with_lora(model, lora.split(",")) if lora else model


@pytest.mark.parametrize("solver", ["selective", "optimal"])
@pytest.mark.parametrize("model_type,attention,dtype,dropout,lora", TRACED_PLANS)
def test_traced_plans_hold(ckptplan_binary, model_type, attention, dtype, dropout, lora, solver):
    """ckptplan.plan traces a model it has no builder for (or any, asked),
    and the plan applies: at three budgets between checkpointing and
    storing every layer, each layer holds what the plan says, the gradients
    are those of the run without a plan, and the FLOPs recomputed in
    backward are the plan's."""
    import copy

    import ckptplan
    from ckptplan import apply

    ref = build_any(model_type, attention, dtype, dropout, lora)
    traced = True if model_type not in UNBUILT else None  # by default for those
    base = measure(copy.deepcopy(ref), batch())
    store = ckptplan.plan(ref, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="none", traced=traced)
    every = ckptplan.plan(ref, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="every-k", traced=traced)
    low, high = every.peak_bytes, store.peak_bytes
    assert low < high
    assert store.dtype == dtype, "the training dtype is the weights', not the fp32 adapters'"
    modes = set()
    for budget in [low + (high - low) * f // 4 for f in (1, 2, 3)]:
        plan = ckptplan.plan(ref, budget, optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver=solver, traced=traced)
        assert plan.peak_bytes <= budget
        model = copy.deepcopy(ref)
        apply(model, plan)
        torch.manual_seed(2)  # the same dropout masks in both runs
        m = measure(model, batch())
        base_model = copy.deepcopy(ref)
        torch.manual_seed(2)
        measure(base_model, batch())
        for p, q in zip(model.parameters(), base_model.parameters()):
            assert (p.grad is None) == (q.grad is None) and (p.grad is None or torch.equal(p.grad, q.grad)), (
                f"{solver} at {budget}: gradients differ")
        for layer, got in zip(plan.layers, m.layers):
            modes.add(layer.mode)
            assert got.kept_bytes == layer.kept_bytes, (
                f"{solver} at {budget}, {layer.name} ({layer.mode}): PyTorch holds {got.kept_bytes}, "
                f"plan {layer.kept_bytes}")
            assert got.host_bytes == layer.host_bytes, (
                f"{solver} at {budget}, {layer.name} ({layer.mode}): host {got.host_bytes}, plan {layer.host_bytes}")
        assert m.recomputed_flops == plan.recompute_flops, (
            f"{solver} at {budget}: recomputed {m.recomputed_flops} FLOPs, plan {plan.recompute_flops}")
        assert m.backward_flops - base.backward_flops == plan.recompute_flops
    assert ("selective" if solver == "selective" else "checkpoint") in modes


def test_traced_plan_under_autocast(ckptplan_binary):
    """fp32 weights under bf16 autocast (the Trainer's bf16=True): the
    trace runs under autocast, and its plan holds as measured under it."""
    import copy

    import ckptplan
    from ckptplan import apply

    ref = build_unbuilt("gpt_neox", "sdpa", "fp32")
    store = ckptplan.plan(ref, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="none", autocast="bf16")
    every = ckptplan.plan(ref, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="every-k", autocast="bf16")
    stored = measure(copy.deepcopy(ref), batch(), autocast=torch.bfloat16)
    assert [l.saved_bytes for l in stored.layers] == [l.kept_bytes for l in store.layers]
    assert store.layers[0].kept_bytes != ckptplan.plan(ref, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="none").layers[0].kept_bytes
    plan = ckptplan.plan(ref, (store.peak_bytes + every.peak_bytes) // 2, optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, autocast="bf16")
    model = copy.deepcopy(ref)
    apply(model, plan)
    m = measure(model, batch(), autocast=torch.bfloat16)
    assert "selective" in {l.mode for l in plan.layers}
    assert [l.kept_bytes for l in m.layers] == [l.kept_bytes for l in plan.layers]
    assert m.recomputed_flops == plan.recompute_flops


def test_public_functions_stay_functions(ckptplan_binary):
    """In a fresh interpreter, measuring (which imports the apply runtime)
    and planning a traced model (which imports the tracer) leave
    ckptplan.apply and ckptplan.trace the functions."""
    code = (
        "import torch, transformers, ckptplan\n"
        "c = transformers.AutoConfig.for_model('gpt_neox', num_hidden_layers=2, hidden_size=32, "
        "num_attention_heads=2, intermediate_size=64, vocab_size=64)\n"
        "m = transformers.AutoModelForCausalLM.from_config(c)\n"
        "ckptplan.measure(m, {'input_ids': torch.zeros(1, 8, dtype=torch.long)})\n"
        "ckptplan.plan(m, '1GiB', batch=1, seq=8)\n"
        "print(callable(ckptplan.apply), callable(ckptplan.trace), callable(ckptplan.measure))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["True", "True", "True"]


def test_plan_traces_only_what_it_cannot_build(ckptplan_binary):
    """A model type with a builder is planned from its config (the
    builder's op names in its keep sets), one without is traced (aten op
    names); logits_dtype does not apply to a traced model."""
    import ckptplan

    budget = lambda m: (ckptplan.plan(m, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="none").peak_bytes  # noqa: E731
                        + ckptplan.plan(m, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="every-k").peak_bytes) // 2
    llama = build("llama", "sdpa", "fp32")
    built = ckptplan.plan(llama, budget(llama), optimizer=OPTIMIZER, batch=BATCH, seq=SEQ)
    neox = build_unbuilt("gpt_neox", "sdpa", "fp32")
    traced = ckptplan.plan(neox, budget(neox), optimizer=OPTIMIZER, batch=BATCH, seq=SEQ)
    saved = lambda p: [s.name.split(".", 2)[2] for l in p.layers for s in l.saved]  # noqa: E731
    assert saved(built) and saved(traced), "both plans have selective layers"
    # The builder names a layer's tensors by module (mlp.up_proj), the
    # trace by module and ATen op (mlp.dense_h_to_4h.addmm).
    assert "mlp.up_proj" in saved(built) and not any(n.endswith((".mm", ".addmm")) for n in saved(built))
    assert "mlp.dense_h_to_4h.addmm" in saved(traced)
    assert traced.attention == "sdpa" and traced.model == "GPTNeoXForCausalLM"
    with pytest.raises(ValueError, match="logits_dtype does not apply to a traced model"):
        ckptplan.plan(neox, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, logits_dtype="fp32")


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


def run_trace(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptplan", "trace", *args], capture_output=True, text=True,
                          env=_env(), timeout=300)


def test_trace_command_writes_a_graph_the_binary_plans(ckptplan_binary, tmp_path):
    """ckptplan trace CONFIG -o FILE, then ckptplan plan FILE: a config of a
    type with no builder, planned under a budget that needs recomputation."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "gpt_neox", "num_hidden_layers": 4, "hidden_size": 64,
                                  "num_attention_heads": 4, "intermediate_size": 256, "vocab_size": 128,
                                  "rotary_pct": 0.25}))
    out = tmp_path / "neox.yaml"
    p = run_trace(str(config), "--seq", "64", "--batch", "2", "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""  # progress is for a terminal
    # The binary, asked for a config.json of this type, says how to trace.
    with pytest.raises(_binary.CkptplanError) as err:
        _binary.call(["plan", "--budget", "1GiB", str(config)])
    assert "ckptplan trace" in err.value.message
    full = json.loads(_binary.call(["plan", "--format", "json", "--solver", "none", "--budget", "1GiB", str(out)]))
    stored = full["peak_bytes"]
    plan = json.loads(_binary.call(["plan", "--format", "json", "--budget", f"{stored - 1}B", str(out)]))
    assert plan["feasible"] and plan["peak_bytes"] < stored
    with pytest.raises(_binary.CkptplanError) as err:
        _binary.call(["plan", "--budget", "1GiB", "--seq", "128", str(out)])
    assert "traced for batch 2, seq 64" in err.value.message and err.value.code == 2


def test_trace_command_says_its_progress_on_a_terminal(tmp_path):
    """On a terminal, ckptplan trace says each stage as it begins, with the
    seconds since it started, and what it wrote."""
    import pty

    (tmp_path / "neox").mkdir()
    config = tmp_path / "neox" / "config.json"
    config.write_text(json.dumps({"model_type": "gpt_neox", "num_hidden_layers": 2, "hidden_size": 32,
                                  "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 64}))
    out = tmp_path / "neox.yaml"
    primary, secondary = pty.openpty()
    try:
        p = subprocess.run([sys.executable, "-m", "ckptplan", "trace", str(config), "--seq", "16", "-o", str(out)],
                           stdout=subprocess.PIPE, stderr=secondary, env=_env(), timeout=300)
        os.close(secondary)
        said = b""
        while True:
            try:
                chunk = os.read(primary, 4096)
            except OSError:  # the terminal's other end is closed
                break
            if not chunk:
                break
            said += chunk
    finally:
        os.close(primary)
    assert p.returncode == 0 and out.exists()
    lines = said.decode().splitlines()
    stages = [re.sub(r"^ckptplan trace: +[0-9.]+s ", "", l) for l in lines]
    assert stages == ["building neox on fake tensors (no weights)",
                      "tracing a training step of neox: batch 1, sequence 16, forward and backward",
                      "writing the graph of neox", f"wrote {out}"], lines


@pytest.mark.parametrize("args,want", [
    (["missing.json"], "missing.json: no such file"),
    (["bad.json"], "bad.json:1:2"),
    (["routed.json"], "a shape depends on the data"),
])
def test_trace_errors_are_messages(tmp_path, args, want):
    (tmp_path / "bad.json").write_text("{]")
    (tmp_path / "routed.json").write_text(json.dumps(ROUTED))
    p = run_trace(*[str(tmp_path / a) for a in args], "--seq", "8")
    assert p.returncode == 1
    assert want in p.stderr and "Traceback" not in p.stderr


def test_trace_usage_error():
    p = run_trace("--seq", "x", "c.json")
    assert p.returncode == 2 and "Traceback" not in p.stderr
