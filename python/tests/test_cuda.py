"""ckptplan's predictions against real transformers models on a CUDA GPU.

test_real_stack on the CPU proves the plans byte for byte; on a GPU other
kernels run (flash and memory-efficient sdpa, which may or may not take
grouped K and V, fused dropout with byte masks), and the plan is made for
them: each stored layer keeps what the plan says, and a selective plan
applies, keeping and recomputing what it says. Skipped, saying so, where
PyTorch sees no GPU (CI has none; docs/validation.md records the runs).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_real_stack import batch, build, grads_close, stored_and_selective_hold  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch sees no CUDA GPU")

CASES = [(f, a, d, kv) for f in ("llama", "qwen2", "gpt2", "phi3", "gemma", "starcoder2")
         for a in ("eager", "sdpa") for d in ("fp32", "bf16") for kv in ((1, 2) if f != "gpt2" else (None,))]


@pytest.mark.parametrize("family,attention,dtype,kv", CASES)
def test_plans_hold_on_cuda(ckptplan_binary, family, attention, dtype, kv):
    data = {k: v.cuda() for k, v in batch(2).items()}
    stored_and_selective_hold(build(family, attention, dtype, kv=kv).cuda(), data, grads_close)
