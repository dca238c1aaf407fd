"""Tracing any model transformers can build into a graph the planner reads.

``trace(config_or_model)`` builds the model under PyTorch's fake tensors
(shapes, dtypes and devices, no memory: seconds even for a 70B model), runs
one training forward with its loss, and records every ATen op as autograd
sees it: its inputs, its outputs, the tensors autograd saves for backward
(through saved-tensor hooks, in the order it saves them) and its FLOPs.
The result is a graph YAML of ``aten`` nodes, one block per decoder layer,
which ``ckptplan plan`` plans like any other graph, keep sets included.

What the graph holds:

- the embedding ops (block ``embed``) that lead to the first layer's
  hidden state, every decoder layer's ops (``layers.N``) and what follows
  them up to the loss (``head``);
- the tensors the model computes once and hands every layer (rotary cos
  and sin, the attention mask, positions) as graph inputs: they are not
  any layer's activations, and those a layer saves count once, as static
  buffers;
- the model's parameters, each counted once: those in the training dtype
  (the one most of them are in) on the first node, those in another
  (PEFT's fp32 adapters over 16-bit weights) with that dtype on the first
  node that reads one; and whether each node's output needs a gradient;
- FLOPs of matrix products and fused attention (2·m·n·k; 4·b·h·s·s'·d,
  its backward 2.5× when fused), the counting ``ckptplan``'s builders use.

The ops are those of the device the fake tensors claim (``cpu`` by
default, ``cuda`` where PyTorch has CUDA): kernels differ between devices
in what they save (CPU's dropout keeps its mask in the model's dtype,
CUDA's a byte; their fused attention kernels keep different statistics).

Example:
    >>> import transformers
    >>> config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32,
    ...     num_attention_heads=2, intermediate_size=64, vocab_size=64)
    >>> text = trace(config, seq=16)
    >>> text.splitlines()[0]
    '# A traced graph: ckptplan plan this file (ckptplan trace wrote it).'
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Optional, Union

import torch
import torch.nn as nn

from .layers import unwrap
from ._record import TraceError, _Recorder
from ._tracegraph import TRAIN_DTYPES, _Graph

__all__ = ["trace", "TraceError", "load_config"]


def load_config(path: Union[str, os.PathLike]):
    """The transformers config in a config.json file, or in a directory
    holding one. Raises TraceError for a missing, unreadable or unknown one.
    """
    import transformers

    path = os.fspath(path)
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise TraceError(f"{file}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise TraceError(f"{file}: {getattr(err, 'strerror', None) or err}") from None
    except json.JSONDecodeError as err:
        raise TraceError(f"{file}:{err.lineno}:{err.colno}: {err.msg}") from None
    if not isinstance(data, dict):
        raise TraceError(f"{file}: want a JSON object (a config.json)")
    model_type = data.get("model_type")
    if not isinstance(model_type, str):
        raise TraceError(f"{file}: no model_type")
    try:
        return transformers.AutoConfig.for_model(**data)
    except (ValueError, KeyError, TypeError) as err:
        raise TraceError(f"{file}: transformers {transformers.__version__} cannot build model_type "
                         f"{model_type!r}: {err}") from None


def trace(config_or_model: Any, *, batch: int = 1, seq: int = 2048, dtype: str = "bf16",
          attention: str = "auto", device: str = "cpu", name: Optional[str] = None,
          progress: Optional[Callable[[str], None]] = None) -> str:
    """The graph YAML of one training step of a model, traced.

    config_or_model is a config.json path (or a directory holding one), a
    transformers config, or a live model (a PEFT model too), which is
    traced as it is set up: its dtype, adapters, attention and training
    mode; dtype and attention then do not apply. A config builds
    ``AutoModelForCausalLM`` in dtype with the attention implementation
    given ("auto": the one transformers picks for the model, sdpa where it
    has one), in training mode; a multimodal config, its text model. batch
    and seq size the step. progress, where given, is called with a line
    as each stage begins: building the model, tracing the step, writing
    the graph (``ckptplan trace`` prints them on a terminal).
    """
    note = ""
    say = progress or (lambda line: None)
    if not (isinstance(batch, int) and isinstance(seq, int)) or batch <= 0 or seq <= 0:
        raise TraceError(f"batch and seq must be positive integers, got batch={batch!r}, seq={seq!r}")
    if dtype not in TRAIN_DTYPES:
        raise TraceError(f"unknown dtype {dtype!r} (valid: {', '.join(TRAIN_DTYPES)})")
    if attention not in ("auto", "eager", "sdpa"):
        raise TraceError(f"unknown attention {attention!r} (valid: auto, eager, sdpa)")
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake = FakeTensorMode(allow_non_fake_inputs=True)
    if isinstance(config_or_model, nn.Module):
        model = config_or_model
        name = name or type(unwrap(model)).__name__
    else:
        config = config_or_model
        if isinstance(config, (str, os.PathLike)):
            name = name or _stem(config)
            config = load_config(config)
        name = name or getattr(config, "model_type", "model")
        text = text_config(config)
        if text is not config:
            note = (f"the text model ({getattr(text, 'model_type', '?')}) of a "
                    f"{getattr(config, 'model_type', '?')} config; what runs only on images is not counted")
        say(f"building {name} on fake tensors (no weights)")
        model = _build(config, fake, TRAIN_DTYPES[dtype], attention, device)
    say(f"tracing a training step of {name}: batch {batch}, sequence {seq}, forward and backward")
    with fake:
        ids = torch.zeros(batch, seq, dtype=torch.long, device=device)
        labels = torch.zeros(batch, seq, dtype=torch.long, device=device)
    rec = _Recorder(model, fake, device)
    rec.name_input(ids, "input_ids")
    rec.name_input(labels, "labels")
    from torch._subclasses import fake_tensor

    dynamic = tuple(getattr(fake_tensor, n) for n in ("DynamicOutputShapeException", "DataDependentOutputException")
                    if hasattr(fake_tensor, n))
    try:
        loss = rec.run(_step_inputs(model, ids, labels))
    except dynamic as err:
        raise TraceError(
            f"{name}: a shape depends on the data ({err}): the tracer follows shapes, not values, and cannot "
            "trace it (a mixture of experts' routing is such a shape where each expert runs on the tokens routed "
            "to it; transformers 5 runs them as grouped products by default, which the tracer follows)") from None
    graph = _Graph(rec, loss, name, batch, seq)
    say(f"writing the graph of {name}")
    return graph.yaml(note)


def _step_inputs(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> dict:
    """The keyword arguments of one training forward: the tokens, the
    labels, and no key/value cache where the model takes ``use_cache``
    (``ckptplan.apply`` turns it off; from transformers 5 a model in
    training makes one, which copies every layer's keys and values)."""
    import inspect

    out = {"input_ids": ids, "labels": labels}
    try:
        params = inspect.signature(unwrap(model).forward).parameters
    except (TypeError, ValueError):
        return out
    if "use_cache" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        out["use_cache"] = False
    return out


def _stem(path: Union[str, os.PathLike]) -> str:
    p = os.path.abspath(os.fspath(path))
    if os.path.basename(p) == "config.json" or os.path.isdir(p):
        p = os.path.dirname(p) if not os.path.isdir(p) else p
        return os.path.basename(p) or "model"
    return os.path.splitext(os.path.basename(p))[0]


def text_config(config):
    """The config of the causal language model to trace: the text model's,
    for a multimodal config that nests one (Gemma 3, Mistral 3, LLaVA:
    ``text_config``); config itself otherwise. Training on text runs only
    the text model, and a vision tower has no part in its activations.

    Example:
        >>> import transformers
        >>> c = transformers.AutoConfig.for_model("llava", text_config={"model_type": "llama"})
        >>> text_config(c).model_type
        'llama'
    """
    nested = getattr(config, "text_config", None)
    if nested is None or nested is config:
        return config
    return nested


def _build(config, fake, dtype: torch.dtype, attention: str, device: str) -> nn.Module:
    import copy

    import transformers

    config = copy.deepcopy(text_config(config))  # the caller's stays as it was
    kwargs = {} if attention == "auto" else {"attn_implementation": attention}
    # transformers 5 renamed torch_dtype to dtype.
    kwargs["dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"] = dtype
    try:
        with fake, torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(config, **kwargs)
    except ValueError as err:
        raise TraceError(f"transformers cannot build a causal language model of model_type "
                         f"{getattr(config, 'model_type', '?')!r}: {err}") from None
    model.train()
    return model


def main(argv: list[str]) -> int:
    """``ckptplan trace CONFIG [-o FILE] [--batch N] [--seq N] [--dtype D]
    [--attention A] [--device D]``: write the traced graph of the model a
    config.json describes (to standard output without -o). Status 0, 1 on an
    error (its reason on standard error), 2 on a usage error."""
    import argparse
    import sys

    p = argparse.ArgumentParser(
        prog="ckptplan trace",
        description="Trace the model a Hugging Face config.json describes (built on fake tensors, no weights) "
                    "into a graph YAML that 'ckptplan plan' reads.")
    p.add_argument("config", help="a config.json, or a directory holding one")
    p.add_argument("-o", "--output", help="the graph YAML to write (default: standard output)")
    p.add_argument("--batch", type=int, default=1, help="sequences in the batch (default 1)")
    p.add_argument("--seq", type=int, default=2048, help="tokens in a sequence (default 2048)")
    p.add_argument("--dtype", default="bf16", choices=sorted(TRAIN_DTYPES), help="the weights' dtype (default bf16)")
    p.add_argument("--attention", default="auto", choices=("auto", "eager", "sdpa"),
                   help="transformers' attention implementation (default auto: the one transformers picks, "
                        "sdpa where the model has it)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="whose kernels to trace (default cpu; cuda needs a PyTorch with CUDA)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("ckptplan trace: --device cuda needs a PyTorch built with CUDA and a driver", file=sys.stderr)
        return 1
    import time

    start = time.monotonic()

    def progress(line: str) -> None:
        print(f"ckptplan trace: {time.monotonic() - start:5.1f}s {line}", file=sys.stderr, flush=True)

    try:
        text = trace(args.config, batch=args.batch, seq=args.seq, dtype=args.dtype,
                     attention=args.attention, device=args.device,
                     progress=progress if sys.stderr.isatty() else None)
    except TraceError as err:
        print(f"ckptplan trace: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # a model transformers cannot run this way
        print(f"ckptplan trace: {args.config}: tracing failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as err:
            print(f"ckptplan trace: {args.output}: {err.strerror or err}", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    if sys.stderr.isatty():
        progress(f"wrote {args.output}" if args.output else "done")
    return 0
