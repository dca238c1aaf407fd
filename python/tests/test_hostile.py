"""What the package does with calls no plan can come of: each is refused
before anything runs, or stopped, with one line in Python's terms, as a
``ckptplan.CkptplanError`` (a usage error is a ValueError too).
"""
from __future__ import annotations

import os
import stat

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ckptplan  # noqa: E402
from ckptplan import _binary  # noqa: E402
from ckptplan.plan import SCHEMA  # noqa: E402


def tiny() -> "torch.nn.Module":
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                      intermediate_size=64, vocab_size=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def one_line_usage(err: BaseException) -> None:
    assert isinstance(err, ckptplan.CkptplanUsageError) and isinstance(err, ValueError)
    assert err.code == 2 and err.kind == "usage"
    assert "\n" not in str(err) and str(err).startswith("ckptplan."), str(err)


@pytest.mark.parametrize("kwargs, says", [
    ({"batch": 2, "seq": 16}, "give a budget"),
    ({"budget": "1GiB", "batch": 0, "seq": 16}, "batch must be a positive int, not 0"),
    ({"budget": "1GiB", "batch": 2, "seq": -1}, "seq must be a positive int, not -1"),
    ({"budget": "1GiB", "batch": True, "seq": 16}, "batch must be a positive int, not True"),
    ({"budget": "1GiB", "batch": 2.0, "seq": 16}, "batch must be a positive int, not 2.0"),
    ({"budget": 1.5e9, "batch": 2, "seq": 16}, "budget is bytes (an int) or a string"),
    ({"device": 80, "batch": 2, "seq": 16}, "device is a GPU's name, not int"),
    ({"budget": "1GiB", "batch": 2, "seq": 16, "autocast": "fp8"}, "autocast='fp8'"),
    ({"model": None, "budget": "1GiB", "batch": 2, "seq": 16},
     "model is a torch.nn.Module, or the path of a model folder or file or a bundled model's name, not NoneType"),
    ({"model": 3, "budget": "1GiB", "batch": 2, "seq": 16}, "not int"),
])
def test_plan_refuses_arguments_no_plan_comes_of(ckptplan_binary, kwargs, says):
    kwargs = dict(kwargs)
    model = kwargs.pop("model") if "model" in kwargs else tiny()
    with pytest.raises(ckptplan.CkptplanUsageError) as info:
        ckptplan.plan(model, **kwargs)
    one_line_usage(info.value)
    assert says in str(info.value)


def test_plan_of_a_name_that_is_no_model_says_so(ckptplan_binary, tmp_path):
    """A string is a bundled model's name or a path: one that is neither
    is the binary's error (exit 1), naming it, in one line."""
    for name, says in (("llama", 'unknown model "llama": not a bundled model'),
                       (str(tmp_path / "missing.json"), "missing.json: no such file")):
        with pytest.raises(ckptplan.CkptplanError) as info:
            ckptplan.plan(name, "1GiB", batch=2, seq=16)
        assert info.value.code == 1 and says in str(info.value), str(info.value)
        assert not isinstance(info.value, ckptplan.CkptplanUsageError)


def test_apply_refuses_what_is_not_a_plan_or_a_model(ckptplan_binary):
    model = tiny()
    plan = ckptplan.Plan.every_layer(model, "checkpoint")
    for bad_model, bad_plan, says in ((model, plan.__dict__, "not dict"), (model, "plan.json", "not str"),
                                      ("model", plan, "model is a torch.nn.Module, not str")):
        with pytest.raises(ckptplan.CkptplanUsageError) as info:
            ckptplan.apply(bad_model, bad_plan)
        one_line_usage(info.value)
        assert says in str(info.value)


@pytest.mark.parametrize("batch, says", [
    (None, "batch is the model's keyword arguments, a dict"),
    ("abc", "not str"),
    ({"input_ids": [[1, 2]]}, "input_ids is an integer tensor of [batch, seq], not list"),
    ({"input_ids": torch.rand(2, 4)}, "not a torch.float32 tensor of 2 dimensions"),
    ({"input_ids": torch.ones(8, dtype=torch.long)}, "not a torch.int64 tensor of 1 dimensions"),
])
def test_measure_refuses_what_is_not_a_batch(batch, says):
    with pytest.raises(ckptplan.CkptplanUsageError) as info:
        ckptplan.measure(tiny(), batch)
    one_line_usage(info.value)
    assert says in str(info.value)


def test_every_layer_refuses_another_mode():
    with pytest.raises(ckptplan.CkptplanUsageError, match="store or checkpoint, not 'sometimes'"):
        ckptplan.Plan.every_layer(tiny(), "sometimes")


