"""What ``prepare_trainer`` and ``prepare_accelerator`` read of a run
under DeepSpeed (``ckptplan._deepspeed``), without DeepSpeed: the flags
of a config, the settings it takes from the plan, and what it refuses.
test_deepspeed_trainer runs a Trainer under DeepSpeed itself."""
from __future__ import annotations

import types

import pytest

from ckptplan import CkptplanUsageError
from ckptplan._deepspeed import DeepSpeedRun

PLAN3 = {"stage": 3, "reduce_bucket_size": 1000, "stage3_prefetch_bucket_size": 2000,
         "stage3_max_live_parameters": 2000, "stage3_max_reuse_distance": 0, "stage3_param_persistence_threshold": 0}


def accelerator(kind: str, config=None):
    """An object shaped as accelerate's Accelerator is where ckptplan reads
    it: its state's distributed type and plugins."""
    plugin = types.SimpleNamespace(hf_ds_config=types.SimpleNamespace(config=config)) if config is not None else None
    state = types.SimpleNamespace(distributed_type=types.SimpleNamespace(value=kind), deepspeed_plugin=plugin,
                                  fsdp_plugin=None)
    return types.SimpleNamespace(state=state)


def test_the_names_are_accelerates():
    accelerate = pytest.importorskip("accelerate")
    assert {accelerate.utils.DistributedType.FSDP.value, accelerate.utils.DistributedType.DEEPSPEED.value} == \
        {"FSDP", "DEEPSPEED"}


@pytest.mark.parametrize("config, flags", [
    ({"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}, ["--zero", "3", "--dtype", "bf16"]),
    ({"zero_optimization": {"stage": 1}, "fp16": {"enabled": True}}, ["--zero", "1", "--dtype", "fp16"]),
    ({"zero_optimization": {"stage": "2"}, "bf16": {"enabled": False}}, ["--zero", "2", "--dtype", "fp32"]),
])
def test_flags(config, flags):
    run = DeepSpeedRun.of(accelerator("DEEPSPEED", config), 4, "f")
    # An fp32 master partition and moments, whatever the model's dtype.
    assert run.flags() == ["--dp", "4", flags[0], flags[1], "--sharding", "deepspeed", *flags[2:],
                           "--master-weights", "fp32"]


def test_no_deepspeed_is_none():
    assert DeepSpeedRun.of(accelerator("MULTI_GPU"), 2, "f") is None
    assert DeepSpeedRun.of(None, 1, "f") is None


@pytest.mark.parametrize("kind, config, says", [
    ("FSDP", None, "shards the model with FSDP"),
    ("DEEPSPEED", {"zero_optimization": {"stage": 0}}, "ZeRO stage 0"),
    ("DEEPSPEED", {}, "ZeRO stage 0"),
    ("DEEPSPEED", {"zero_optimization": {"stage": "three"}}, "'three', not a stage 0 to 3"),
    ("DEEPSPEED", {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}},
     "offload_optimizer offloads to 'cpu'"),
    ("DEEPSPEED", {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}, "offload_param"),
    ("DEEPSPEED", {"zero_optimization": {"stage": 2, "cpu_offload": True}}, "cpu_offload"),
    ("DEEPSPEED", {"zero_optimization": {"stage": 3, "cpu_offload_param": True}}, "cpu_offload_param"),
    ("DEEPSPEED", {"zero_optimization": {"stage": 3, "mics_shard_size": 2}}, "mics_shard_size"),
    ("DEEPSPEED", {"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2}}, "zero_hpz_partition_size"),
    ("DEEPSPEED", {"zero_optimization": {"stage": 3, "zero_quantized_weights": True}}, "zero_quantized_weights"),
    ("DEEPSPEED", {"zero_optimization": {"stage": 3}, "tensor_parallel": {"autotp_size": 2}}, "autotp_size"),
    ("DEEPSPEED", {"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}}, 'bf16.enabled is still "auto"'),
    ("DEEPSPEED", {"zero_optimization": {"stage": 1}, "bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}},
     "BF16 optimizer"),
    ("DEEPSPEED", {"zero_optimization": {"stage": 2}, "optimizer": {"type": "Lamb"}}, "'Lamb' optimizer"),
])
def test_refused(kind, config, says):
    with pytest.raises(CkptplanUsageError, match="f: ") as err:
        DeepSpeedRun.of(accelerator(kind, config), 2, "f")
    assert says in str(err.value)


@pytest.mark.parametrize("made, flag", [
    ({"type": "AdamW"}, "adamw-fused"), ({"type": "Adam", "params": {"torch_adam": True}}, "adamw"), (None, None)])
def test_optimizer(made, flag):
    config = {"zero_optimization": {"stage": 2}, **({"optimizer": made} if made else {})}
    assert DeepSpeedRun.of(accelerator("DEEPSPEED", config), 2, "f").optimizer_flag() == flag


def test_hold_fills_what_deepspeed_or_auto_would_set():
    config = {"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_max_live_parameters": 500,
                                    "stage3_max_reuse_distance": 0, "prefetch_bucket_size": "1500"}}
    DeepSpeedRun(config=config, ranks=2).hold(PLAN3)
    # Its own smaller settings are the user's, spelt as the user spelt
    # them (DeepSpeed reads stage 3's without the prefix too); the rest
    # the plan's.
    want = {**PLAN3, "stage3_max_live_parameters": 500, "prefetch_bucket_size": "1500"}
    del want["stage3_prefetch_bucket_size"]
    assert config["zero_optimization"] == want


@pytest.mark.parametrize("given, says", [
    ({"reduce_bucket_size": 5e8}, "reduce_bucket_size is 500000000.0, the plan's 1000"),
    ({"stage3_max_reuse_distance": 1e9}, "stage3_max_reuse_distance is 1000000000.0, the plan's 0"),
    ({"stage3_param_persistence_threshold": "10"}, "stage3_param_persistence_threshold is '10'"),
    ({"max_live_parameters": 5000}, "max_live_parameters is 5000, the plan's 2000"),
    ({"reduce_bucket_size": "lots"}, "reduce_bucket_size is 'lots'"),
])
def test_hold_refuses_more_than_the_plan(given, says):
    config = {"zero_optimization": {"stage": 3, **given}}
    before = json_copy(config)
    with pytest.raises(CkptplanUsageError, match=says):
        DeepSpeedRun(config=config, ranks=2).hold(PLAN3)
    assert config == before  # nothing set


def test_hold_refuses_overlap():
    config = {"zero_optimization": {"stage": 2, "overlap_comm": True}}
    with pytest.raises(CkptplanUsageError, match="overlap_comm is True, the plan's False"):
        DeepSpeedRun(config=config, ranks=2).hold({"stage": 2, "contiguous_gradients": True, "overlap_comm": False,
                                                   "reduce_bucket_size": 10})


def json_copy(d: dict) -> dict:
    import json
    return json.loads(json.dumps(d))
