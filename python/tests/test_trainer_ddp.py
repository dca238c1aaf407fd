"""``prepare_trainer`` on a Trainer under PyTorch's DistributedDataParallel
plans DDP's gradient buckets over its ranks.

Two ranks of a gloo group on the CPU each build a transformers Trainer
(accelerate's MULTI_CPU), call ``ckptplan.prepare_trainer`` and train a
step; rank 0's plan is the one ``ckptplan.plan`` makes of the model given
``--dp 2`` (DDP's buckets, a copy of every trained gradient, which
test_step_peak.test_ddp_buckets measures), and more than the plan on one
rank by those buckets.
"""
from __future__ import annotations

import json
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ckptplan  # noqa: E402


def _worker(rank: int, port: int, out: str) -> None:
    """One rank: rank 0 writes the plan prepare_trainer makes, the one
    ckptplan.plan makes given --dp 2 and the one it makes on one rank."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")
    args = transformers.TrainingArguments(tempfile.mkdtemp(), per_device_train_batch_size=2, report_to=[],
                                          use_cpu=True, max_steps=1, ddp_backend="gloo")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=64))
    data = [{"input_ids": list(range(1, 17)), "labels": list(range(1, 17))}] * 8
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    optimizer = trainer.create_optimizer()
    by_hand = ckptplan.plan(model, "64MiB", batch=2, seq=16, optimizer=optimizer, extra_args=["--dp", "2"])
    alone = ckptplan.plan(model, "64MiB", batch=2, seq=16, optimizer=optimizer)
    plan = ckptplan.prepare_trainer(trainer, "64MiB")
    kind = str(trainer.accelerator.state.distributed_type.value)
    trainer.train()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"plan": plan.raw, "by_hand": by_hand.raw, "alone": alone.raw, "kind": kind,
                       "grads": sum(p.numel() * p.element_size() for p in model.parameters())}, f)


def test_prepare_trainer_plans_ddp(tmp_path):
    from test_deepspeed_zero3 import spawn

    got = spawn(tmp_path, "test_trainer_ddp")
    assert got["kind"] == "MULTI_CPU"
    plan, by_hand, alone = got["plan"], got["by_hand"], got["alone"]
    assert (plan["static_bytes"], plan["peak_bytes"]) == (by_hand["static_bytes"], by_hand["peak_bytes"])
    # DDP's buckets: a copy of every (trained) gradient.
    assert plan["static_bytes"] - alone["static_bytes"] == got["grads"]
