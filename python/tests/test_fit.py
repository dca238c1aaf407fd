"""ckptplan.fit against the CPU allocator: the largest micro-batch and the
longest sequence it reports for a memory budget are the largest that run
within that budget, measured.

The model, the step and the measure are test_step_peak's: a small
transformers Llama trained in fp32 with PyTorch's fused AdamW, one whole
step under the profiler, the running total of the allocator's events over
what the step starts with. Budgets are set from measured peaks, between the
peak of one size and the next; fit must place the boundary where the
measure does. Stored or planned, the plan is the measure to the byte but
for nll_loss's 4-byte count of targets where the loss's backward peaks
(test_step_peak._slack), less what a checkpointed layer keeps in host memory
(the layers' host_bytes: the CPU allocator counts them, a GPU's budget
does not), which the comparison takes off.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ckptplan  # noqa: E402
from test_step_peak import VOCAB, build, step_peaks  # noqa: E402

SEQ = 256


def _batch(batch: int, seq: int = SEQ) -> dict:
    ids = torch.randint(0, VOCAB, (batch, seq))
    return {"input_ids": ids, "labels": ids.clone()}


def _measured(model, optimizer, batch: int, seq: int = SEQ, plan=None) -> int:
    """The step's measured peak on the allocator, less what the plan's
    stages keep in host memory."""
    host = plan.host_bytes if plan is not None else 0
    return max(step_peaks(model, optimizer, _batch(batch, seq)).values()) - host


def _model():
    model = build()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)


def largest_batch_storing_everything(model, optimizer, measured) -> None:
    """Budgets between the peaks measured(model, optimizer, batch) of
    consecutive micro-batches: fit's largest micro-batch storing
    everything is the one below (test_cuda_fit runs it on a GPU)."""
    peaks = [measured(model, optimizer, b) for b in range(1, 6)]
    print("measured peaks, micro-batches 1 to 5:", peaks)
    assert all(b > a for a, b in zip(peaks, peaks[1:]))
    for k in range(1, 5):
        budget = (peaks[k - 1] + peaks[k]) // 2
        f = ckptplan.fit(model, budget, seq=SEQ, optimizer=optimizer)
        store = f.largest[0]
        assert store.solver == "none"
        assert store.batch == k, (budget, store, peaks)
        assert store.batch_peak_bytes <= budget


def test_largest_batch_storing_everything(ckptplan_binary):
    """Budgets between the measured peaks of consecutive micro-batches:
    fit's largest micro-batch storing everything is the one below."""
    largest_batch_storing_everything(*_model(), _measured)


def test_longest_sequence_storing_everything(ckptplan_binary):
    """The same for the sequence at micro-batch 1, in multiples of 64."""
    model, optimizer = _model()
    peaks = {s: _measured(model, optimizer, 1, s) for s in (128, 192, 256, 320)}
    print("measured peaks by sequence:", peaks)
    for s in (128, 192, 256):
        budget = (peaks[s] + peaks[s + 64]) // 2
        f = ckptplan.fit(model, budget, seq=SEQ, optimizer=optimizer, seq_multiple=64)
        assert f.largest[0].seq == s, (budget, f.largest[0], peaks)


def largest_batch_planned(model, optimizer, measured) -> None:
    """With a plan: the largest micro-batch fit reports runs within the
    budget, applied and measured(model, optimizer, batch, plan=plan); one
    more does not, under the plan that holds the least of any (its least
    budget), applied and measured (test_cuda_fit runs it on a GPU)."""
    store = [measured(model, optimizer, b) for b in (2, 3)]
    budget = (store[0] + store[1]) // 2
    f = ckptplan.fit(model, budget, seq=SEQ, optimizer=optimizer)
    planned = f.largest[1]
    assert planned.solver == "selective" and planned.batch > f.largest[0].batch == 2, f.largest
    plan = ckptplan.plan(model, budget, batch=planned.batch, seq=SEQ, optimizer=optimizer)
    assert plan.peak_bytes == planned.batch_peak_bytes
    ckptplan.apply(model, plan)
    within = measured(model, optimizer, planned.batch, plan=plan)
    print(f"micro-batch {planned.batch}: measured {within} in a budget of {budget} (plan {plan.peak_bytes})")
    assert within <= budget
    with pytest.raises(ckptplan.CkptplanError) as err:
        ckptplan.plan(model, budget, batch=planned.batch + 1, seq=SEQ, optimizer=optimizer)
    least = err.value.min_budget_bytes
    assert least is not None and least > budget
    plan = ckptplan.plan(model, least, batch=planned.batch + 1, seq=SEQ, optimizer=optimizer)
    ckptplan.apply(model, plan)
    beyond = measured(model, optimizer, planned.batch + 1, plan=plan)
    print(f"micro-batch {planned.batch + 1}, its least plan: measured {beyond} (plan {plan.peak_bytes})")
    assert beyond > budget


