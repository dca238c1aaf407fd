"""The plan JSON the binary writes is the one the package reads.

The package reads schema ``ckptplan.plan.SCHEMA`` and knows its fields
(``ckptplan.plan.FIELDS``): every plan the binary writes, of several
kinds, is of that schema, has no field the package does not know, and
reads back with its figures. Anything else is refused with a
``PlanFormatError`` that says what is wrong.
"""
from __future__ import annotations

import json
import subprocess

import pytest

from ckptplan.plan import FIELDS, MODES, SCHEMA, Plan, PlanFormatError

PLANS = {
    "selective": ["tiny-llama", "--budget", "4.5MiB"],
    "every layer": ["tiny-llama", "--budget", "8MiB", "--solver", "every-k", "--profile", "transformers"],
    "store": ["tiny-gpt2", "--budget", "1GiB", "--solver", "none"],
    "zero 3, lora": ["tiny-llama", "--budget", "8MiB", "--dp", "2", "--zero", "3", "--lora-rank", "4"],
    "zero 2 on deepspeed": ["tiny-llama", "--budget", "8MiB", "--dp", "2", "--zero", "2"],
    "autocast": ["tiny-llama", "--budget", "16MiB", "--dtype", "fp32", "--autocast", "bf16", "--profile", "transformers"],
    "nested, with notes": ["tiny-llama", "--budget", "8MiB", "--solver", "sqrt"],
}


def export(binary: str, args: list[str]) -> dict:
    p = subprocess.run([binary, "export", *args, "--to", "json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("case", PLANS)
def test_the_binary_writes_the_schema_the_package_reads(ckptplan_binary, case):
    d = export(ckptplan_binary, PLANS[case])
    assert d["schema"] == SCHEMA
    assert set(d) <= set(FIELDS["plan"]), set(d) - set(FIELDS["plan"])
    for layer in d["layers"]:
        assert set(layer) <= set(FIELDS["layer"]), set(layer) - set(FIELDS["layer"])
        assert layer["mode"] in MODES
        for saved in layer.get("saved") or ():
            assert set(saved) <= set(FIELDS["saved"]), set(saved) - set(FIELDS["saved"])
    p = Plan.from_json(json.dumps(d))
    assert (p.model, p.peak_bytes, p.static_bytes, p.budget_bytes) == (d["model"], d["peak_bytes"], d["static_bytes"], d["budget_bytes"])
    assert [(l.name, l.mode, l.kept_bytes) for l in p.layers] == [(l["name"], l["mode"], l["kept_bytes"]) for l in d["layers"]]


def test_every_field_is_written(ckptplan_binary):
    """Each field the package knows is one some plan has (but feasible,
    which only a plan the package makes itself leaves out)."""
    written = {"plan": set(), "layer": set(), "saved": set()}
    for args in PLANS.values():
        d = export(ckptplan_binary, args)
        written["plan"] |= set(d)
        for layer in d["layers"]:
            written["layer"] |= set(layer)
            for saved in layer.get("saved") or ():
                written["saved"] |= set(saved)
    assert set(FIELDS["plan"]) - written["plan"] == {"feasible"}
    assert set(FIELDS["layer"]) == written["layer"]
    assert set(FIELDS["saved"]) == written["saved"]


@pytest.mark.parametrize("data, says", [
    ('{"schema": 2, "layers": []}', "the plan is of schema 2, but this ckptplan package reads schema 1"),
    ('{"layers": []}', "the plan is of schema None"),
    ("[1, 2]", "a plan is a JSON object, not list"),
    ("{schema: 1", "the plan is not JSON"),
    ('{"schema": 1, "model": "m", "solver": "s", "budget_bytes": 1, "peak_bytes": 1, "overhead": 0}', "the plan has no 'layers'"),
    ('{"schema": 1, "model": "m", "solver": "s", "budget_bytes": "lots", "peak_bytes": 1, "overhead": 0, "layers": []}',
     "the plan has a field of the wrong type"),
    ('{"schema": 1, "model": "m", "solver": "s", "budget_bytes": 1, "peak_bytes": 1, "overhead": 0, '
     '"layers": [{"name": "layers.0", "mode": "offload", "kept_bytes": 0}]}', "layers.0: unknown mode 'offload'"),
])
def test_a_plan_it_cannot_read_is_refused(data, says):
    with pytest.raises(PlanFormatError) as e:
        Plan.from_json(data)
    assert says in str(e.value), str(e.value)


def test_a_plan_is_one_call(ckptplan_binary, monkeypatch):
    """Planning a model ckptplan builds runs the binary once; one it builds
    no graph of is traced after the binary says so (needs_trace)."""
    import transformers

    import ckptplan
    from ckptplan import _binary

    calls = []
    run = _binary.run

    def counted(args, **kwargs):
        calls.append(list(args))
        return run(args, **kwargs)

    monkeypatch.setattr(_binary, "run", counted)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=64))
    p = ckptplan.plan(llama, "64MiB", batch=2, seq=16)
    assert p.feasible and [c[0] for c in calls] == ["export"], calls

    calls.clear()
    neox = transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=64))
    p = ckptplan.plan(neox, "64MiB", batch=2, seq=16)
    assert p.feasible and len(p.layers) == 2
    assert [c[0] for c in calls] == ["export", "export"], calls  # the config's, refused; the trace's


def test_one_runtime_for_every_way_a_plan_is_applied():
    """ckptplan.apply runs the files the exported PyTorch and FSDP2 modules
    carry (export/runtime.py, sac.py, layers.py), byte for byte, with the
    plan's modes."""
    pytest.importorskip("torch")
    from pathlib import Path

    import ckptplan._runtime
    import ckptplan._sac
    import ckptplan.layers

    export_dir = Path(__file__).resolve().parents[2] / "export"
    for module, name in ((ckptplan._runtime, "runtime.py"), (ckptplan._sac, "sac.py"), (ckptplan.layers, "layers.py")):
        assert Path(module.__file__).read_bytes() == (export_dir / name).read_bytes(), \
            f"{module.__name__} is not export/{name}"
    assert ckptplan._runtime.MODES == MODES
