"""ckptplan.prepare_accelerator in a plain PyTorch loop that accelerate
runs, on the CPU.

Two loops train copies of one tiny Llama on the same data — sequences of
varying length padded per batch, an epoch's short last batch, gradient
accumulation over two micro-batches (``accelerator.accumulate``), AdamW,
bf16 mixed precision — one as it is, the other after
``ckptplan.prepare_accelerator``. The planned loop's losses and weights
are the plain loop's, step by step, and each micro-batch's decoder layers
keep, measured in the loop's own forward, what the plan for that
micro-batch's shape says.
"""
from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")

import ckptplan  # noqa: E402
from ckptplan._measure import forward_kept  # noqa: E402
from test_trainer import BATCH, LONGEST, assert_kept_as_planned, build, dataset, pad  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_accelerator_state():
    """accelerate keeps one state a process, which an Accelerator of other
    settings (a Trainer's, made by an earlier test) refuses: each test
    starts and ends without one."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def train(model, planned: bool, budget=None):
    """Train model for four epochs in an accelerate loop; returns the losses,
    each micro-batch's (shape, padded, kept bytes per layer), and the plan."""
    torch.manual_seed(0)
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2, mixed_precision="bf16")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    plan = None
    if planned:
        with pytest.warns(UserWarning, match="turned off the model's gradient checkpointing"):
            plan = ckptplan.prepare_accelerator(accelerator, model, optimizer, budget, batch=BATCH, seq=LONGEST)
    data = torch.utils.data.DataLoader(dataset(), batch_size=BATCH, collate_fn=pad, shuffle=False)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    model.train()
    losses, kept = [], []
    for _ in range(4):
        for batch in data:
            with accelerator.accumulate(model):
                with forward_kept(model) as measured:
                    loss = model(**batch).loss
                    kept.append((tuple(batch["input_ids"].shape), not bool(batch["attention_mask"].all()),
                                 measured()))
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            losses.append(loss.item())
    return losses, kept, plan


def test_accelerate_loop_trains_as_without_the_plan(ckptplan_binary):
    ref = build(False, "sdpa")
    plain_model = copy.deepcopy(ref)
    plain, _, _ = train(plain_model, planned=False)

    model = copy.deepcopy(ref)
    model.gradient_checkpointing_enable()  # what prepare_accelerator turns off
    kw = dict(batch=BATCH, seq=LONGEST, padded=True, autocast="bf16", extra_args=("--grad-accum", "2"))
    store = ckptplan.plan(model, "1GiB", solver="none", **kw)
    every = ckptplan.plan(model, "1GiB", solver="every-k", **kw)
    budget = (store.peak_bytes + every.peak_bytes) // 2
    losses, kept, plan = train(model, planned=True, budget=budget)
    assert (plan.batch, plan.seq, plan.padded) == (BATCH, LONGEST, True)
    assert {"selective", "checkpoint"} & {l.mode for l in plan.layers}
    # The plan is for the accelerator's bf16 autocast and accumulation.
    assert plan.peak_bytes < store.peak_bytes
    assert len(plain) >= 40 and losses == plain  # 22 optimizer steps of two micro-batches
    for (name, p), q in zip(plain_model.named_parameters(), model.parameters()):
        assert torch.equal(p, q), name
    shapes = {shape for shape, _, _ in kept}
    assert any(b < BATCH for b, _ in shapes) and len({s for _, s in shapes}) > 3, shapes
    print(assert_kept_as_planned(plan, kept))


def test_accelerate_on_the_cpu_needs_a_budget(ckptplan_binary):
    accelerator = accelerate.Accelerator(cpu=True)
    with pytest.raises(ckptplan.CkptplanUsageError, match="runs on the CPU: give a budget"):
        ckptplan.prepare_accelerator(accelerator, build(False), None, batch=2, seq=16)


def test_prepare_accelerator_refuses_what_is_not_one(ckptplan_binary):
    with pytest.raises(ckptplan.CkptplanUsageError, match="an accelerate.Accelerator, not str"):
        ckptplan.prepare_accelerator("cpu", build(False), None, "1GiB", batch=2, seq=16)
