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


def accelerator(kind: str, config=None, mixed_precision: str = "no"):
    """An object shaped as accelerate's Accelerator is where ckptplan reads
    it: its state's distributed type and plugins, its mixed precision."""
    plugin = types.SimpleNamespace(hf_ds_config=types.SimpleNamespace(config=config)) if config is not None else None
    state = types.SimpleNamespace(distributed_type=types.SimpleNamespace(value=kind), deepspeed_plugin=plugin,
                                  fsdp_plugin=None)
    return types.SimpleNamespace(state=state, mixed_precision=mixed_precision)


def test_the_names_are_accelerates():
    accelerate = pytest.importorskip("accelerate")
    assert {accelerate.utils.DistributedType.FSDP.value, accelerate.utils.DistributedType.DEEPSPEED.value} == \
        {"FSDP", "DEEPSPEED"}


@pytest.mark.parametrize("config, mixed, flags", [
    ({"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}, "no", ["--zero", "3", "--dtype", "bf16"]),
    ({"zero_optimization": {"stage": 1}, "fp16": {"enabled": "auto"}}, "fp16", ["--zero", "1", "--dtype", "fp16"]),
    ({"zero_optimization": {"stage": "2"}, "bf16": {"enabled": "auto"}}, "no", ["--zero", "2", "--dtype", "fp32"]),
])
def test_flags(config, mixed, flags):
    run = DeepSpeedRun.of(accelerator("DEEPSPEED", config, mixed), 4, "f")
    assert run.flags() == ["--dp", "4", flags[0], flags[1], "--sharding", "deepspeed", *flags[2:]]


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
    ("DEEPSPEED", {"zero_optimization": {"stage": 2}, "optimizer": {"type": "Lamb"}}, "'Lamb' optimizer"),
])
def test_refused(kind, config, says):
    with pytest.raises(CkptplanUsageError, match="f: ") as err:
        DeepSpeedRun.of(accelerator(kind, config), 2, "f")
    assert says in str(err.value)


def test_adam_is_fused():
    run = DeepSpeedRun.of(accelerator("DEEPSPEED", {"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW"}}),
                          2, "f")
    assert run.optimizer() == "adamw"


def test_hold_fills_what_deepspeed_or_auto_would_set():
    config = {"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_max_live_parameters": 500,
                                    "stage3_max_reuse_distance": 0}}
    DeepSpeedRun(config=config, ranks=2).hold(PLAN3)
    # Its own smaller setting is the user's; the rest the plan's.
    assert config["zero_optimization"] == {**PLAN3, "stage3_max_live_parameters": 500}


@pytest.mark.parametrize("given, says", [
    ({"reduce_bucket_size": 5e8}, "reduce_bucket_size is 500000000.0, the plan's 1000"),
    ({"stage3_max_reuse_distance": 1e9}, "stage3_max_reuse_distance is 1000000000.0, the plan's 0"),
    ({"stage3_param_persistence_threshold": "10"}, "stage3_param_persistence_threshold is '10'"),
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
