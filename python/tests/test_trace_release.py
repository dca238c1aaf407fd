"""The tracer refuses a transformers release whose traced graphs it has not
verified, with a message, rather than plan from a graph that keeps other
bytes than the model (test_trace.py runs where it traces)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ckptplan  # noqa: E402
from ckptplan._trace import TRACED_UP_TO  # noqa: E402
from ckptplan.versions import release  # noqa: E402

pytestmark = pytest.mark.skipif(release(transformers.__version__) <= TRACED_UP_TO,
                                reason=f"transformers {transformers.__version__} is traced (test_trace.py)")


def test_a_model_without_a_builder_is_refused(ckptplan_binary):
    config = transformers.AutoConfig.for_model("gpt_neox", num_hidden_layers=2, hidden_size=32,
                                               num_attention_heads=2, intermediate_size=64, vocab_size=64)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(ckptplan.TraceError, match=f"this is {transformers.__version__}"):
        ckptplan.plan(model, "1GiB", batch=1, seq=8)


def test_the_trace_command_says_why(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "gpt_neox", "num_hidden_layers": 2, "hidden_size": 32,
                                  "num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 64}))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.run([sys.executable, "-m", "ckptplan", "trace", str(config), "-o", str(tmp_path / "g.yaml")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 1 and "the tracer is verified on transformers up to 4.46" in p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "g.yaml").exists()
