"""What ckptplan.plan plans besides a live model, and device="auto".

A model folder as PEFT saves one — config.json and adapter_config.json —
planned by path as the CLI plans it, against the same folder loaded by
PEFT (PeftModel.from_pretrained, trainable) and planned live: PEFT
resolves the folder's target_modules on the real modules (names, a
pattern, all-linear, its defaults for the model type), and the live plan
reads what it adapted from the layers themselves. The two plans save the
same adapter tensors, of the same sizes, in every layer: the same
targets, rank, dtype and dropout.
"""
from __future__ import annotations

import json
import re
import subprocess

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import ckptplan  # noqa: E402

BATCH, SEQ = 2, 32


def build(family: str) -> "torch.nn.Module":
    """A tiny model of family in bf16, with random weights."""
    torch.manual_seed(0)
    if family == "gpt2":
        cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
        model = transformers.LlamaForCausalLM(cfg)
    model.config.use_cache = False
    return model.to(torch.bfloat16)


CASES = {
    "q and v, dropout": ("llama", dict(r=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.1,
                                             lora_alpha=32)),
    "PEFT's default": ("llama", dict(r=4)),
    "all-linear": ("llama", dict(r=4, target_modules="all-linear")),
    "a pattern": ("llama", dict(r=4, target_modules=r".*\.(k|o)_proj")),
    "a name's end": ("llama", dict(r=4, target_modules=["mlp.down_proj", "self_attn.v_proj"])),
    "gpt2 default": ("gpt2", dict(r=4, fan_in_fan_out=True)),
    "gpt2 c_proj": ("gpt2", dict(r=4, target_modules=["c_proj"], fan_in_fan_out=True)),
}


def _environment(model) -> list[str]:
    """The flags ckptplan.plan gives the binary for the live model, but
    for its batch, sequence and LoRA: what the machine and the installed
    stack run (CPU kernels, the transformers release, the model's
    buffers), for the folder's plan to be made for the same."""
    from ckptplan.introspect import describe

    flags, out = describe(model, batch=BATCH, seq=SEQ).flags(), []
    for name, value in zip(flags[::2], flags[1::2]):
        if name not in ("--batch", "--seq") and not name.startswith("--lora-"):
            out += [name, value]
    return out


@pytest.mark.parametrize("case", CASES)
def test_folder_plans_the_adapter_peft_loads(ckptplan_binary, tmp_path, case):
    """The folder's plan is the live model's, layer by layer; its
    trainable parameters and their gradients' bytes are PEFT's."""
    family, kwargs = CASES[case]
    folder = tmp_path / "tuned"
    model = build(family)
    model.config.save_pretrained(folder)
    peft.get_peft_model(model, peft.LoraConfig(task_type="CAUSAL_LM", **kwargs)).save_pretrained(folder)
    assert (folder / "config.json").exists() and (folder / "adapter_config.json").exists()

    live = peft.PeftModel.from_pretrained(build(family), str(folder), is_trainable=True)
    trained = [p for p in live.parameters() if p.requires_grad]
    assert trained, "PEFT trains nothing"
    env = _environment(live)
    by_model = ckptplan.plan(live, "1GiB", batch=BATCH, seq=SEQ, solver="none")
    by_path = ckptplan.plan(folder, "1GiB", batch=BATCH, seq=SEQ, solver="none", extra_args=env)
    assert [(l.name, l.kept_bytes) for l in by_path.layers] == [(l.name, l.kept_bytes) for l in by_model.layers]
    assert (by_path.static_bytes, by_path.peak_bytes) == (by_model.static_bytes, by_model.peak_bytes)
    cost = json.loads(ckptplan._binary.call(["cost", str(folder), "--batch", str(BATCH), "--seq", str(SEQ),
                                              *env, "--format", "json"]))
    assert cost["lora_rank"] == kwargs["r"]
    assert cost["static"]["trainable_parameters"] == sum(p.numel() for p in trained)
    # fp32 adapters over bf16 weights, as PEFT makes them.
    assert {p.dtype for p in trained} == {torch.float32}
    assert cost["static"]["gradients_bytes"] == sum(p.numel() * p.element_size() for p in trained)
    # The plan says the adapters' alpha, PEFT's (its default where the
    # config has none), from the folder and from the live model alike.
    alpha = live.peft_config["default"].lora_alpha
    text = ckptplan._binary.call(["plan", str(folder), "--budget", "1GiB", "--batch", str(BATCH), "--seq", str(SEQ),
                                  *env])
    assert f"LoRA rank {kwargs['r']}, alpha {alpha:g}, on " in text
    from ckptplan.introspect import describe

    flags = describe(live, batch=BATCH, seq=SEQ).flags()
    assert float(flags[flags.index("--lora-alpha") + 1]) == alpha


