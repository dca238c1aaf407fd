"""Exports read by the engines' own configuration parsers.

torchtitan's job config (``ckptplan export --to torchtitan``) is parsed by
torchtitan's ConfigManager, as ``torchrun ... --job.config_file`` would:
the activation checkpointing it reads is the plan's, by torchtitan's rule
(mode full checkpoints every layer; selective N the N-th, 2N-th, …
counted from 1). torchtitan installs where PyTorch 2.7 does
(python/requirements-fsdp.txt); .ci/run runs these with it.

Megatron-LM's flags (``--to megatron``) become Megatron Core's
TransformerConfig the way Megatron-LM's core_transformer_config_from_args
makes it (each flag the field of its name; the uneven split's and the
virtual stages' flags as its validate_args turns them into fields), and
the config validates them; Megatron Core's own get_num_layers_to_build
then says how many layers each pipeline rank builds, which must be the
split ckptplan planned. Megatron Core installs from
python/requirements-engines.txt (the tests marked engines).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import types

import pytest

ENGINES = [pytest.mark.fsdp2,
           pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None and not os.environ.get("CKPTPLAN_FSDP2"),
                              reason="torchtitan is not installed (.ci/run installs it from python/requirements-fsdp.txt)")]

# tiny-llama's plans: the same flags for the export and the plan it writes.
PLAN_FLAGS = {
    "every-k": ["--budget", "5.2MiB", "--solver", "every-k"],
    "none": ["--budget", "8MiB", "--solver", "none"],
    "selective": ["--budget", "5.2MiB", "--solver", "selective"],
    "at-4.7MiB": ["--budget", "4.7MiB", "--solver", "selective"],
}


def torchtitan_config(path: str):
    """torchtitan's ConfigManager on the file, as its trainer reads it. The
    package's __init__ imports its models and datasets; the parser needs
    only itself, so the package is entered without it."""
    if "torchtitan" not in sys.modules:
        spec = importlib.util.find_spec("torchtitan")
        pkg = types.ModuleType("torchtitan")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["torchtitan"] = pkg
    from torchtitan.config_manager import ConfigManager

    return ConfigManager().parse_args(["--job.config_file", path])


def run(binary: str, *args: str) -> str:
    p = subprocess.run([binary, *args], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.mark.parametrize("case", [pytest.param(c, marks=ENGINES) for c in PLAN_FLAGS])
def test_torchtitan_reads_the_plan(ckptplan_binary, tmp_path, case):
    flags = PLAN_FLAGS[case]
    out = tmp_path / "job.toml"
    run(ckptplan_binary, "export", "tiny-llama", *flags, "--to", "torchtitan", "-o", str(out))
    ac = torchtitan_config(str(out)).activation_checkpoint
    layers = json.loads(run(ckptplan_binary, "export", "tiny-llama", *flags, "--to", "json"))["layers"]
    text = out.read_text()
    if "closest setting" in text:
        # The plan keeps part of some layers: the setting written is one
        # torchtitan has, and the header says what it costs.
        assert ac.mode in ("none", "full", "selective") and "peak" in text
        assert any(l["mode"] == "selective" for l in layers)
        return
    n = len(layers)
    if ac.mode == "none":
        want = [False] * n
    elif ac.mode == "full":
        want = [True] * n
    else:
        assert ac.mode == "selective" and ac.selective_ac_option.isdigit(), ac
        k = int(ac.selective_ac_option)
        want = [(i + 1) % k == 0 for i in range(n)]
    assert want == [l["mode"] == "checkpoint" for l in layers], (ac, [l["mode"] for l in layers])
    assert all(l["mode"] in ("store", "checkpoint") for l in layers)


@pytest.mark.parametrize("flags", [pytest.param(f, marks=ENGINES) for f in (
    ["--solver", "torchtitan-op"],  # the plan is torchtitan's op-level policy
    [],  # the selective plan, whose closest setting in 150 GiB is it
)])
def test_torchtitan_reads_the_op_setting(ckptplan_binary, tmp_path, flags):
    """torchtitan reads selective_ac_option "op" as written for Llama 3 8B
    (the transformers profile); the plan it stands for runs every layer
    under the keep set torchtitan-op."""
    out = tmp_path / "job.toml"
    run(ckptplan_binary, "export", "llama-3-8b", "--budget", "150GiB", *flags, "--to", "torchtitan", "-o", str(out))
    ac = torchtitan_config(str(out)).activation_checkpoint
    assert (ac.mode, ac.selective_ac_option) == ("selective", "op")
    op = json.loads(run(ckptplan_binary, "export", "llama-3-8b", "--budget", "150GiB", "--solver", "torchtitan-op",
                        "--to", "json"))
    assert {(l["mode"], l.get("policy")) for l in op["layers"]} == {("selective", "torchtitan-op")}
    if flags:
        assert "Every layer runs as planned" in out.read_text()
    else:
        assert "closest setting" in out.read_text() and f"{100 * op['overhead']:+.1f}% compute" in out.read_text()


ENGINE_PARSERS = [pytest.mark.engines,
                  pytest.mark.skipif(importlib.util.find_spec("megatron") is None and not os.environ.get("CKPTPLAN_ENGINES"),
                                     reason="Megatron Core is not installed (.ci/run installs it from python/requirements-engines.txt)")]

# The models' shapes, from their published configurations (GPT-3: Brown
# et al. 2020, Table 2.1; Llama 3 70B: its config.json).
SHAPES = {
    "gpt3-175b": dict(num_layers=96, hidden_size=12288, num_attention_heads=96),
    "llama-3-70b": dict(num_layers=80, hidden_size=8192, num_attention_heads=64, num_query_groups=8),
    "llama-3-8b": dict(num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8),
}


def megatron_args(text: str) -> dict:
    """The flags of a Megatron-LM export, by argparse's dest: '--a-b 3'
    gives {'a_b': 3}; a flag alone is True; the values of a flag Megatron-LM
    declares nargs='*' (--recompute-modules) are a list. Comments are
    skipped."""
    args: dict = {}
    words = [w for line in text.splitlines() if not line.startswith("#") for w in line.split()]
    name = None
    for w in words:
        if w.startswith("--"):
            name = w[2:].replace("-", "_")
            assert name not in args, f"{w} given twice"
            args[name] = True
        else:
            assert name is not None, f"a value {w!r} without a flag"
            v = int(w) if w.isdigit() else w
            args[name] = v if args[name] is True else [*(args[name] if isinstance(args[name], list) else [args[name]]), v]
    for name in LIST_FLAGS:
        if name in args and not isinstance(args[name], list):
            args[name] = [] if args[name] is True else [args[name]]
    return args


# Megatron-LM's flags of nargs='*' (megatron/training/arguments.py).
LIST_FLAGS = ("recompute_modules",)


def megatron_config(args: dict, shape: dict, tp: int, sp: bool):
    """Megatron Core's TransformerConfig from Megatron-LM's parsed flags,
    as core_transformer_config_from_args makes it."""
    import dataclasses

    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    kw = dict(shape, tensor_model_parallel_size=tp, sequence_parallel=sp, pipeline_dtype=torch.bfloat16)
    for name, v in args.items():
        if name in fields:
            kw[name] = v
    pp = args.get("pipeline_model_parallel_size", 1)
    # validate_args: the virtual stages from the layers a chunk.
    if "num_layers_per_virtual_pipeline_stage" in args:
        kw["virtual_pipeline_model_parallel_size"] = shape["num_layers"] // pp // args["num_layers_per_virtual_pipeline_stage"]
    kw["num_layers_in_first_pipeline_stage"] = args.get("decoder_first_pipeline_num_layers")
    kw["num_layers_in_last_pipeline_stage"] = args.get("decoder_last_pipeline_num_layers")
    unknown = set(args) - fields - {"num_layers_per_virtual_pipeline_stage", "decoder_first_pipeline_num_layers",
                                    "decoder_last_pipeline_num_layers", "micro_batch_size", "global_batch_size"}
    assert not unknown, f"flags Megatron Core has no field for: {unknown}"
    return TransformerConfig(**kw)


def layers_built(config, monkeypatch) -> list:
    """Megatron Core's own count of the layers each pipeline rank builds
    (every chunk's, under the interleaved schedule)."""
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    pp, vp = config.pipeline_model_parallel_size, config.virtual_pipeline_model_parallel_size
    out = []
    for rank in range(pp):
        monkeypatch.setattr(ps, "get_pipeline_model_parallel_world_size", lambda: pp)
        monkeypatch.setattr(ps, "get_pipeline_model_parallel_rank", lambda: rank)
        monkeypatch.setattr(ps, "is_pipeline_first_stage", lambda ignore_virtual=False: rank == 0)
        monkeypatch.setattr(ps, "is_pipeline_last_stage", lambda ignore_virtual=False: rank == pp - 1)
        monkeypatch.setattr(ps, "get_virtual_pipeline_model_parallel_world_size", lambda: vp)
        out.append(get_num_layers_to_build(config) * (vp or 1))
    return out


MEGATRON_CASES = {
    # name: (model, tp, sp, flags, the recompute it must read (selective:
    # its modules last), the layers of each rank)
    "selective": ("llama-3-70b", 8, True,
                  ["--tp", "8", "--sp", "--seq", "4096", "--zero", "1", "--dp", "64", "--device", "h100-80gb",
                   "--profile", "megatron", "--attention", "eager", "--solver", "megatron-selective"],
                  ("selective", None, None, ["core_attn"]), None),
    "modules": ("llama-3-8b", 1, False,
                ["--profile", "megatron", "--seq", "8192", "--zero", "1", "--dp", "8", "--budget", "120GiB",
                 "--solver", "megatron-selective", "--recompute-modules", "mlp,layernorm"],
                ("selective", None, None, ["layernorm", "mlp"]), None),
    "uniform-2": ("llama-3-8b", 1, False,
                  ["--profile", "megatron", "--seq", "8192", "--batch", "4", "--budget", "200GiB",
                   "--solver", "every-k", "--k", "2"],
                  ("full", "uniform", 2), None),
    # Plans Megatron-LM's flags cannot say: the closest setting, written
    # with its peak and cost in the header, is flags Megatron Core reads.
    "closest-selective": ("llama-3-70b", 8, True,
                          ["--tp", "8", "--sp", "--seq", "4096", "--zero", "1", "--dp", "64", "--device", "h100-80gb",
                           "--profile", "megatron", "--attention", "eager"],
                          ("selective", None, None, ["core_attn"]), None),
    "closest-modules": ("llama-3-8b", 1, False,
                        ["--profile", "megatron", "--attention", "eager", "--seq", "8192", "--zero", "1", "--dp", "8",
                         "--budget", "87GiB"],
                        ("selective", None, None, ["core_attn", "layernorm", "mlp"]), None),
    "closest-block": ("llama-3-8b", 1, False,
                      ["--profile", "megatron", "--attention", "eager", "--seq", "8192", "--zero", "1", "--dp", "8",
                       "--budget", "84GiB"],
                      ("full", "block", "1 to 32"), None),
    "pp8": ("gpt3-175b", 8, True,
            ["--tp", "8", "--sp", "--pp", "8", "--microbatches", "64", "--device", "h100-80gb",
             "--solver", "megatron-selective"],
            ("selective", None, None, ["core_attn"]), [12] * 8),
    "pp8-closest": ("gpt3-175b", 8, True,
                    ["--tp", "8", "--sp", "--pp", "8", "--microbatches", "64", "--budget", "55GiB"],
                    ("selective", None, None, ["core_attn", "mlp"]), [12] * 8),
    "pp8-closest-block": ("gpt3-175b", 8, True,
                          ["--tp", "8", "--sp", "--pp", "8", "--microbatches", "64", "--budget", "50GiB"],
                          ("full", "block", "1 to 12"), [12] * 8),
    "pp8-uneven": ("gpt3-175b", 8, True,
                   ["--tp", "8", "--sp", "--pp", "8", "--microbatches", "16", "--pp-layers", "10,12,12,12,12,12,12,14",
                    "--device", "h100-80gb", "--solver", "megatron-selective"],
                   ("selective", None, None, ["core_attn"]), [10, 12, 12, 12, 12, 12, 12, 14]),
    "pp4-interleaved": ("llama-3-70b", 8, True,
                        ["--tp", "8", "--sp", "--profile", "megatron", "--attention", "eager", "--pp", "4",
                         "--microbatches", "8", "--pp-schedule", "interleaved", "--virtual-stages", "2",
                         "--device", "h100-80gb", "--budget", "72GiB"],
                        ("full", "block", 10), [20] * 4),
}


@pytest.mark.parametrize("case", [pytest.param(c, marks=ENGINE_PARSERS) for c in MEGATRON_CASES])
def test_megatron_core_reads_the_flags(ckptplan_binary, monkeypatch, case):
    model, tp, sp, flags, recompute, split = MEGATRON_CASES[case]
    text = run(ckptplan_binary, "export", model, *flags, "--to", "megatron")
    args = megatron_args(text)
    config = megatron_config(args, SHAPES[model], tp, sp)
    got = (config.recompute_granularity, config.recompute_method, config.recompute_num_layers)
    if isinstance(recompute[2], str):
        most = int(recompute[2].split()[-1])
        assert got[:2] == recompute[:2] and 1 <= got[2] <= most, text
        assert "closest setting" in text, text
    else:
        assert got == recompute[:3], text
    if recompute[0] == "selective":
        # core_attn alone is Megatron Core's default (no flag); the other
        # modules ckptplan's keep sets name.
        assert config.recompute_modules == recompute[3], text
        assert ("recompute_modules" in args) == (recompute[3] != ["core_attn"]), text
    if split is None:
        assert "pipeline_model_parallel_size" not in args
        return
    assert layers_built(config, monkeypatch) == split, text
    pp = config.pipeline_model_parallel_size
    m = int(flags[flags.index("--microbatches") + 1])
    assert args["micro_batch_size"] == 1 and args["global_batch_size"] == m, text
    assert pp == len(split)


def deepspeed_config(path: str):
    """DeepSpeed's own DeepSpeedConfig on the file, as deepspeed.initialize
    reads it (one process: world size 1)."""
    from deepspeed.runtime.config import DeepSpeedConfig

    return DeepSpeedConfig(path)


DEEPSPEED_FLAGS = {
    "every-layer": ["--budget", "5.2MiB", "--solver", "every-k"],
    "groups-of-2": ["--budget", "5.2MiB", "--solver", "every-k", "--k", "2"],
    "none": ["--budget", "8MiB", "--solver", "none"],
    "optimal": ["--budget", "5.2MiB", "--solver", "optimal"],
    "closest": ["--budget", "5.2MiB", "--solver", "selective"],
    "fp16-zero3": ["--budget", "5.2MiB", "--solver", "every-k", "--dtype", "fp16", "--batch", "2", "--zero", "3", "--dp", "2"],
    "zero2": ["--budget", "6MiB", "--solver", "every-k", "--zero", "2", "--dp", "2"],
}


@pytest.mark.parametrize("case", [pytest.param(c, marks=ENGINE_PARSERS) for c in DEEPSPEED_FLAGS])
def test_deepspeed_reads_the_config(ckptplan_binary, tmp_path, case):
    flags = DEEPSPEED_FLAGS[case]
    out = tmp_path / "ds.json"
    p = subprocess.run([ckptplan_binary, "export", "tiny-llama", *flags, "--to", "deepspeed", "-o", str(out)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    notes = p.stderr
    config = deepspeed_config(str(out))
    plan = json.loads(run(ckptplan_binary, "export", "tiny-llama", *flags, "--to", "json"))
    # The micro batch, the 16-bit dtype and the ZeRO stage the plan was made for.
    assert config.train_micro_batch_size_per_gpu == plan["batch"]
    assert config.bfloat16_enabled == (plan["dtype"] == "bf16")
    assert config.fp16_enabled == (plan["dtype"] == "fp16")
    assert config.zero_optimization_stage == plan.get("zero", 0)
    if plan.get("zero", 0) == 3:
        # The buckets set from the largest layer (test_deepspeed_zero3.py
        # measures what DeepSpeed gathers under them): tiny-llama's has
        # 64·64·2 + 64·32·2 + 3·64·192 + 2·64 parameters, all trained.
        z, layer = config.zero_config, 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 192 + 2 * 64
        assert (z.prefetch_bucket_size, z.max_live_parameters, z.reduce_bucket_size) == (layer, layer, layer)
        assert (z.max_reuse_distance, z.param_persistence_threshold) == (0, 0)
    if plan.get("zero", 0) in (1, 2):
        # One gradient bucket of the largest layer at a time
        # (test_deepspeed_zero12.py measures what DeepSpeed holds).
        z, layer = config.zero_config, 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 192 + 2 * 64
        assert (z.reduce_bucket_size, z.contiguous_gradients, z.overlap_comm) == (layer, True, False)
    ac = config.activation_checkpointing_config
    # Every checkpoint whole on the GPU, as the plan keeps it.
    assert not (ac.partition_activations or ac.cpu_checkpointing or ac.contiguous_memory_optimization)
    modes = [l["mode"] for l in plan["layers"]]
    if case == "groups-of-2":
        assert ac.number_checkpoints == len(modes) // 2 and "activation_checkpoint_interval=2" in notes
        return
    if "the closest setting" in notes:
        # The plan keeps part of some layers, or keeps a layer from an
        # earlier one's checkpoint: the notes name the first k layers
        # DeepSpeed checkpoints instead, with their peak and cost, and the
        # config counts them.
        assert case in ("closest", "optimal"), notes
        m = re.search(r"checkpoint (layers\.0(?:–(\d+))?) \((\d+) of (\d+) decoder layers\)", notes)
        every = "checkpoint every decoder layer" in notes
        assert m or every, notes
        k = len(modes) if every else int(m.group(3))
        assert ac.number_checkpoints == k and "peak" in notes
        return
    checkpointed = modes.count("checkpoint")
    assert ac.number_checkpoints == (checkpointed or None)
    assert set(modes) <= {"store", "checkpoint"}
    if 0 < checkpointed < len(modes):
        assert f"({checkpointed} of {len(modes)} decoder layers)" in notes, notes
