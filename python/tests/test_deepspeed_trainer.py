"""``prepare_trainer`` on a Hugging Face Trainer that runs DeepSpeed plans
ZeRO as the trainer's DeepSpeed config runs it, and sets the config's
buffers to what the plan holds for.

Each case builds, on both ranks of a two-rank gloo group on the CPU, a
transformers Trainer whose arguments name a DeepSpeed config (ZeRO stage 2
or 3, bf16 "auto", the buckets "auto" as Hugging Face's examples leave
them) over an fp32 Llama, calls ``ckptplan.prepare_trainer`` and trains a
step. The plan is the one ``ckptplan.plan`` makes of the model with the
flags DeepSpeed's run needs given by hand (``--dp 2 --zero S --sharding
deepspeed --dtype bf16``: DeepSpeed casts the weights to bf16 and keeps
an fp32 partition, with no autocast); the config DeepSpeed starts with
holds the largest layer's parameters a bucket (what ``ckptplan export
--to deepspeed`` writes, test_deepspeed_zero12 and test_deepspeed_zero3
measure within the plan), and the engine runs with them. A config that
sets a bucket beyond that is refused, naming it, and so are what the plan
does not count (test_deepspeed_run, without DeepSpeed).
"""
from __future__ import annotations

import importlib.util
import json
import os
import tempfile

import pytest

from test_deepspeed_zero3 import CONFIG, spawn

pytestmark = [pytest.mark.engines,
              pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None and not os.environ.get("CKPTPLAN_ENGINES"),
                                 reason="DeepSpeed is not installed (.ci/run installs it from python/requirements-engines.txt)")]

SEQ, BATCH = 16, 2


def _worker(rank: int, port: int, stage: int, bucket, dtype: str, out: str) -> None:
    """One rank: a Trainer under DeepSpeed's ZeRO stage, prepared by
    ckptplan and trained a step; rank 0 writes the plan, the plan made
    with the flags by hand, the config DeepSpeed started with and the
    engine's buffer settings (or the refusal, where bucket sets
    reduce_bucket_size beyond the plan's)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), DS_ACCELERATOR="cpu")
    import importlib

    import torch
    import transformers

    import ckptplan
    import deepspeed

    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    zero = {"stage": stage, "reduce_bucket_size": bucket}
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size="auto", stage3_param_persistence_threshold="auto")
    config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
              "bf16": {"enabled": "auto"}, "zero_optimization": zero}
    args = transformers.TrainingArguments(tempfile.mkdtemp(), per_device_train_batch_size=BATCH, report_to=[],
                                          deepspeed=config, bf16=True, max_steps=1, use_cpu=True)
    torch.manual_seed(0)
    # As from_pretrained loads it in that dtype.
    model = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**CONFIG),
                                                          torch_dtype=getattr(torch, dtype))
    data = [{"input_ids": list(range(1, SEQ + 1)), "labels": list(range(1, SEQ + 1))}] * 8
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    by_hand = ckptplan.plan(model, "1GiB", batch=BATCH, seq=SEQ, optimizer=trainer.create_optimizer(),
                            extra_args=["--dp", "2", "--zero", str(stage), "--sharding", "deepspeed", "--dtype", "bf16",
                                        "--master-weights", "fp32"])
    result = {}
    try:
        plan = ckptplan.prepare_trainer(trainer, "1GiB")
    except ckptplan.CkptplanUsageError as err:
        result["refused"] = str(err)
    else:
        result.update(plan=plan.raw, by_hand=by_hand.raw,
                      config=dict(args.hf_deepspeed_config.config["zero_optimization"]))
        trainer.train()
        engine = trainer.model_wrapped
        result["engine"] = {"reduce_bucket_size": engine.zero_reduce_bucket_size()}
        if stage == 3:
            result["engine"].update(stage3_prefetch_bucket_size=engine.zero_prefetch_bucket_size(),
                                    stage3_max_live_parameters=engine.zero_max_live_parameters(),
                                    stage3_max_reuse_distance=engine.zero_max_reuse_distance(),
                                    stage3_param_persistence_threshold=engine.zero_param_persistence_threshold())
        else:
            result["engine"].update(contiguous_gradients=engine.zero_contiguous_gradients(),
                                    overlap_comm=engine.zero_overlap_comm())
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)


@pytest.mark.parametrize("stage", [2, 3])
def test_prepare_trainer_plans_deepspeeds_zero(tmp_path, stage):
    """The trainer's plan is ZeRO's over its two ranks, in bf16, and the
    buckets DeepSpeed runs with are the largest layer's parameters."""
    got = spawn(tmp_path, "test_deepspeed_trainer", stage, "auto", "float32")
    assert "refused" not in got, got
    plan, by_hand = got["plan"], got["by_hand"]
    assert (plan["static_bytes"], plan["peak_bytes"], plan["dtype"], plan["zero"]) == \
        (by_hand["static_bytes"], by_hand["peak_bytes"], "bf16", stage)
    assert "autocast" not in plan
    # The largest layer: q, k, v, o, the MLP's three and two norms,
    # counted from the config.
    h, f = CONFIG["hidden_size"], CONFIG["intermediate_size"]
    kv = h // CONFIG["num_attention_heads"] * CONFIG["num_key_value_heads"]
    layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h
    if stage == 3:
        want = {"reduce_bucket_size": layer, "stage3_prefetch_bucket_size": layer, "stage3_max_live_parameters": layer,
                "stage3_max_reuse_distance": 0, "stage3_param_persistence_threshold": 0}
    else:
        want = {"contiguous_gradients": True, "overlap_comm": False, "reduce_bucket_size": layer}
    assert plan["deepspeed_zero"] == {"stage": stage, **want}
    assert got["config"] == {"stage": stage, **want}
    assert got["engine"] == want


def test_a_bf16_model_keeps_deepspeeds_fp32_partition(tmp_path):
    """A model loaded in bf16 trains under DeepSpeed with the same fp32
    master partition and moments as one loaded in fp32: the same plan
    (where PyTorch's own AdamW over bf16 weights would keep bf16 moments
    and no master copy)."""
    fp32 = spawn(tmp_path, "test_deepspeed_trainer", 2, "auto", "float32")
    bf16 = spawn(tmp_path, "test_deepspeed_trainer", 2, "auto", "bfloat16")
    assert (bf16["plan"]["static_bytes"], bf16["plan"]["peak_bytes"]) == \
        (fp32["plan"]["static_bytes"], fp32["plan"]["peak_bytes"])


def test_prepare_trainer_refuses_a_larger_bucket(tmp_path):
    """A config that sets reduce_bucket_size to DeepSpeed's default, more
    than the plan counts, is refused, naming it."""
    got = spawn(tmp_path, "test_deepspeed_trainer", 2, 500_000_000, "float32")
    assert "reduce_bucket_size is 500000000" in got.get("refused", ""), got
