"""``ckptplan export --to hf`` run on a real transformers model: the calls
it writes do what it says, or fail saying why, never silently otherwise."""
from __future__ import annotations

import copy
import json
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ckptplan import _binary  # noqa: E402
from ckptplan.introspect import describe  # noqa: E402
from ckptplan import measure  # noqa: E402

from test_real_stack import BATCH, SEQ, batch, build  # noqa: E402


def export(model, tmp_path, *args: str) -> str:
    setup = describe(model, batch=BATCH, seq=SEQ)
    path = os.path.join(tmp_path, "config.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(setup.config, f)
    # An optimizer with no state keeps the step's peak in the forward and
    # backward, where the budgets these tests take choose between layers.
    return _binary.call(["export", "--optimizer", "none", *args, *setup.flags(), path])


def test_every_layer_checkpointed_recomputes_what_the_plan_says(ckptplan_binary, tmp_path):
    """Checkpointing every layer through transformers' own switch reruns
    the FLOPs the plan's JSON promises, with the same gradients."""
    ref = build("llama", "sdpa", "fp32")
    code = export(ref, tmp_path, "--solver", "every-k", "--budget", "1GiB", "--to", "hf")
    promise = json.loads(export(ref, tmp_path, "--solver", "every-k", "--budget", "1GiB", "--to", "json"))
    model = copy.deepcopy(ref)
    exec(code, {"model": model})
    assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing  # named so from 5.23
    got = measure(model, batch())
    base_model = copy.deepcopy(ref)
    base = measure(base_model, batch())
    assert got.backward_flops - base.backward_flops == promise["recompute_flops"]
    for p, q in zip(model.parameters(), base_model.parameters()):
        assert torch.equal(p.grad, q.grad)


def test_some_layers_need_per_layer_control(ckptplan_binary, tmp_path):
    """A plan that stores some layers and checkpoints others needs each
    layer's own flag (transformers 4.52 and later); on older transformers
    the calls refuse instead of checkpointing every layer."""
    ref = build("llama", "sdpa", "fp32")
    low = json.loads(export(ref, tmp_path, "--solver", "every-k", "--budget", "1GiB", "--to", "json"))
    high = json.loads(export(ref, tmp_path, "--solver", "none", "--budget", "1GiB", "--to", "json"))
    budget = f"{(low['peak_bytes'] + high['peak_bytes']) // 2}B"
    code = export(ref, tmp_path, "--solver", "optimal", "--budget", budget, "--to", "hf")
    assert "CHECKPOINTED = {" in code
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="transformers >= 4.52"):
            exec(code, {"model": copy.deepcopy(ref)})
    else:  # pragma: no cover - newer transformers than the pinned one
        exec(code, {"model": copy.deepcopy(ref)})


def test_pytorch_module_refuses_other_shapes(ckptplan_binary, tmp_path):
    """The module ``export --to pytorch`` writes runs a smaller batch, and
    says to export again when a layer is called with a larger batch or
    sequence than planned."""
    model = build("llama", "sdpa", "fp32")
    code = export(model, tmp_path, "--solver", "every-k", "--budget", "1GiB", "--to", "pytorch")
    scope: dict = {}
    exec(code, scope)
    scope["apply_plan"](model.model.layers)
    ids = torch.zeros(1, SEQ, dtype=torch.long)
    model(input_ids=ids, labels=ids).loss.backward()
    ids = torch.zeros(BATCH, SEQ + 1, dtype=torch.long)
    with pytest.raises(ValueError, match=f"sequence {SEQ + 1}.*export a plan for these shapes"):
        model(input_ids=ids, labels=ids)
