"""The supported range: plan and apply warn outside it, naming the
versions and what was verified, and say nothing inside it."""
from __future__ import annotations

import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ckptplan  # noqa: E402
from ckptplan import versions  # noqa: E402


@pytest.mark.parametrize("package,version,want", [
    ("transformers", "4.46.3", None),
    ("transformers", "5.24.0", None),
    ("transformers", "5.25.0", "transformers 5.25.0 is newer than the newest release ckptplan was verified on (5.24)"),
    ("transformers", "4.45.2", "transformers 4.45.2 is older than the oldest release ckptplan plans for (4.46)"),
    ("torch", "2.4.1", "torch 2.4.1 is older"),
    ("torch", "2.15.0+cu132", None),
    ("torch", "2.16.0.dev20261201", "torch 2.16.0.dev20261201 is newer"),
    ("peft", "0.22.0", "peft 0.22.0 is newer"),
])
def test_outside(package, version, want):
    assert versions.outside(package, version) == want if want is None else want in versions.outside(package, version)


def test_plan_warns_outside_the_range(ckptplan_binary, monkeypatch):
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                      intermediate_size=64, vocab_size=64)
    model = transformers.LlamaForCausalLM(config)
    with warnings.catch_warnings():
        warnings.simplefilter("error", versions.VersionWarning)
        plan = ckptplan.plan(model, "1GiB", batch=1, seq=8, solver="every-k")  # the live stack: no warning
    # The module as imported now (transformers 5 replaces its lazy module).
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "6.0.0")
    with pytest.warns(versions.VersionWarning, match=r"transformers 6\.0\.0 is newer .*\(verified: torch 2\.5\.1"):
        ckptplan.plan(model, "1GiB", batch=1, seq=8, solver="every-k")
    with pytest.warns(versions.VersionWarning, match="transformers 6.0.0"):
        ckptplan.apply(model, plan)


def test_the_binary_plans_the_live_release(ckptplan_binary):
    """The plan is made for the installed transformers' rules: its
    release is what the binary is told."""
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                      intermediate_size=64, vocab_size=64)
    from ckptplan.introspect import describe

    flags = describe(transformers.LlamaForCausalLM(config), batch=1, seq=8).flags()
    i = flags.index("--transformers")
    assert flags[i + 1] == ".".join(transformers.__version__.split(".")[:2])
