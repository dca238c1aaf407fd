"""torchtitan's op-level selective checkpointing against ckptplan's plan of it.

torchtitan's job config can ask, instead of whole layers, for
``selective_ac_option = "op"``: each layer runs under PyTorch's selective
checkpointing with a policy that caches every ``aten.mm`` but every second,
the fused attention kernels and maxima, whether or not a backward reads
them. ckptplan plans it as the keep set ``torchtitan-op`` (``--solver
torchtitan-op``, and one of the settings the torchtitan export weighs).

The truth is torchtitan's own wrapper, ``_apply_ac_to_transformer_block``
(PyTorch 2.7, marked fsdp2), around a transformers model's decoder layers,
measured by ``ckptplan.measure``: each layer holds what the plan says, to
the byte, and the backward reruns the plan's FLOPs. torchtitan runs on
CUDA, whose flash and memory-efficient kernels its list names; on the CPU
sdpa runs the CPU's flash kernel, which the sdpa cases add to torchtitan's
list, as CUDA's stands there. ``ckptplan.apply`` runs the same keep set
with the same rule, on any PyTorch with selective checkpointing.
"""
from __future__ import annotations

import copy
import importlib
import importlib.util
import os
import sys
import types

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ckptplan  # noqa: E402
from ckptplan import apply, measure  # noqa: E402
from ckptplan._sac import sac_available  # noqa: E402

from test_real_stack import AUTOCAST, BATCH, SEQ, batch, build, grads_equal  # noqa: E402

# The promises these tests check are each layer's; an optimizer with no
# state (and gradients held the whole step, as before it runs) keeps the
# step's peak in the forward and backward, so that budgets between
# checkpointing and storing everything choose between them.
OPTIMIZER = "none"

CASES = [("llama", "eager", "fp32", None), ("llama", "eager", "bf16", None), ("llama", "sdpa", "fp32", None),
         ("llama", "sdpa", "fp32", "bf16"), ("llama-bias", "eager", "fp32", None), ("gpt2", "sdpa", "fp32", None),
         ("gemma2", "sdpa", "bf16", None), ("phi3", "eager", "fp32", None), ("granite", "sdpa", "bf16", None)]


def torchtitan_parallelize():
    """torchtitan's Llama parallelization module. The packages above it
    import its models and datasets; the module needs only itself, so they
    are entered without their __init__."""
    parts = "torchtitan.models.llama3.infra".split(".")
    for i in range(len(parts)):
        name = ".".join(parts[:i + 1])
        if name in sys.modules:
            continue
        if i == 0:
            path = list(importlib.util.find_spec(name).submodule_search_locations)
        else:
            path = [p + "/" + parts[i] for p in sys.modules[".".join(parts[:i])].__path__]
        pkg = types.ModuleType(name)
        pkg.__path__ = path
        sys.modules[name] = pkg
    return importlib.import_module("torchtitan.models.llama3.infra.parallelize")


def layers_of(model):
    return model.transformer.h if hasattr(model, "transformer") else model.model.layers


def planned(family, attention, dtype, autocast):
    ref = build(family, attention, dtype)
    plan = ckptplan.plan(ref, "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="torchtitan-op", autocast=autocast)
    assert [l.policy for l in plan.layers] == ["torchtitan-op"] * len(plan.layers)
    return ref, plan


def check(model, ref, plan, autocast):
    """One step of model (ref under a plan) measured against ref's and the plan."""
    cast = AUTOCAST[autocast]
    base_model = copy.deepcopy(ref)
    torch.manual_seed(2)
    base = measure(base_model, batch(), autocast=cast)
    torch.manual_seed(2)
    m = measure(model, batch(), autocast=cast)
    assert grads_equal(model, base_model)
    for layer, got in zip(plan.layers, m.layers):
        assert got.kept_bytes == layer.kept_bytes, f"{layer.name}: PyTorch holds {got.kept_bytes}, plan {layer.kept_bytes}"
    if m.recomputed_flops is not None:  # ckptplan's own plan, which it can suspend
        assert m.recomputed_flops == plan.recompute_flops
    assert m.backward_flops - base.backward_flops == plan.recompute_flops
    assert plan.recompute_flops > 0


@pytest.mark.fsdp2
@pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None and not os.environ.get("CKPTPLAN_FSDP2"),
                    reason="torchtitan is not installed (.ci/run installs it from python/requirements-fsdp.txt)")
@pytest.mark.parametrize("family,attention,dtype,autocast", CASES)
def test_torchtitans_own_policy_holds_the_plan(ckptplan_binary, monkeypatch, family, attention, dtype, autocast):
    """Every layer wrapped by torchtitan's own op-level selective
    checkpointing holds and reruns what ckptplan's torchtitan-op plan says."""
    par = torchtitan_parallelize()
    if attention == "sdpa":
        monkeypatch.setattr(par, "_save_list", par._save_list | {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default})
    ref, plan = planned(family, attention, dtype, autocast)
    model = copy.deepcopy(ref)
    model.config.use_cache = False  # a rerun would append to the cache again
    config = types.SimpleNamespace(mode="selective", selective_ac_option="op")
    layers = layers_of(model)
    for i in range(len(layers)):
        layers[i] = par._apply_ac_to_transformer_block(layers[i], config)
    check(model, ref, plan, autocast)


@pytest.mark.skipif(not sac_available(), reason="selective activation checkpointing needs PyTorch >= 2.4")
@pytest.mark.parametrize("family,attention,dtype,autocast", CASES)
def test_apply_runs_torchtitan_op(ckptplan_binary, family, attention, dtype, autocast):
    """ckptplan.apply runs a torchtitan-op plan as torchtitan does."""
    ref, plan = planned(family, attention, dtype, autocast)
    model = copy.deepcopy(ref)
    apply(model, plan)
    check(model, ref, plan, autocast)


def test_adapters_have_no_torchtitan_op(ckptplan_binary):
    """torchtitan trains no adapters: the plan says so."""
    with pytest.raises(ckptplan.CkptplanError, match="no adapters"):
        ckptplan.plan(build("llama", "eager", "fp32", lora="attn"), "1GiB", optimizer=OPTIMIZER, batch=BATCH, seq=SEQ, solver="torchtitan-op")
