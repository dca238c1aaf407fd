"""Exports read by the engines' own configuration parsers.

torchtitan's job config (``ckptplan export --to torchtitan``) is parsed by
torchtitan's ConfigManager, as ``torchrun ... --job.config_file`` would:
the activation checkpointing it reads is the plan's, by torchtitan's rule
(mode full checkpoints every layer; selective N the N-th, 2N-th, …
counted from 1). torchtitan installs where PyTorch 2.7 does
(python/requirements-fsdp.txt); .ci/run runs these with it.
"""
from __future__ import annotations

import importlib.util
import json
import os
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
