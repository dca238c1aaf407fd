"""Finding the decoder layers of a transformers or PEFT model.

A plan decides per decoder layer, in order, so everything that applies or
measures one starts here. The layers are the model's one ``nn.ModuleList``
of transformer blocks: ``model.model.layers`` for Llama, Mistral and Qwen2,
``model.transformer.h`` for GPT-2, the same under a PEFT wrapper
(``PeftModel.base_model.model``), or any module list the caller passes.

Example:
    >>> import transformers
    >>> config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32,
    ...     num_attention_heads=2, intermediate_size=64, vocab_size=64)
    >>> model = transformers.LlamaForCausalLM(config)
    >>> len(decoder_layers(model))
    2

This file is shared: the ckptplan Python package imports it, and the FSDP2
export carries it in the module it writes.
"""
from typing import Any

import torch.nn as nn

# Attribute paths to the decoder layers, most specific first.
_PATHS = (
    ("model", "layers"),  # LlamaForCausalLM and Mistral, Qwen2, Gemma, Phi-3
    ("layers",),  # LlamaModel and friends
    ("transformer", "h"),  # GPT2LMHeadModel, Falcon, BLOOM, GPT-J
    ("h",),  # GPT2Model
    ("gpt_neox", "layers"),  # GPT-NeoX, Pythia
    ("model", "decoder", "layers"),  # OPT
)


def unwrap(model: nn.Module) -> nn.Module:
    """The transformers model under any PEFT or DistributedDataParallel
    wrappers.

    >>> unwrap(nn.Linear(1, 1)).__class__.__name__
    'Linear'
    """
    seen = set()
    while id(model) not in seen:
        seen.add(id(model))
        inner = None
        if hasattr(model, "get_base_model") and callable(model.get_base_model):
            inner = model.get_base_model()
        elif type(model).__name__ == "LoraModel" and isinstance(getattr(model, "model", None), nn.Module):
            inner = model.model
        elif type(model).__name__ == "DistributedDataParallel" and isinstance(getattr(model, "module", None), nn.Module):
            inner = model.module
        if inner is None or inner is model:
            break
        model = inner
    return model


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of model, in order.

    Raises ValueError naming the model's class when it has none of the
    known layouts: pass the layers yourself then.
    """
    if isinstance(model, nn.ModuleList):
        return model
    base = unwrap(model)
    for path in _PATHS:
        obj: Any = base
        for name in path:
            obj = getattr(obj, name, None)
            if obj is None:
                break
        if isinstance(obj, nn.ModuleList) and len(obj) > 0:
            return obj
    # Else the one longest list of blocks of one class.
    lists = [m for m in base.modules() if isinstance(m, nn.ModuleList) and len(m) > 0
             and len({type(c) for c in m}) == 1]
    if lists:
        longest = max(len(m) for m in lists)
        top = [m for m in lists if len(m) == longest]
        if len(top) == 1:
            return top[0]
    raise ValueError(
        f"cannot find the decoder layers of a {type(model).__name__}: ckptplan knows "
        "model.model.layers (Llama, Mistral, Qwen2, Gemma, Phi-3) and model.transformer.h (GPT-2); "
        "pass the nn.ModuleList of layers instead")
