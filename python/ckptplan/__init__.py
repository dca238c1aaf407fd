"""ckptplan: which activations to keep and which to recompute so a training
step fits a memory budget with the least extra compute.

Plan, apply and measure on a live transformers or PEFT model (one whose
model_type ckptplan does not build is traced into a graph it plans,
``ckptplan.trace``):

    >>> import torch, transformers, ckptplan
    >>> config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32,
    ...     num_attention_heads=2, intermediate_size=64, vocab_size=64)
    >>> model = transformers.LlamaForCausalLM(config)
    >>> plan = ckptplan.plan(model, budget="64MiB", batch=2, seq=16)
    >>> counts = ckptplan.apply(model, plan)
    >>> m = ckptplan.measure(model, {"input_ids": torch.zeros(2, 16, dtype=torch.long)})
    >>> [l.kept_bytes for l in m.layers] == [l.kept_bytes for l in plan.layers]
    True

The planning runs in the ``ckptplan`` binary that the wheel carries (or the
one ``CKPTPLAN_BINARY`` names); applying and measuring need PyTorch.
"""
from ._binary import BinaryNotFoundError, CkptplanError, CkptplanUsageError, binary
from ._fit import Fit, Reach, Setting, fit
from .plan import Layer, Plan, PlanFormatError, Saved, optimizer_name, plan

__version__ = "0.1.0"

__all__ = ["BinaryNotFoundError", "CkptplanError", "CkptplanUsageError", "Fit", "Layer", "Plan", "Reach", "Setting", "PlanFormatError", "Saved", "apply", "applied", "optimizer_name",
           "binary", "fit", "measure", "plan", "prepare_accelerator", "prepare_trainer", "suspended", "trace", "TraceError", "__version__"]


def __getattr__(name):
    # apply, measure and trace import torch; planning alone does not need
    # it. Their modules are private: a module named like its function
    # would replace the function on the package when first imported.
    import importlib

    for module, names in (("_apply", ("apply", "applied", "suspended", "sac_available")),
                          ("_measure", ("measure", "Measurement", "LayerMeasurement")),
                          ("_trace", ("trace", "TraceError")),
                          ("_trainer", ("prepare_trainer", "prepare_accelerator"))):
        if name in names:
            mod = importlib.import_module(f".{module}", __name__)
            for n in names:
                globals()[n] = getattr(mod, n)
            return globals()[name]
    raise AttributeError(f"module 'ckptplan' has no attribute {name!r}")
