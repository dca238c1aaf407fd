"""ckptplan's predictions against real transformers models on a CUDA GPU.

test_real_stack on the CPU proves the plans byte for byte; on a GPU other
kernels run (flash and memory-efficient sdpa, which may or may not take
grouped K and V, fused dropout with byte masks), and the plan is made for
them: each stored layer keeps what the plan says, and a selective plan
applies, keeping and recomputing what it says. Skipped, saying so, where
PyTorch sees no GPU (CI has none; docs/validation.md records the runs).
"""
from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ckptplan  # noqa: E402
from ckptplan import apply, measure  # noqa: E402

from test_real_stack import SEQ, batch, build, grads_close  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch sees no CUDA GPU")

CASES = [(f, a, d, kv) for f in ("llama", "qwen2", "gpt2", "phi3", "gemma", "starcoder2")
         for a in ("eager", "sdpa") for d in ("fp32", "bf16") for kv in ((1, 2) if f != "gpt2" else (None,))]


@pytest.mark.parametrize("family,attention,dtype,kv", CASES)
def test_plans_hold_on_cuda(ckptplan_binary, family, attention, dtype, kv):
    ref = build(family, attention, dtype, kv=kv).cuda()
    n = 2
    data = {k: v.cuda() for k, v in batch(n).items()}
    store = ckptplan.plan(ref, "1GiB", batch=n, seq=SEQ, solver="none")
    m = measure(copy.deepcopy(ref), data)
    for layer, got in zip(store.layers, m.layers):
        assert got.kept_bytes == layer.kept_bytes, f"{layer.name}: PyTorch holds {got.kept_bytes}, plan {layer.kept_bytes}"
    low = ckptplan.plan(ref, "1GiB", batch=n, seq=SEQ, solver="every-k").peak_bytes
    plan = ckptplan.plan(ref, (low + store.peak_bytes) // 2, batch=n, seq=SEQ, solver="selective")
    model = copy.deepcopy(ref)
    apply(model, plan)
    got = measure(model, data)
    base = copy.deepcopy(ref)
    measure(base, data)
    assert grads_close(model, base)
    for layer, g in zip(plan.layers, got.layers):
        assert g.kept_bytes == layer.kept_bytes, f"{layer.name} ({layer.mode}): PyTorch holds {g.kept_bytes}, plan {layer.kept_bytes}"
    assert got.recomputed_flops == plan.recompute_flops
