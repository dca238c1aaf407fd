"""ckptplan.prepare_trainer in Hugging Face's Trainer and Seq2SeqTrainer, on the CPU.

Two Trainers train copies of one tiny Llama on the same data — sequences
of varying length padded per batch by a collator, an epoch's short last
batch, gradient accumulation over two micro-batches, AdamW — one as it
is, the other after ``ckptplan.prepare_trainer``. The planned run's losses
and weights are the plain run's, step by step, and each micro-batch's
decoder layers keep, measured in the Trainer's own forward, what the plan
for that micro-batch's shape says.
"""
from __future__ import annotations

import copy
import dataclasses

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ckptplan  # noqa: E402
from ckptplan._measure import forward_kept  # noqa: E402

VOCAB, BATCH, LONGEST = 128, 4, 24
# 42 examples: ten batches of four and a short last one of two.
LENGTHS = [5 + (7 * i) % (LONGEST - 4) for i in range(41)] + [LONGEST]


def dataset() -> list[dict]:
    g = torch.Generator().manual_seed(5)
    out = []
    for n in LENGTHS:
        ids = torch.randint(3, VOCAB, (n,), generator=g).tolist()
        out.append({"input_ids": ids, "labels": ids})
    return out


def pad(examples: list[dict]) -> dict:
    """A collator that pads a batch to its longest sequence (on the right,
    labels -100, the padding masked), as transformers' DataCollatorForSeq2Seq
    does."""
    n = max(len(e["input_ids"]) for e in examples)
    ids = torch.zeros(len(examples), n, dtype=torch.long)
    labels = torch.full((len(examples), n), -100)
    mask = torch.zeros(len(examples), n, dtype=torch.long)
    for i, e in enumerate(examples):
        k = len(e["input_ids"])
        ids[i, :k] = torch.tensor(e["input_ids"])
        labels[i, :k] = torch.tensor(e["labels"])
        mask[i, :k] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def build(lora: bool, attention: str = "sdpa") -> "torch.nn.Module":
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=192, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                      max_position_embeddings=64, pad_token_id=0)
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation=attention)
    if lora:
        peft = pytest.importorskip("peft")
        model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    return model


def assert_kept_as_planned(plan, kept: list) -> dict:
    """Each micro-batch of kept — (shape, padded, the bytes each decoder
    layer kept) — keeps what plan says for its shape: plan itself at its
    own, else the plan made again for that shape within plan's peak, which
    is no higher. Returns the plans by (shape, padded)."""
    plans = {}
    for shape, pads, layers in kept:
        if (shape, pads) not in plans:
            plans[shape, pads] = plan if (shape, pads) == ((plan.batch, plan.seq), plan.padded) else \
                plan.replan(*shape, budget=plan.peak_bytes + plan.reserve_bytes, padded=pads)
            assert plans[shape, pads].peak_bytes <= plan.peak_bytes
        want = plans[shape, pads]
        assert layers == [l.kept_bytes for l in want.layers], (shape, pads, layers, want.layers)
    return {key: ([l.mode for l in p.layers], p.peak_bytes) for key, p in sorted(plans.items())}


