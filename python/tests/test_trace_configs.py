"""Real config.json files of model types ckptplan has no builder for,
traced at their full size and planned.

The files in configs/ are those published with the models (GPT-NeoX's
Pythia, OLMo 2, Gemma 3 and its multimodal sibling, Command R, Falcon,
GPT-J, StarCoder, DeepSeek-V2 and V3, Mistral Small 3.1). Each is traced on
fake tensors (no weights) as ``ckptplan trace`` does, and the graph must
plan under a budget that needs recomputation; its parameters must be the
ones transformers builds on the meta device from the same config (the
text model's, for a multimodal config), and it must have a block per
decoder layer.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ckptplan import TraceError, _binary, trace  # noqa: E402
from ckptplan._trace import load_config, text_config  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
CONFIGS = sorted(f[:-5] for f in os.listdir(HERE) if f.endswith(".json"))
SEQ = 256
pytestmark = pytest.mark.newer  # on every stack CI runs, 4.57 (its MoE not traced) among them
KNOWN = transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES


def path(name: str) -> str:
    return os.path.join(HERE, name + ".json")


def model_type(name: str) -> str:
    with open(path(name), encoding="utf-8") as f:
        return json.load(f)["model_type"]


def grouped_experts() -> bool:
    """Whether this transformers runs experts as grouped products (from 5),
    whose shapes do not depend on the routing."""
    return int(transformers.__version__.split(".")[0]) >= 5


def meta_parameters(config) -> int:
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(text_config(config))
    return model.num_parameters()


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """name → the traced graph's file (traced once for the module)."""
    out = {}

    def get(name: str) -> str:
        if name not in out:
            file = tmp_path_factory.mktemp("traced") / f"{name}.yaml"
            file.write_text(trace(path(name), seq=SEQ))
            out[name] = str(file)
        return out[name]

    return get


@pytest.mark.parametrize("name", CONFIGS)
def test_real_config_traces_and_plans(ckptplan_binary, traced, name):
    if model_type(name) not in KNOWN:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type(name)}")
    config = load_config(path(name))
    moe = getattr(text_config(config), "n_routed_experts", None)
    if moe and not grouped_experts():
        with pytest.raises(TraceError, match="depends on the data"):
            traced(name)
        return
    graph = traced(name)
    store = json.loads(_binary.call(["plan", "--optimizer", "none", "--format", "json", "--solver", "none", "--budget", "100TiB", graph]))
    every = json.loads(_binary.call(["plan", "--optimizer", "none", "--format", "json", "--solver", "every-k", "--budget", "100TiB", graph]))
    assert every["peak_bytes"] < store["peak_bytes"]
    budget = (every["peak_bytes"] + store["peak_bytes"]) // 2
    plan = json.loads(_binary.call(["plan", "--optimizer", "none", "--format", "json", "--budget", f"{budget}B", graph]))
    assert plan["feasible"] and plan["peak_bytes"] <= budget
    assert plan["cost"] > plan["baseline_cost"], "the budget needs recomputation"
    cost = json.loads(_binary.call(["cost", "--format", "json", graph]))
    assert cost["static"]["parameters"] == meta_parameters(config)
    layers = [b for b in cost["blocks"] if b["name"].startswith("layers.")]
    assert len(layers) == text_config(config).num_hidden_layers


def test_trace_command_on_a_multimodal_config(ckptplan_binary, tmp_path):
    """ckptplan trace on Mistral Small 3.1's config traces its text model,
    says so, and the graph plans."""
    if "mistral3" not in KNOWN:
        pytest.skip(f"transformers {transformers.__version__} has no mistral3")
    out = tmp_path / "m.yaml"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.run([sys.executable, "-m", "ckptplan", "trace", path("mistral-small-3.1-24b"), "--seq", "64",
                        "-o", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    text = out.read_text()
    assert "the text model (mistral) of a mistral3 config" in text.splitlines()[1]
    plan = json.loads(_binary.call(["plan", "--format", "json", "--budget", "100TiB", str(out)]))
    assert plan["feasible"] and len([l for l in plan["stages"] if l["name"].startswith("layers.")]) == 40