def test_apply_refuses_transformers_gradient_checkpointing(ckptplan_binary):
    """With transformers' own checkpointing on, what would run is not the
    plan: apply says to turn it off, and applies once it is."""
    model = tiny()
    plan = ckptplan.Plan.every_layer(model, "checkpoint")
    # transformers 5.23 renamed the methods, the old names deprecated.
    term = "activation" if hasattr(model, "activation_checkpointing_enable") else "gradient"
    getattr(model, f"{term}_checkpointing_enable")()
    with pytest.raises(ckptplan.CkptplanUsageError, match=f"model.{term}_checkpointing_disable") as info:
        ckptplan.apply(model, plan)
    one_line_usage(info.value)
    assert ckptplan.applied(model) is None
    getattr(model, f"{term}_checkpointing_disable")()
    assert ckptplan.apply(model, plan) == {"store": 0, "checkpoint": 2, "selective": 0}


def test_a_binary_that_never_exits_is_stopped(tmp_path, monkeypatch):
    """A binary that hangs is stopped after CKPTPLAN_TIMEOUT seconds, with
    an error saying so; a limit that is not a positive number is refused."""
    hang = tmp_path / "ckptplan"
    hang.write_text("#!/bin/sh\nexec sleep 600\n")
    hang.chmod(hang.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv(_binary.ENV, str(hang))
    monkeypatch.setattr(_binary, "_check_named", lambda path: path)  # not the Go program: it only hangs
    monkeypatch.setenv(_binary.TIMEOUT_ENV, "1")
    with pytest.raises(ckptplan.CkptplanError) as info:
        _binary.call(["models"])
    assert info.value.kind == "timeout" and "did not finish in 1 s" in str(info.value)
    assert _binary.TIMEOUT_ENV in str(info.value)
    for bad in ("soon", "0", "-3", "inf", "nan", "3e6", "1e10"):
        monkeypatch.setenv(_binary.TIMEOUT_ENV, bad)
        with pytest.raises(ckptplan.CkptplanUsageError, match="want a positive number of seconds"):
            _binary.call(["models"])


def test_a_plan_file_that_is_not_a_plan_is_a_ckptplan_error():
    for text in ("{", "[]", '{"schema": 1}', os.urandom(8).hex()):
        with pytest.raises(ckptplan.CkptplanError) as info:
            ckptplan.Plan.from_json(text)
        assert isinstance(info.value, ckptplan.PlanFormatError) and isinstance(info.value, ValueError)
        assert info.value.kind == "input" and "\n" not in str(info.value)


def test_every_public_name_resolves():
    """Each name the package lists (and sac_available) is there: those that
    need torch are imported on first use, all of a module's at once."""
    for name in [*ckptplan.__all__, "sac_available", "Measurement", "LayerMeasurement"]:
        assert getattr(ckptplan, name) is not None, name


def test_apply_refuses_a_plan_that_runs_past_its_budget_layer_by_layer(ckptplan_binary):
    """A plan whose layer-by-layer peak passes its budget (one made for a
    runtime that nests recomputation) is refused with the budget it
    needs; the plan itself applies once the figure fits."""
    model = tiny()
    plan = ckptplan.Plan.every_layer(model, "checkpoint")
    raw = dict(schema=SCHEMA, model="m", solver="optimal", feasible=True, budget_bytes=1000, reserve_bytes=0,
               peak_bytes=900, overhead=0.1, recompute_flops=1, runtime="nested", runtime_peak_bytes=1200,
               layers=[{"name": l.name, "mode": l.mode, "kept_bytes": 0} for l in plan.layers])
    with pytest.raises(ckptplan.CkptplanError) as info:
        ckptplan.apply(model, ckptplan.Plan.from_json(raw))
    assert info.value.kind == "infeasible" and info.value.min_budget_bytes == 1200
    assert "peaks at 1200 bytes, past its budget of 1000" in str(info.value)
    raw["runtime_peak_bytes"] = 900
    assert ckptplan.apply(model, ckptplan.Plan.from_json(raw))["checkpoint"] == 2


def test_a_trace_error_is_a_ckptplan_error(tmp_path):
    """What trace refuses is a CkptplanError (kind input) and a ValueError."""
    for config, says in ((tmp_path / "missing.json", "no such file"), ("{", None)):
        if says is None:
            config = tmp_path / "bad.json"
            config.write_text("{")
            says = "bad.json:1:2"
        with pytest.raises(ckptplan.CkptplanError) as info:
            ckptplan.trace(str(config), batch=2, seq=16)
        assert isinstance(info.value, ValueError) and info.value.kind == "input" and says in str(info.value)