def test_a_bundled_name_plans_by_name(ckptplan_binary):
    plan = ckptplan.plan("tiny-llama", "64MiB", batch=2, seq=32, solver="none")
    assert plan.batch == 2 and plan.seq == 32 and plan.feasible
    again = plan.replan(1, 16)
    assert again.batch == 1 and again.seq == 16 and again.peak_bytes < plan.peak_bytes


def test_a_folder_without_config_is_refused(ckptplan_binary, tmp_path):
    with pytest.raises(ckptplan.CkptplanError, match="a folder without config.json"):
        ckptplan.plan(tmp_path, "1GiB", batch=2, seq=32)


def test_auto_device_plans_for_the_gpu_pytorch_runs_on(ckptplan_binary, monkeypatch):
    """device="auto" is the GPU torch.cuda reports (here one reporting an
    H100's 81,559 MiB): the same budget and reserve as the H100 by name."""
    import types

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=81559 << 20))
    auto = ckptplan.plan("tiny-llama", batch=2, seq=32, device="auto")
    named = ckptplan.plan("tiny-llama", batch=2, seq=32, device="h100-80gb")
    assert (auto.budget_bytes, auto.reserve_bytes) == (named.budget_bytes, named.reserve_bytes) == (81559 << 20, (1024 + 81559 // 20) << 20)


@pytest.mark.parametrize("name,known", [("NVIDIA H100 80GB HBM3", True), ("NVIDIA H100 80GB HBM3 MIG 7g.80gb", False)])
def test_auto_device_names_a_gpu_ckptplan_knows(ckptplan_binary, monkeypatch, name, known):
    """device="auto" on a GPU ckptplan knows by name plans it as the named
    one, in time on its figures; on one it knows by its memory alone (a
    MIG slice has a share of the compute), in FLOPs."""
    import types

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(name=name, total_memory=81559 << 20))
    lora = ["--lora-rank", "16"]
    auto = ckptplan.plan("llama-3-8b", batch=2, seq=8192, device="auto", extra_args=lora)
    timed = ckptplan.plan("llama-3-8b", batch=2, seq=8192, device="h100-80gb", extra_args=lora)
    flops = ckptplan.plan("llama-3-8b", batch=2, seq=8192, device="h100-80gb", objective="flops", extra_args=lora)
    assert timed.layers != flops.layers  # the two objectives plan this setup apart
    assert auto.layers == (timed if known else flops).layers
    assert auto.budget_bytes == 81559 << 20


def test_known_gpus_are_the_binarys(ckptplan_binary):
    """Every device the package names a GPU by is one the binary knows."""
    from ckptplan import _gpus

    usage = subprocess.run([ckptplan_binary, "plan", "-h"], capture_output=True, text=True).stderr
    listed = re.search(r"GPU, whose memory is the budget and sets the reserve: ([a-z0-9 |-]+), or its memory", usage)
    assert listed, usage
    names = {n.strip() for n in listed.group(1).split("|")}
    assert {device for _, device in _gpus._KNOWN} <= names


def test_auto_device_without_a_gpu_is_refused(ckptplan_binary, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ckptplan.CkptplanUsageError, match="PyTorch sees none"):
        ckptplan.plan("tiny-llama", batch=2, seq=32, device="auto")
