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

import ckptplan  # noqa: E402
from test_cuda_step import cuda_step_peaks  # noqa: E402
from test_step_peak import VOCAB, build  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch sees no CUDA GPU")

SEQ = 256


def _measured(model, optimizer, batch: int) -> int:
    ids = torch.randint(0, VOCAB, (batch, SEQ), device="cuda")
    return max(cuda_step_peaks(model, optimizer, {"input_ids": ids, "labels": ids.clone()}).values())


def _model():
    model = build(0, "fp32", "sdpa").cuda()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)


def test_cuda_largest_batch_storing_everything(ckptplan_binary):
    """Budgets between the measured peaks of consecutive micro-batches:
    fit's largest micro-batch storing everything is the one below."""
    model, optimizer = _model()
    peaks = [_measured(model, optimizer, b) for b in range(1, 6)]
    print("measured peaks on the GPU, micro-batches 1 to 5:", peaks)
    assert all(b > a for a, b in zip(peaks, peaks[1:]))
    for k in range(1, 5):
        budget = (peaks[k - 1] + peaks[k]) // 2
        store = ckptplan.fit(model, budget, seq=SEQ, optimizer=optimizer).largest[0]
        assert store.solver == "none"
        assert store.batch == k, (budget, store, peaks)
        assert store.batch_peak_bytes <= budget


def test_cuda_largest_batch_planned(ckptplan_binary):
    """With a plan: the largest micro-batch fit reports runs within the
    budget on the GPU, applied and measured; one more does not, under the
    plan that holds the least of any (its least budget)."""
    model, optimizer = _model()
    store = [_measured(model, optimizer, b) for b in (2, 3)]
    budget = (store[0] + store[1]) // 2
    f = ckptplan.fit(model, budget, seq=SEQ, optimizer=optimizer)
    planned = f.largest[1]
    assert planned.solver == "selective" and planned.batch > f.largest[0].batch == 2, f.largest
    plan = ckptplan.plan(model, budget, batch=planned.batch, seq=SEQ, optimizer=optimizer)
    assert plan.peak_bytes == planned.batch_peak_bytes
    ckptplan.apply(model, plan)
    within = _measured(model, optimizer, planned.batch)
    print(f"micro-batch {planned.batch}: measured {within} in a budget of {budget} (plan {plan.peak_bytes})")
    assert within <= budget
    with pytest.raises(ckptplan.CkptplanError) as err:
        ckptplan.plan(model, budget, batch=planned.batch + 1, seq=SEQ, optimizer=optimizer)
    least = err.value.min_budget_bytes
    assert least is not None and least > budget
    plan = ckptplan.plan(model, least, batch=planned.batch + 1, seq=SEQ, optimizer=optimizer)
    ckptplan.apply(model, plan)
    beyond = _measured(model, optimizer, planned.batch + 1)
    print(f"micro-batch {planned.batch + 1}, its least plan: measured {beyond} (plan {plan.peak_bytes})")
    assert beyond > budget
