"""ckptplan.prepare_trainer in TRL's SFTTrainer, on the CPU.

Two SFTTrainers train copies of one tiny Llama on the same tokenized
sequences of varying length — one as TRL sets it up (its own gradient
checkpointing on, as SFTConfig's default has it), the other after
``ckptplan.prepare_trainer`` — with packing off (a collator pads each
batch to its longest; an epoch's short last batch) and on (TRL's
best-fit packing, whose padding-free collator puts a batch's packed
sequences end to end in one row, the positions restarting at each), with
gradient accumulation over two micro-batches, bf16 autocast (SFTConfig's
default) and LoRA. The planned run's losses and weights are the plain
run's, step by step, and each micro-batch's decoder layers keep, measured
in the trainer's own forward, what the plan for that micro-batch's shape
says, within the plan prepare_trainer made.

TRL and datasets come from python/requirements-trl.txt, over the newest
stack; only .ci/run's run with them (CKPTPLAN_TRL=1) runs these tests.
"""
from __future__ import annotations

import copy
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.trl,
              pytest.mark.skipif(not os.environ.get("CKPTPLAN_TRL"),
                                 reason="run with python/requirements-trl.txt's TRL and datasets")]

import ckptplan  # noqa: E402
from test_trainer import Measured, assert_kept_as_planned  # noqa: E402

VOCAB, BATCH, MAX_LENGTH = 128, 4, 24


def tokenizer() -> "transformers.PreTrainedTokenizerFast":
    """A word-level tokenizer of VOCAB tokens, built here (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w2"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="w2", pad_token="w0",
                                                eos_token="w1")


def dataset() -> "datasets.Dataset":
    """42 tokenized sequences of 5 to 30 tokens (the longest truncated to
    MAX_LENGTH by TRL)."""
    import datasets

    g = torch.Generator().manual_seed(5)
    return datasets.Dataset.from_list(
        [{"input_ids": torch.randint(3, VOCAB, (5 + (7 * i) % 26,), generator=g).tolist()} for i in range(42)])


def build(lora: bool, attention: str) -> "torch.nn.Module":
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=192, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                      max_position_embeddings=256, pad_token_id=0, eos_token_id=1)
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation=attention)
    if lora:
        peft = pytest.importorskip("peft")
        model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    return model


def trainer(model, tmp_path, packing: bool):
    trl = pytest.importorskip("trl")

    class MeasuredSFT(Measured, trl.SFTTrainer):
        """An SFTTrainer that records what Measured records: each
        micro-batch's shape, whether it is padded or packed, and what each
        decoder layer's forward keeps."""

    args = trl.SFTConfig(str(tmp_path), per_device_train_batch_size=BATCH, gradient_accumulation_steps=2,
                         max_length=MAX_LENGTH, packing=packing, max_steps=21,
                         learning_rate=1e-3, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no",
                         dataloader_drop_last=False, seed=0, data_seed=0)
    return MeasuredSFT(model=model, args=args, train_dataset=dataset(), processing_class=tokenizer())


def checkpointing(args) -> bool:
    """Whether a trainer's arguments ask for gradient checkpointing
    (transformers 5.23 renamed the field)."""
    return getattr(args, "activation_checkpointing", None) or getattr(args, "gradient_checkpointing")


@pytest.mark.parametrize("packing,lora,attention", [(False, False, "sdpa"), (True, False, "sdpa"),
                                                    (True, True, "eager")],
                         ids=["padded-sdpa", "packed-sdpa", "packed-lora-eager"])
def test_sft_trainer_trains_as_without_the_plan(ckptplan_binary, tmp_path, packing, lora, attention):
    ref = build(lora, attention)
    plain = trainer(copy.deepcopy(ref), tmp_path / "plain", packing)
    assert checkpointing(plain.args)  # TRL's default: every layer checkpointed
    plain.train()
    planned = trainer(copy.deepcopy(ref), tmp_path / "planned", packing)
    assert planned.data_collator.padding_free is packing  # best-fit packing joins a batch in one row
    rows = 1 if packing else BATCH
    lengths = sorted((len(ids) for ids in planned.train_dataset["input_ids"]), reverse=True)
    seq = sum(lengths[:BATCH]) if packing else lengths[0]
    kw = dict(batch=rows, seq=seq, padded=True, autocast="bf16", extra_args=("--grad-accum", "2"))
    store = ckptplan.plan(planned.model, "1GiB", solver="none", **kw)
    every = ckptplan.plan(planned.model, "1GiB", solver="every-k", **kw)
    budget = (store.peak_bytes + every.peak_bytes) // 2
    with pytest.warns(UserWarning, match="turned off the trainer's gradient checkpointing") as said:
        plan = ckptplan.prepare_trainer(planned, budget)
    # TRL hooks a PEFT model's input embeddings for checkpointing: gone too.
    assert any("require-grad hook" in str(w.message) for w in said) is lora
    assert (plan.batch, plan.seq, plan.padded) == (rows, seq, True)
    assert not checkpointing(planned.args)
    assert {"selective", "checkpoint"} & {l.mode for l in plan.layers}
    planned.train()

    losses = [[e["loss"] for e in t.state.log_history if "loss" in e] for t in (plain, planned)]
    assert len(losses[0]) >= 20 and losses[0] == losses[1]
    for (name, p), q in zip(plain.model.named_parameters(), planned.model.parameters()):
        assert torch.equal(p, q), name
    shapes = {shape for shape, _, _ in planned.kept}
    print(f"{len(losses[0])} steps, {len(planned.kept)} micro-batches of {len(shapes)} shapes; plan "
          f"{[l.mode for l in plan.layers]} at {plan.peak_bytes} B")
    assert len({s for _, s in shapes}) > 3, shapes
    if packing:
        assert {b for b, _ in shapes} == {1} and max(s for _, s in shapes) > MAX_LENGTH, shapes
    else:
        assert any(b < BATCH for b, _ in shapes), shapes
    print(assert_kept_as_planned(plan, planned.kept))
