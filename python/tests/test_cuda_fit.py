"""ckptplan.fit against a CUDA GPU's caching allocator: the largest
micro-batch it reports for a memory budget is the largest that runs within
that budget, measured on the GPU.

test_fit does this on the CPU allocator; here the model is test_step_peak's
Llama on the GPU (fp32, sdpa, fused AdamW), and the measure is
test_cuda_step's: the bytes the caching allocator was asked for at the
step's peak, over what the step began with, cuBLAS's workspaces left out.
Budgets are set between the measured peaks of consecutive micro-batches.
Skipped, saying so, where PyTorch sees no GPU (CI has none;
docs/validation.md records the runs).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_cuda_step import cuda_step_peaks  # noqa: E402
from test_fit import SEQ, largest_batch_planned, largest_batch_storing_everything  # noqa: E402
from test_step_peak import VOCAB, build  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch sees no CUDA GPU")


def _measured(model, optimizer, batch: int, plan=None) -> int:
    """The step's peak on the GPU (a plan's host bytes are not the GPU's)."""
    ids = torch.randint(0, VOCAB, (batch, SEQ), device="cuda")
    return max(cuda_step_peaks(model, optimizer, {"input_ids": ids, "labels": ids.clone()}).values())


def _model():
    model = build(0, "fp32", "sdpa").cuda()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)


def test_cuda_largest_batch_storing_everything(ckptplan_binary):
    """Budgets between the measured peaks of consecutive micro-batches:
    fit's largest micro-batch storing everything is the one below."""
    largest_batch_storing_everything(*_model(), _measured)


def test_cuda_largest_batch_planned(ckptplan_binary):
    """With a plan: the largest micro-batch fit reports runs within the
    budget on the GPU, applied and measured; one more does not, under the
    plan that holds the least of any (its least budget)."""
    largest_batch_planned(*_model(), _measured)
