"""DeepSpeed's ZeRO stage 3, run as the DeepSpeed export configures it,
holds what the plan for DeepSpeed (``--sharding deepspeed``) says: its
optimizer step to within a few scalars, and its forward and backward
within the plan's peak for them, less than 1.5% under it.

Stage 3 keeps, beside the rank's shard of the 16-bit weights and the
optimizer's fp32 partition and moments, two buffers all step: the
gradient partitions (one flat 16-bit buffer, filled by the reduce-scatters
and never freed) and the gradient bucket (``reduce_bucket_size``
elements, allocated with the optimizer; the export sets it to the largest
layer's trainable parameters). Its step flattens the gradient partition,
converts the copy to fp32 and updates the fp32 partition as one tensor
(costmodel's deepSpeedStep): with PyTorch's for-loop AdamW on the CPU, a
square root and a quotient of the partition's size beside it.

Each case trains a transformers Llama for three steps under DeepSpeed's
own engine (``deepspeed.initialize`` over ``deepspeed.zero.Init``) in a
two-rank gloo group on the CPU, under PyTorch's profiler with
``profile_memory`` from before the model is made, on rank 0. What a part
holds is measured as in test_deepspeed_zero12: what the run's own tensors
(the weights' shard and whatever is still gathered, the buffers, the
batch, the fp32 partition, the optimizer's state, the gradient partitions
and the bucket) hold when the part starts, plus the most the allocator's
total rises over its value then. That leaves out what the CPU run holds
beyond its steady state: buffers ``deepspeed.zero.Init`` gathered while
transformers initialized the weights, some of which stay alive, a
different amount run to run (65,536 to 197,376 bytes seen on this model),
and what gloo's work objects still hold of earlier collectives. The
allocator's total is counted apart from what CUDA would not hold: the
buffers gloo's collectives allocate (a reduce-scatter's copy of the
bucket, 73,984 B here, held while it runs and at times after), and the
workspaces the CPU's 16-bit matrix products allocate and free within
themselves (apart_from_collectives).

The step is the plan's (``step_peak_bytes``, ``--optimizer
adamw-forloop``) less at most 128 bytes: the plan counts the inputs twice,
as the ids and the labels, which are one tensor here, and DeepSpeed's
scalars (the gradient norm, the step counter) take a few bytes of that
back. The forward and backward stay within the plan's peak for them (its
static memory and activation peak) and the random-number states the
plan lists apart (host memory under CUDA, the CPU allocator's here), and
no more than 1.5% under it: the plan counts DeepSpeed's gathers, the
gradient its hook copies into the bucket and the bucket's reduction
module by module (costmodel.DeepSpeedGathers, checked block by block in
test_deepspeed_zero3), but adds a block's most to its kernels' most,
which come at different moments: storing everything, 1,830,766 B
measured against the plan's 1,853,672 (in the head's backward, where
the loss's gradients peak before the head's weight gradient appears);
every layer checkpointed, 1,752,046 B against 1,750,328 and the 20,288 B
it lists on the host.

DeepSpeed's CPU backend compiles a shared-memory all-reduce with ninja when
it starts; the cases run gloo's instead, as in test_deepspeed_zero3.
"""
from __future__ import annotations

import gc
import importlib.util
import json
import os

import pytest

from test_deepspeed_zero3 import FLAGS, deepspeed_llama, model_config, spawn  # noqa: F401 (model_config: a fixture)
from test_engine_configs import run

pytestmark = [pytest.mark.engines,
              pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None and not os.environ.get("CKPTPLAN_ENGINES"),
                                 reason="DeepSpeed is not installed (.ci/run installs it from python/requirements-engines.txt)")]


def _worker(rank: int, port: int, zero: dict, checkpointing: bool, out: str) -> None:
    """One rank: three training steps of the Llama under DeepSpeed's stage
    3, under the profiler; rank 0 writes what the run's own tensors held
    at most in the forward and backward, and in the optimizer step, of the
    second and third steps."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from allocator_events import apart_from_collectives

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model, engine, x = deepspeed_llama(rank, port, zero, checkpointing, zero_init=True)
        ds = engine.optimizer

        def own() -> int:
            """The bytes of the storages the run's own tensors hold."""
            held = [*model.buffers(), x, *ds.fp16_partitioned_groups_flat, *ds.fp32_partitioned_groups_flat,
                    ds.grad_partitions_flat_buffer, getattr(ds, "_DeepSpeedZeroOptimizer_Stage3__ipg_bucket_flat_buffer")]
            held += [v for st in ds.optimizer.state.values() for v in st.values() if torch.is_tensor(v)]
            for p in model.parameters():
                held += [p.ds_tensor, p.data]
            held += [g.grad for g in ds.fp32_partitioned_groups_flat if g.grad is not None]
            return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                        for t in held if t is not None and t.untyped_storage().nbytes() > 0}.values())

        known = {}  # what the run's own tensors hold when a part starts, by part
        for step in range(3):
            gc.collect()
            known[f"backward {step}"] = own()
            with record_function(f"backward {step}"):
                loss = engine(input_ids=x, labels=x).loss
                engine.backward(loss)
                del loss
            known[f"update {step}"] = own()
            with record_function(f"update {step}"):
                engine.step()
    if rank != 0:
        return
    spans, events = apart_from_collectives(prof, lambda name: name if name.startswith(("backward ", "update ")) else None,
                                           workspaces=True)
    steady = {}
    for name, (start, end) in spans.items():
        within = [(b, size) for t, b, size in events if start <= t <= end]
        # From what the run's tensors hold when the part starts, up by the
        # most the allocator's total rises over its value then.
        steady[name] = known[name] + max(b for b, _ in within) - (within[0][0] - within[0][1])
    with open(out, "w") as f:
        json.dump({"backward": max(steady["backward 1"], steady["backward 2"]),
                   "update": max(steady["update 1"], steady["update 2"])}, f)


@pytest.mark.parametrize("solver", ["none", "every-k"])
def test_deepspeed_zero3_step_is_the_plans(ckptplan_binary, model_config, tmp_path, solver):
    """Under the exported config (every layer stored, or every layer
    checkpointed), DeepSpeed's optimizer step is the plan's and its
    forward and backward within the plan's peak for them."""
    flags = [*FLAGS, "--budget", "1GiB", "--solver", solver, "--optimizer", "adamw-forloop"]
    plan = json.loads(run(ckptplan_binary, "plan", model_config, *flags, "--format", "json"))
    exported = json.loads(run(ckptplan_binary, "export", model_config, *flags, "--to", "deepspeed"))
    measured = spawn(tmp_path, "test_deepspeed_zero3_step", exported["zero_optimization"], solver == "every-k")
    backward = plan["static_bytes"] + plan["activation_peak_bytes"]
    host = sum(st.get("host_bytes", 0) for st in plan["stages"])
    print(f"{solver}: DeepSpeed's step {measured['update']} B, the plan's {plan['step_peak_bytes']} B; "
          f"forward and backward {measured['backward']} B, the plan's {backward} B and {host} B on the host")
    assert 0 <= plan["step_peak_bytes"] - measured["update"] <= 128, (measured, plan["step_peak_bytes"])
    assert measured["backward"] <= backward + host, (measured, backward, host)
    assert measured["backward"] >= 0.985 * backward, (measured, backward)
