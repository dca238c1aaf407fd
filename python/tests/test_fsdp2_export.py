"""The PyTorch and FSDP2 exports (``ckptplan export --to pytorch|fsdp2``) on
real transformers models.

Each test writes the module the binary exports for a tiny model, applies
it with its ``apply_plan`` (the PyTorch module's sets each layer's forward;
the FSDP2 module's calls torch.distributed's apply_activation_checkpointing
with a check_fn per layer; both run selective layers through selective
activation checkpointing) and runs a training step: every layer holds what the plan
says (ckptplan.measure: PyTorch's own live storages), the FLOPs the backward
reruns are the plan's (FlopCounterMode), and the gradients are those of the
model without the plan. The tests marked fsdp2 do so under FSDP2's
fully_shard in a one-process gloo group on the CPU, which needs PyTorch 2.7
or later (python/requirements-fsdp.txt; .ci/run runs them with it).
"""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import socket
import subprocess

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ckptplan  # noqa: E402
from ckptplan import measure  # noqa: E402
from ckptplan._sac import sac_available  # noqa: E402
from ckptplan.introspect import describe  # noqa: E402

BATCH, SEQ, VOCAB = 2, 16, 128

pytestmark = pytest.mark.skipif(not sac_available(), reason=f"selective checkpointing needs PyTorch >= 2.4, not {torch.__version__}")


# The promises these tests check are each layer's; an optimizer with no
# state (and gradients held the whole step, as before it runs) keeps the
# step's peak in the forward and backward, so that budgets between
# checkpointing and storing everything choose between them.
OPTIMIZER = "none"

def fully_shard_api():
    """FSDP2's fully_shard when it runs on the CPU here, else None."""
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    if (major, minor) < (2, 7):
        return None  # before 2.7 FSDP2's streams are CUDA's
    from torch.distributed.fsdp import fully_shard
    return fully_shard


FSDP2 = [pytest.mark.fsdp2,
         pytest.mark.skipif(fully_shard_api() is None and not os.environ.get("CKPTPLAN_FSDP2"),
                            reason=f"FSDP2 runs on the CPU from PyTorch 2.7, this is {torch.__version__} "
                                   "(.ci/run runs these tests with python/requirements-fsdp.txt)")]