def test_largest_batch_planned(ckptplan_binary):
    """With a plan: the largest micro-batch fit reports runs within the
    budget, applied and measured; one more does not, under the plan that
    holds the least of any (its least budget), applied and measured."""
    largest_batch_planned(*_model(), _measured)


def test_global_batch_settings(ckptplan_binary):
    """The settings reaching a global batch: each one's micro-batch times
    its accumulation is the global batch, and the least change keeps full
    fine-tuning and AdamW where a smaller micro-batch fits."""
    model, optimizer = _model()
    store = [_measured(model, optimizer, b) for b in (2, 3)]
    budget = (store[0] + store[1]) // 2
    f = ckptplan.fit(model, budget, seq=SEQ, optimizer=optimizer, global_batch=16)
    fitting = [s for s in f.settings if s.fits]
    assert fitting and all(s.micro_batch * s.grad_accum == 16 for s in fitting)
    least = f.settings[f.least_change]
    assert least.name == "full, adamw-fused" and least.lora_rank == 0 and least.grad_accum > 1, least
    assert least.peak_bytes <= budget


def test_fit_refuses_bad_arguments(ckptplan_binary):
    model, _ = _model()
    with pytest.raises(ckptplan.CkptplanUsageError, match="give seq"):
        ckptplan.fit(model, "1GiB")
    with pytest.raises(ckptplan.CkptplanUsageError, match="global_batch must be a positive int"):
        ckptplan.fit(model, "1GiB", seq=64, global_batch=0)
    with pytest.raises(ckptplan.CkptplanUsageError, match="does not divide over 3 GPUs"):
        ckptplan.fit("tiny-llama", "1GiB", gpus=3, global_batch=8)


def test_fit_over_gpus_names_tensor_parallelism(ckptplan_binary):
    """Over two GPUs, tiny-llama's settings include tensor parallelism
    over both (its 4 heads divide by 2), whose data-parallel ranks share
    the global batch: one, here."""
    f = ckptplan.fit("tiny-llama", "64MiB", gpus=2, global_batch=8)
    tp = [s for s in f.settings if s.tp == 2]
    assert [s.name for s in tp] == ["full, adamw-fused, TP 2"], [s.name for s in f.settings]
    assert tp[0].fits and tp[0].micro_batch * tp[0].grad_accum == 8 and tp[0].zero == 0
    assert all(s.tp == 1 for s in f.settings if s not in tp)


def test_fit_over_gpus_names_pipeline_stages(ckptplan_binary):
    """Over four GPUs, tiny-llama's settings include its four layers over
    two and four pipeline stages; a stage's replica runs its share of the
    global batch as microbatches (its ``grad_accum``)."""
    f = ckptplan.fit("tiny-llama", "64MiB", gpus=4, global_batch=8)
    pp = {s.name: s for s in f.settings if s.pp > 1}
    assert sorted(pp) == ["full, adamw-fused, PP 4", "full, adamw-fused, TP 2, PP 2"], [s.name for s in f.settings]
    four = pp["full, adamw-fused, PP 4"]
    assert four.fits and four.tp == 1 and four.micro_batch * four.grad_accum == 8
    assert pp["full, adamw-fused, TP 2, PP 2"].tp == 2
    # In FLOPs a pipeline stores or checkpoints each layer; in time it is
    # selective, the fit's own solver.
    assert {s.solver for s in pp.values()} == {"optimal"}
    timed = ckptplan.fit("tiny-llama", "64MiB", gpus=4, global_batch=8, roofline="matrix=1e12,bandwidth=1e11,link=1e9")
    assert {s.solver for s in timed.settings if s.pp > 1} == {"selective"}
    assert all(s.solver == "" for s in timed.settings if s.pp == 1)