class Measured(transformers.Trainer):
    """A Trainer that records, for each micro-batch, its shape, whether it
    is padded (a mask with a zero, or positions that restart: a row of
    sequences end to end) and what each decoder layer's forward keeps,
    measured in its own compute_loss."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kept: list[tuple[tuple[int, int], bool, list[int]]] = []

    def compute_loss(self, model, inputs, *args, **kwargs):
        with forward_kept(model) as kept:
            out = super().compute_loss(model, inputs, *args, **kwargs)
        mask, at = inputs.get("attention_mask"), inputs.get("position_ids")
        padded = not bool(mask.all()) if mask is not None else bool((at.diff(dim=1) != 1).any())
        self.kept.append((tuple(inputs["input_ids"].shape), padded, kept()))
        return out


class MeasuredSeq2Seq(Measured, transformers.Seq2SeqTrainer):
    """A Seq2SeqTrainer that records what Measured records."""


def trainer(model, tmp_path, checkpointing: bool = False, seq2seq: bool = False, collator=pad) -> Measured:
    args = dict(per_device_train_batch_size=BATCH, gradient_accumulation_steps=2, num_train_epochs=4,
                learning_rate=1e-3, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no",
                dataloader_drop_last=False, seed=0, data_seed=0)
    names = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    args["activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"] = checkpointing
    if seq2seq:
        return MeasuredSeq2Seq(model=model, args=transformers.Seq2SeqTrainingArguments(str(tmp_path), **args),
                               train_dataset=dataset(), data_collator=collator)
    return Measured(model=model, args=transformers.TrainingArguments(str(tmp_path), **args),
                    train_dataset=dataset(), data_collator=collator)


@pytest.mark.parametrize("lora,attention,seq2seq", [(False, "sdpa", False), (True, "eager", False), (True, "sdpa", True)],
                         ids=["full-sdpa", "lora-eager", "seq2seq-lora-sdpa"])
def test_trainer_trains_as_without_the_plan(ckptplan_binary, tmp_path, lora, attention, seq2seq):
    ref = build(lora, attention)
    plain = trainer(copy.deepcopy(ref), tmp_path / "plain", seq2seq=seq2seq)
    plain.train()
    planned = trainer(copy.deepcopy(ref), tmp_path / "planned", checkpointing=True, seq2seq=seq2seq)
    kw = dict(batch=BATCH, seq=LONGEST, padded=True, extra_args=("--grad-accum", "2"))
    store = ckptplan.plan(planned.model, "1GiB", solver="none", **kw)
    every = ckptplan.plan(planned.model, "1GiB", solver="every-k", **kw)
    budget = (store.peak_bytes + every.peak_bytes) // 2
    with pytest.warns(UserWarning, match="turned off the trainer's gradient checkpointing"):
        plan = ckptplan.prepare_trainer(planned, budget)
    assert (plan.batch, plan.seq, plan.padded) == (BATCH, LONGEST, True)
    assert "selective" in {l.mode for l in plan.layers} or "checkpoint" in {l.mode for l in plan.layers}
    planned.train()

    losses = [[e["loss"] for e in t.state.log_history if "loss" in e] for t in (plain, planned)]
    assert len(losses[0]) >= 20 and losses[0] == losses[1]
    for (name, p), q in zip(plain.model.named_parameters(), planned.model.parameters()):
        assert torch.equal(p, q), name
    # Every micro-batch: the short last one, and every padded length.
    shapes = {shape for shape, _, _ in planned.kept}
    print(f"{len(losses[0])} steps, {len(planned.kept)} micro-batches of {len(shapes)} shapes; plan "
          f"{[l.mode for l in plan.layers]} at {plan.peak_bytes} B")
    assert any(b < BATCH for b, _ in shapes) and len({s for _, s in shapes}) > 3, shapes
    print(assert_kept_as_planned(plan, planned.kept))


def test_trainer_without_a_budget_on_the_cpu_is_refused(ckptplan_binary, tmp_path):
    with pytest.raises(ckptplan.CkptplanUsageError, match="not on a GPU: give a budget"):
        ckptplan.prepare_trainer(trainer(build(False), tmp_path))


def test_trainer_with_data_of_unknown_length_needs_seq(ckptplan_binary, tmp_path):
    t = trainer(build(False), tmp_path)
    t.train_dataset = [{"text": "a"}]
    with pytest.raises(ckptplan.CkptplanUsageError, match="no input_ids.*give seq="):
        ckptplan.prepare_trainer(t, "1GiB")
    plan = ckptplan.prepare_trainer(t, "1GiB", seq=32)
    assert (plan.batch, plan.seq) == (BATCH, 32)


def test_trainer_input_embeddings_hook_is_removed(ckptplan_binary, tmp_path):
    """A PEFT model hooked for reentrant checkpointing (its frozen input
    embeddings' output made to require a gradient, as TRL and transformers
    do) would keep more in its first layer than the plan counts: the hook
    goes with the checkpointing, and the first layer keeps what the plan
    says."""
    t = trainer(build(True), tmp_path)
    t.model.enable_input_require_grads()
    ids = torch.randint(3, VOCAB, (BATCH, LONGEST))
    with forward_kept(t.model) as kept:
        out = t.model(input_ids=ids, labels=ids)  # noqa: F841 (its graph holds what is measured)
        hooked = kept()
    with pytest.warns(UserWarning, match="removed the input embeddings. require-grad hook"):
        plan = ckptplan.prepare_trainer(t, "1GiB", seq=LONGEST)
    with forward_kept(t.model) as kept:
        out = t.model(input_ids=ids, labels=ids)  # noqa: F841 (its graph holds what is measured)
        unhooked = kept()
    # The batch has no padding: what a plan of it without padding keeps.
    assert [l.mode for l in plan.layers] == ["store"] * len(plan.layers)
    unpadded = plan.replan(BATCH, LONGEST, padded=False)
    assert unhooked == [l.kept_bytes for l in unpadded.layers]
    assert hooked != unhooked


def test_trainer_with_a_flattening_collator(ckptplan_binary, tmp_path):
    """transformers' DataCollatorWithFlattening puts a batch's sequences
    end to end in one row, its positions restarting at each: the plan is
    for one row of the batch's longest sequences joined, masked as a padded
    batch, and every row the collator makes runs within it, keeping what
    its shape's plan says; the losses are the plain run's."""
    ref = build(False, "sdpa")
    flat = transformers.DataCollatorWithFlattening()
    plain = trainer(copy.deepcopy(ref), tmp_path / "plain", collator=flat)
    plain.train()
    planned = trainer(copy.deepcopy(ref), tmp_path / "planned", collator=flat)
    longest = sum(sorted(LENGTHS, reverse=True)[:BATCH])
    kw = dict(batch=1, seq=longest, padded=True, extra_args=("--grad-accum", "2"))
    store = ckptplan.plan(planned.model, "1GiB", solver="none", **kw)
    every = ckptplan.plan(planned.model, "1GiB", solver="every-k", **kw)
    plan = ckptplan.prepare_trainer(planned, (store.peak_bytes + every.peak_bytes) // 2)
    assert (plan.batch, plan.seq, plan.padded) == (1, longest, True)
    planned.train()
    losses = [[e["loss"] for e in t.state.log_history if "loss" in e] for t in (plain, planned)]
    assert len(losses[0]) >= 20 and losses[0] == losses[1]
    shapes = {shape for shape, _, _ in planned.kept}
    assert {b for b, _ in shapes} == {1} and max(s for _, s in shapes) > LONGEST, shapes
    print(assert_kept_as_planned(plan, planned.kept))

