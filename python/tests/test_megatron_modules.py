"""Megatron-LM's --recompute-modules, measured on Megatron Core's own layer.

A TransformerLayer of Megatron Core 0.12 (its local spec: torch's
LayerNorm, DotProductAttention, the MLP of two linears around GELU), built
on the CPU in bf16 in a one-process gloo group, runs a forward and a
backward under each setting of --recompute-granularity selective
--recompute-modules. The bytes its autograd graph holds after the forward
(every storage saved for backward, counted once, at its size then: what
CheckpointWithoutOutput frees is 0), and the FLOPs of its backward
(torch's FlopCounterMode: the rerun is the difference with the plain
layer's), are what Megatron Core does. ckptplan's keep set of the same
modules, for a model of the same shape under the megatron profile, must
drop the same bytes and rerun the same FLOPs:

- mlp drops GELU's input and output and reruns both linears, the output
  projection included;
- layernorm drops the two norms' outputs (the statistics torch's LayerNorm
  also keeps, 2 fp32 a row, the megatron profile leaves out as Korthikanti
  et al. do; they are added here);
- core_attn reruns QKᵀ and the product with V. Its bytes are not compared:
  the unfused softmax Megatron Core runs on the CPU keeps what its CUDA
  kernel does not, and the profile models the kernel.

Megatron Core's checkpoints keep CUDA's RNG state; the layer has no
dropout, so the CUDA RNG calls are stubbed out, and its global buffer is
allocated on the CPU. Linear biases are off: Megatron Core 0.12 returns the
output projection's bias from inside the MLP's checkpoint, which its
backward cannot rerun.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess

import pytest

pytestmark = [pytest.mark.engines,
              pytest.mark.skipif(importlib.util.find_spec("megatron") is None and not os.environ.get("CKPTPLAN_ENGINES"),
                                 reason="Megatron Core is not installed (.ci/run installs it from python/requirements-engines.txt)")]

# The layer: sequence, batch, hidden, heads, MLP width.
S, B, H, A, F = 32, 2, 64, 4, 256

MODEL = f"""\
name: megatron-layer
family: gpt2
layers: 1
hidden: {H}
heads: {A}
kv_heads: {A}
ffn: {F}
vocab: 128
tied_embeddings: true
norm_eps: 1e-5
max_seq: {S}
training:
  batch: {B}
  seq: {S}
  dtype: bf16
  dropout: 0
  attention: eager
  profile: megatron
"""

SETTINGS = [["core_attn"], ["layernorm"], ["mlp"], ["layernorm", "mlp"], ["core_attn", "layernorm", "mlp"]]


@pytest.fixture(scope="module")
def megatron(tmp_path_factory):
    """Megatron Core's parallel state over one process, on the CPU."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random

    mp = pytest.MonkeyPatch()
    mp.setattr(random, "_get_cuda_rng_state", lambda *a, **k: None)
    mp.setattr(random, "_set_cuda_rng_state", lambda *a, **k: None)
    mp.setattr(torch.cuda, "current_device", lambda: "cpu")
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    random.get_cuda_rng_tracker().set_states({random._MODEL_PARALLEL_RNG_TRACKER_NAME: None})
    try:
        yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
        mp.undo()


def measure(modules: list[str] | None) -> tuple[int, int]:
    """The bytes Megatron Core's layer holds for its backward, and its
    backward's FLOPs, under selective recomputation of modules (None:
    none)."""
    import torch
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig
    from torch.utils.flop_counter import FlopCounterMode

    recompute = {} if modules is None else dict(recompute_granularity="selective", recompute_modules=modules)
    config = TransformerConfig(num_layers=1, hidden_size=H, ffn_hidden_size=F, num_attention_heads=A,
                               use_cpu_initialization=True, bf16=True, params_dtype=torch.bfloat16,
                               hidden_dropout=0.0, attention_dropout=0.0, add_bias_linear=False,
                               bias_activation_fusion=False, masked_softmax_fusion=False, bias_dropout_fusion=False,
                               **recompute)
    torch.manual_seed(0)
    layer = build_module(get_gpt_layer_local_spec(), config=config, layer_number=1)
    x = torch.randn(S, B, H, dtype=torch.bfloat16, requires_grad=True)
    mask = torch.triu(torch.ones(1, 1, S, S, dtype=torch.bool), 1)
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out, _ = layer(x, attention_mask=mask)
    mine = {p.untyped_storage().data_ptr() for p in [x, mask, *layer.parameters()]}
    held = sum(st.nbytes() for ptr, st in saved.items() if ptr not in mine)
    with FlopCounterMode(display=False) as flops:
        out.float().sum().backward()
    assert x.grad is not None and all(p.grad is not None for p in layer.parameters())
    return held, flops.get_total_flops()


def planned(binary: str, model: str, modules: list[str]) -> tuple[int, int, list[str]]:
    """ckptplan's keep set of the modules on the layer: the bytes it drops,
    the FLOPs it reruns, and the nodes."""
    p = subprocess.run([binary, "plan", model, "--budget", "1GiB", "--solver", "megatron-selective",
                        "--recompute-modules", ",".join(modules), "--format", "json"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    layer = next(s for s in json.loads(p.stdout)["stages"] if s["name"] == "layers.0")
    ks = layer["options"][0]
    return layer["saved_bytes"] - ks["saved_bytes"], ks["extra_cost"], ks["recompute"]


@pytest.mark.parametrize("modules", SETTINGS, ids=["+".join(m) for m in SETTINGS])
def test_megatron_core_drops_and_reruns_the_plan(ckptplan_binary, megatron, tmp_path, modules):
    model = tmp_path / "megatron-layer.yaml"
    model.write_text(MODEL)
    drops, rerun, nodes = planned(ckptplan_binary, str(model), modules)
    held_plain, flops_plain = measure(None)
    held, flops = measure(modules)
    assert flops - flops_plain == rerun, (modules, nodes)
    if "mlp" in modules:
        assert "layers.0.mlp.fc2" in nodes
    if "core_attn" in modules:
        return
    stats = 2 * 2 * S * B * 4 if "layernorm" in modules else 0
    assert held_plain - held == drops + stats, (modules, nodes)