def build(family: str) -> "torch.nn.Module":
    if family == "gpt2":
        config = transformers.GPT2Config(n_layer=3, n_embd=64, n_head=4, n_positions=64, vocab_size=VOCAB,
                                         attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    else:
        config = transformers.LlamaConfig(num_hidden_layers=3, hidden_size=64, num_attention_heads=4,
                                          num_key_value_heads=2, intermediate_size=192, vocab_size=VOCAB,
                                          max_position_embeddings=64)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = {"gpt2": transformers.GPT2LMHeadModel, "llama": transformers.LlamaForCausalLM}[family](config)
    model.train()
    return model


def batch() -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return {"input_ids": ids, "labels": ids}


def export_module(binary: str, model, budget: int, solver: str, tmp_path, to: str = "fsdp2") -> object:
    """The module ckptplan export --to TO writes for model, imported."""
    setup = describe(model, batch=BATCH, seq=SEQ)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(setup.config))
    out = tmp_path / f"plan_{to}_{solver}_{budget}.py"
    p = subprocess.run([binary, "export", "--to", to, "--optimizer", OPTIMIZER, "--solver", solver, "--budget", f"{budget}B",
                        *setup.flags(), "-o", str(out), str(config)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    spec = importlib.util.spec_from_file_location(out.stem, out)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def budgets(model) -> list[int]:
    """Three budgets between checkpointing every layer and storing all."""
    store = ckptplan.plan(model, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="none")
    every = ckptplan.plan(model, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="every-k")
    low, high = every.peak_bytes, store.peak_bytes
    return [low + (high - low) * f // 4 for f in (1, 2, 3)]


def grads(model) -> list:
    out = []
    for p in model.parameters():
        g = p.grad
        if g is not None and hasattr(g, "full_tensor"):
            g = g.full_tensor()
        out.append(g)
    return out


def check_step(module, model, plain, modes: set) -> None:
    """A step of model (with module's plan applied) holds, reruns and
    differentiates as module's PLAN says, against plain, the same model
    without the plan."""
    plan = module.PLAN
    base = measure(plain, batch())
    m = measure(model, batch())
    for layer, got in zip(plan["layers"], m.layers):
        modes.add(layer["mode"])
        assert got.kept_bytes == layer["kept_bytes"], \
            f"{layer['name']} ({layer['mode']}): PyTorch holds {got.kept_bytes}, the plan {layer['kept_bytes']}"
    assert m.backward_flops - base.backward_flops == plan["recompute_flops"]
    for a, b in zip(grads(model), grads(plain)):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), "gradients differ"


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("solver", ["selective", "optimal", "every-k"])
def test_fsdp2_module_applies_the_plan(ckptplan_binary, tmp_path, family, solver):
    """Without sharding: apply_plan wraps the layers the plan does not store
    in checkpoint_wrapper, and each holds what the plan says."""
    ref = build(family)
    modes = set()
    for budget in budgets(ref):
        module = export_module(ckptplan_binary, ref, budget, solver, tmp_path)
        model = copy.deepcopy(ref)
        counts = module.apply_plan(model)
        layers = ckptplan.layers.decoder_layers(model)
        wrapped = [type(layer).__name__ == "CheckpointWrapper" for layer in layers]
        assert wrapped == [e["mode"] != "store" for e in module.PLAN["layers"]]
        assert sum(counts.values()) == len(layers)
        check_step(module, model, copy.deepcopy(ref), modes)
    assert ("selective" if solver == "selective" else "checkpoint") in modes


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("solver", ["selective", "every-k"])
def test_pytorch_module_applies_the_plan(ckptplan_binary, tmp_path, family, solver):
    """The PyTorch module's apply_plan over the decoder layers: each layer
    the plan does not store runs planned, holds what the plan says, and
    the backward reruns the FLOPs the module's header prints."""
    ref = build(family)
    ref.config.use_cache = False  # as the module's header says
    modes = set()
    for budget in budgets(ref):
        module = export_module(ckptplan_binary, ref, budget, solver, tmp_path, to="pytorch")
        model = copy.deepcopy(ref)
        layers = ckptplan.layers.decoder_layers(model)
        counts = module.apply_plan(layers)
        got = [getattr(layer.forward, "ckptplan_mode", "store") for layer in layers]
        assert got == [e["mode"] for e in module.PLAN["layers"]]
        assert sum(counts.values()) == len(layers)
        check_step(module, model, copy.deepcopy(ref), modes)
        header = f"{100 * module.PLAN['overhead']:+.1f}% compute"
        assert header in open(module.__file__).read(), f"the header does not print {header}"
    assert ("selective" if solver == "selective" else "checkpoint") in modes


def test_fsdp2_module_refuses_other_shapes_and_models(ckptplan_binary, tmp_path):
    ref = build("llama")
    module = export_module(ckptplan_binary, ref, budgets(ref)[0], "every-k", tmp_path)
    model = copy.deepcopy(ref)
    module.apply_plan(model)
    with pytest.raises(ValueError, match="planned for batch 2 and sequence 16 but is called with batch 3"):
        model(input_ids=torch.zeros(3, SEQ, dtype=torch.long), labels=torch.zeros(3, SEQ, dtype=torch.long))
    with pytest.raises(ValueError, match="has 3 layers but the model has 2"):
        module.apply_plan(transformers.LlamaForCausalLM(transformers.LlamaConfig(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=64)))


@pytest.fixture(scope="module")
def gloo():
    """A one-process gloo group on the CPU, as torchrun would make with one
    rank, and its device mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("family", [pytest.param("llama", marks=FSDP2), pytest.param("gpt2", marks=FSDP2)])
@pytest.mark.parametrize("solver", [pytest.param("selective", marks=FSDP2), pytest.param("every-k", marks=FSDP2)])
def test_fsdp2_plan_under_fully_shard(ckptplan_binary, tmp_path, gloo, family, solver):
    """The exported module applied before fully_shard (each layer, then the
    model), in a one-process gloo group: a training step (forward, backward,
    AdamW) runs with the plan's per-layer modes, every layer holds what the
    plan says, the backward reruns the plan's FLOPs, and the gradients equal
    those of the same sharded model without the plan."""
    fully_shard = fully_shard_api()
    assert fully_shard is not None, f"PyTorch {torch.__version__} has no FSDP2 on the CPU"
    ref = build(family)
    ref.config.use_cache = False
    modes = set()
    for budget in budgets(ref):
        module = export_module(ckptplan_binary, ref, budget, solver, tmp_path)
        model = copy.deepcopy(ref)
        module.apply_plan(model)
        plain = copy.deepcopy(ref)
        for m in (model, plain):
            for layer in ckptplan.layers.decoder_layers(m):
                fully_shard(layer, mesh=gloo)
            fully_shard(m, mesh=gloo)
        kinds = [type(layer).__name__ for layer in ckptplan.layers.decoder_layers(model)]
        plain_kind = "FSDP" + type(ckptplan.layers.decoder_layers(ref)[0]).__name__
        assert kinds == ["FSDPCheckpointWrapper" if e["mode"] != "store" else plain_kind for e in module.PLAN["layers"]]
        check_step(module, model, plain, modes)
        before = [p.detach().full_tensor().clone() for p in model.parameters()]
        torch.optim.AdamW(model.parameters(), lr=1e-3).step()
        assert any(not torch.equal(a, p.detach().full_tensor()) for a, p in zip(before, model.parameters()))
    assert ("selective" if solver == "selective" else "checkpoint") in modes
