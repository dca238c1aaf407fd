"""Reading a live model: what ckptplan needs that its config.json does not say.

``describe(model, batch=..., seq=...)`` returns the model's config (as
transformers writes config.json) and the ckptplan flags for what only the
live model knows: the dtype its weights are in, the attention
implementation it runs, whether its layers compute their own rotary tables,
the LoRA adapters PEFT added, the 4-bit weights bitsandbytes stores.

Example:
    >>> import transformers
    >>> config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32,
    ...     num_attention_heads=2, intermediate_size=64, vocab_size=64)
    >>> s = describe(transformers.LlamaForCausalLM(config), batch=2, seq=16)
    >>> s.flags()[:4]
    ['--batch', '2', '--seq', '16']
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch
import torch.nn as nn

from . import versions
from .layers import decoder_layers, unwrap

_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
_TORCH = {v: k for k, v in _DTYPES.items()}
_ATTENTION = {"eager": "eager", "sdpa": "sdpa", "flash_attention_2": "flash"}
# PEFT module names → ckptplan's LoRA targets.
# GPT-2's c_attn and Phi-3's qkv_proj are q, k and v in one, Phi-3's
# gate_up_proj gate and up; GPT-2's c_proj names both the attention's
# output and the MLP's down projection (StarCoder2's only the MLP's).
_TARGETS = {"q_proj": ("q",), "k_proj": ("k",), "v_proj": ("v",), "o_proj": ("o",),
            "gate_proj": ("gate",), "up_proj": ("up",), "down_proj": ("down",),
            "qkv_proj": ("q", "k", "v"), "gate_up_proj": ("gate", "up"),
            "c_attn": ("q", "k", "v"), "c_proj": ("o", "down"), "c_fc": ("up",)}
# Where a module's parent tells which it is: GPT-2's attention's and MLP's c_proj.
_PATH_TARGETS = {"attn.c_proj": ("o",), "mlp.c_proj": ("down",)}
# Where a model type's module names mean otherwise.
_TYPE_TARGETS = {"starcoder2": {"c_proj": ("down",)}}


@dataclasses.dataclass
class Setup:
    """What ckptplan is told about a model: its config and the flags."""

    config: dict[str, Any]
    batch: int
    seq: int
    dtype: str
    attention: str
    dropout: Optional[float] = None
    logits_dtype: Optional[str] = None  # fp32 or model; None: what the release's loss does
    rope_tables: str = "model"
    transformers: str = ""  # the live transformers release, whose rules the plan follows
    gqa_kernel: str = "fused"  # math: this PyTorch's sdpa has no fused kernel for enable_gqa here
    legacy_sdpa: bool = False  # the model's own Sdpa attention class (before 4.48; Qwen2-MoE later)
    dropout_mask: str = "byte"  # byte: CUDA's fused dropout; dtype: CPU's
    autocast: Optional[str] = None  # bf16 or fp16: torch.autocast over the fp32 weights
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()
    lora_dropout: float = 0.0
    lora_alpha: float = 8.0  # PEFT's lora_alpha: printed, no byte depends on it
    lora_dtype: str = "model"  # fp32: PEFT's adapters over 16-bit weights
    quant: Optional[str] = None  # nf4 or fp4: bitsandbytes' 4-bit linears (QLoRA)
    double_quant: bool = False  # the 4-bit blocks' maxima quantized again
    buffers_bytes: int = 0  # the model's registered buffers, each storage once, as it holds them

    def flags(self) -> list[str]:
        """The ckptplan command-line flags for this setup."""
        f = ["--batch", str(self.batch), "--seq", str(self.seq), "--dtype", self.dtype,
             "--attention", self.attention, "--profile", "transformers",
             "--rope-tables", self.rope_tables,
             "--dropout-mask", self.dropout_mask, "--kernels", "cpu" if self.dropout_mask == "dtype" else "cuda"]
        if self.logits_dtype:
            f += ["--logits-dtype", self.logits_dtype]
        if self.transformers:
            f += ["--transformers", self.transformers, "--gqa-kernel", self.gqa_kernel]
        if self.legacy_sdpa:
            f += ["--sdpa-layout", "legacy"]
        if self.dropout is not None:
            f += ["--dropout", repr(self.dropout)]
        if self.autocast:
            f += ["--autocast", self.autocast]
        if self.lora_rank:
            f += ["--lora-rank", str(self.lora_rank), "--lora-targets", ",".join(self.lora_targets),
                  "--lora-dropout", repr(self.lora_dropout), "--lora-alpha", repr(self.lora_alpha),
                  "--lora-dtype", self.lora_dtype]
        if self.quant:
            f += ["--quant", self.quant] + (["--double-quant"] if self.double_quant else [])
        if self.buffers_bytes:
            f += ["--buffers-bytes", str(self.buffers_bytes)]
        return f


def describe(model: nn.Module, *, batch: int, seq: int, logits_dtype: Optional[str] = None,
             autocast: Optional[str] = None) -> Setup:
    """Describe model for ckptplan; see the module doc.

    Raises ValueError for what ckptplan cannot plan yet, saying what.
    """
    if not (isinstance(batch, int) and isinstance(seq, int)) or batch <= 0 or seq <= 0:
        raise ValueError(f"batch and seq must be positive integers, got batch={batch!r}, seq={seq!r}")
    base = unwrap(model)
    config = getattr(base, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        raise ValueError(f"a {type(model).__name__} has no transformers config: ckptplan plans "
                         "transformers models (Llama, Mistral, Mixtral, Qwen2, Qwen2-MoE, Qwen 3, "
                         "Qwen 3 MoE, Gemma, Gemma 2, Phi-3, StarCoder2, Granite, GPT-2)")
    if autocast not in (None, "bf16", "fp16"):
        raise ValueError(f"autocast={autocast!r}: ckptplan plans torch.autocast in bf16 or fp16")
    layers = decoder_layers(model)
    # PEFT keeps LoRA adapters in fp32 over 16-bit weights by default;
    # they are described apart.
    dtypes = {p.dtype for n, p in layers.named_parameters() if p.is_floating_point() and "lora_" not in n}
    if len(dtypes) != 1 or next(iter(dtypes)) not in _DTYPES:
        raise ValueError(f"the decoder layers' weights are in {sorted(map(str, dtypes))}: ckptplan "
                         "plans one of float32, bfloat16, float16")
    dtype = _DTYPES[next(iter(dtypes))]
    if autocast is not None and _model_type(config) == "gpt2" and any(p.is_cuda for p in layers.parameters()):
        raise ValueError("GPT-2 under torch.autocast on CUDA is not modelled yet: CUDA's autocast runs "
                         "gelu_new's pow and the softmax in fp32, the CPU's does not")
    if autocast is not None and dtype != "fp32":
        raise ValueError(f"autocast={autocast!r} runs over fp32 weights, but the model's are {dtype}: "
                         "plan it without autocast")
    impl = getattr(config, "_attn_implementation", None) or "eager"
    # Before transformers 4.48 the attention's class is chosen when the
    # model is built; the class, not a config changed since, is what runs.
    # What each release's attention keeps is the binary's table of
    # releases (--transformers).
    attn_module = getattr(layers[0], "self_attn", None) or getattr(layers[0], "attn", None)
    kind = type(attn_module).__name__ if attn_module is not None else ""
    legacy_sdpa = "Sdpa" in kind
    if legacy_sdpa:
        impl = "sdpa"
    elif "Flash" in kind:
        impl = "flash_attention_2"
    if impl not in _ATTENTION:
        raise ValueError(f"attention implementation {impl!r} is not one ckptplan models "
                         f"(it models {', '.join(_ATTENTION)})")
    cfg = config.to_dict()
    # Where the rotary tables are made: once by the model (Llama, Qwen2;
    # Mistral from transformers 4.48), or by every layer (Mistral before).
    inner = getattr(base, "model", base)
    attn = getattr(layers[0], "self_attn", None)
    layer_rope = attn is not None and hasattr(attn, "rotary_emb") and not hasattr(inner, "rotary_emb")
    rope = "layer" if layer_rope else "model"
    if layer_rope and hasattr(attn.rotary_emb, "cos_cached"):
        # Mixtral before 4.48: each layer slices and indexes tables it
        # holds for every position, computing nothing.
        rope = "cached"
    dropout = None if model.training else 0.0
    attention = _ATTENTION[impl]
    attn_p = cfg.get("attention_dropout", cfg.get("attn_pdrop", 0.0)) or 0.0
    on_cpu = all(p.device.type == "cpu" for p in layers.parameters())
    if attention == "sdpa" and model.training and attn_p > 0 and on_cpu:
        # PyTorch's fused CPU kernel has no dropout: sdpa runs its math path.
        attention = "sdpa-math"
    setup = Setup(config=cfg, batch=batch, seq=seq, dtype=dtype, attention=attention,
                  dropout=dropout, logits_dtype=logits_dtype, rope_tables=rope,
                  dropout_mask="dtype" if on_cpu else "byte", autocast=autocast,
                  transformers=versions.transformers_release(),
                  gqa_kernel=_gqa_kernel(next(layers.parameters()), _TORCH[dtype],
                                         int(getattr(attn_module, "head_dim", 0) or 64)),
                  legacy_sdpa=legacy_sdpa and impl == "sdpa",
                  buffers_bytes=buffers_bytes(base))
    _quant(layers, setup)  # first: a layer's linear in other bits is the more telling error
    _lora(model, setup, _model_type(config))
    return setup


def buffers_bytes(model: nn.Module) -> int:
    """The bytes of model's registered buffers, each storage once (a
    buffer may share another's: transformers' original_inv_freq before 5.0).

    >>> m = torch.nn.BatchNorm1d(4)  # running mean and variance, fp32; a step count, int64
    >>> buffers_bytes(m)
    40
    """
    storages = {b.untyped_storage().data_ptr(): b.untyped_storage().nbytes() for b in model.buffers()}
    return sum(storages.values())


def _gqa_kernel(like: torch.Tensor, dtype: torch.dtype, head_dim: int) -> str:
    """What this PyTorch's sdpa runs for grouped K and V (enable_gqa) on
    like's device in dtype, with heads of head_dim: "fused" where a fused
    kernel takes them, "math" where sdpa falls back to its math path (the
    CPU's in PyTorch 2.5 to 2.7, CUDA's in fp32). Asked of PyTorch itself,
    on tensors of a few kilobytes."""
    import torch.nn.functional as F

    q = torch.zeros(1, 2, 2, head_dim, device=like.device, dtype=dtype, requires_grad=True)
    kv = torch.zeros(1, 1, 2, head_dim, device=like.device, dtype=dtype)
    try:
        with torch.enable_grad():
            out = F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    except TypeError:  # no enable_gqa before PyTorch 2.5
        return "math"
    name = type(out.grad_fn).__name__
    return "fused" if "ScaledDotProduct" in name else "math"


def _quant(layers: nn.Module, setup: Setup) -> None:
    """Fill setup's quantization fields from the decoder layers' linears,
    if bitsandbytes stores them in 4 bits (as transformers loads a model
    with ``BitsAndBytesConfig(load_in_4bit=True)``).

    ckptplan models every decoder linear quantized alike, in blocks of 64
    packed into bytes, computing in the model's dtype; anything else is a
    ValueError saying what differs. bitsandbytes is not imported: its
    parameters are known by their class names.
    """
    linears = [(n, m) for n, m in layers.named_modules()
               if isinstance(m, nn.Linear) and "lora_" not in n]
    kinds = {n: type(m.weight).__name__ for n, m in linears}
    if "Int8Params" in kinds.values():
        raise ValueError("the decoder layers' linears are in 8 bits (bitsandbytes' LLM.int8()): its product keeps "
                         "each linear's input on the autograd node, outside the saved tensors, where checkpointing "
                         "cannot free it; ckptplan plans 4-bit (nf4, fp4) models")
    four = [n for n, k in kinds.items() if k == "Params4bit"]
    if not four:
        return
    if len(four) != len(linears):
        plain = sorted(n for n, k in kinds.items() if k != "Params4bit")
        raise ValueError(f"{len(four)} of the decoder layers' {len(linears)} linears are in 4 bits, but not "
                         f"{', '.join(plain[:3])}{' …' if len(plain) > 3 else ''}: ckptplan plans every decoder "
                         "linear quantized alike")
    found = set()
    for n, m in linears:
        w = m.weight
        qtype = getattr(w, "quant_type", None)
        if qtype not in ("nf4", "fp4"):
            raise ValueError(f"{n}: 4-bit quantization type {qtype!r}; ckptplan plans nf4 and fp4")
        if getattr(w, "blocksize", 64) != 64:
            raise ValueError(f"{n}: 4-bit blocks of {w.blocksize}; ckptplan plans bitsandbytes' blocks of 64")
        if w.dtype != torch.uint8:
            raise ValueError(f"{n}: 4-bit values packed in {w.dtype} (bnb_4bit_quant_storage); ckptplan plans "
                             "them packed in torch.uint8, the default")
        compute = getattr(m, "compute_dtype", None)
        if compute is not None and compute != _TORCH[setup.dtype]:
            raise ValueError(f"{n}: the 4-bit linears compute in {compute} over {_TORCH[setup.dtype]} weights "
                             "(prepare_model_for_kbit_training casts the other weights to float32): ckptplan plans "
                             "a model in one dtype; keep the other weights in the compute dtype")
        state = getattr(w, "quant_state", None)
        found.add((qtype, bool(getattr(state, "nested", getattr(w, "compress_statistics", False)))))
    if len(found) != 1:
        raise ValueError(f"the 4-bit linears are quantized in {len(found)} ways ({sorted(found)}): ckptplan plans one")
    setup.quant, setup.double_quant = found.pop()


def _model_type(config) -> str:
    """The config's model_type ("llama", "gpt2", ...)."""
    return str(getattr(config, "model_type", ""))


def _adapted(model: nn.Module, model_type: str = "") -> tuple[str, ...]:
    """The roles (q, k, v, o, gate, up, down) of the linears PEFT adapted
    in the model's decoder layers, the same in each: read from the layers'
    modules, whatever target_modules said (names, a pattern, all-linear)."""
    targets_of = {**_TARGETS, **_TYPE_TARGETS.get(model_type, {})}
    found = []
    for i, layer in enumerate(decoder_layers(model)):
        roles = []
        for name, module in layer.named_modules():
            if not len(getattr(module, "lora_A", ()) or ()):
                continue
            parts = name.split(".")
            role = _PATH_TARGETS.get(".".join(parts[-2:]), targets_of.get(parts[-1]))
            if role is None:
                raise ValueError(f"LoRA adapts {name} of the decoder layers, not a linear ckptplan models "
                                 f"({', '.join(sorted(_TARGETS))})")
            roles.extend(role)
        roles = tuple(dict.fromkeys(r for r in ("q", "k", "v", "o", "gate", "up", "down") if r in roles))
        if i and roles != found[0]:
            raise ValueError(f"LoRA adapts {','.join(found[0]) or 'nothing'} in decoder layer 0 but "
                             f"{','.join(roles) or 'nothing'} in layer {i}: ckptplan plans LoRA alike in every layer")
        found.append(roles)
    if not found or not found[0]:
        raise ValueError("the PEFT model adapts no linear of its decoder layers: ckptplan plans LoRA on those")
    return found[0]


def _lora(model: nn.Module, setup: Setup, model_type: str = "") -> None:
    """Fill setup's LoRA fields from PEFT's config, if model is a PEFT model."""
    configs = getattr(model, "peft_config", None)
    if not configs:
        return
    if len(configs) != 1:
        raise ValueError("the model has several PEFT adapters: ckptplan plans one")
    cfg = next(iter(configs.values()))
    if getattr(cfg, "peft_type", None) is None or str(cfg.peft_type).split(".")[-1] != "LORA":
        raise ValueError(f"PEFT adapter type {cfg.peft_type}: ckptplan plans LoRA")
    setup.lora_rank = int(cfg.r)
    setup.lora_targets = _adapted(model, model_type)
    setup.lora_dropout = float(getattr(cfg, "lora_dropout", 0.0) or 0.0)
    setup.lora_alpha = float(getattr(cfg, "lora_alpha", 8) or 0)
    adapters = {p.dtype for n, p in model.named_parameters() if "lora_" in n}
    if len(adapters) > 1:
        raise ValueError(f"the LoRA adapters' weights are in {sorted(map(str, adapters))}: ckptplan plans one dtype")
    if adapters == {torch.float32} and setup.dtype != "fp32":
        setup.lora_dtype = "fp32"
    elif adapters and adapters != {_TORCH[setup.dtype]}:
        raise ValueError(f"the LoRA adapters' weights are in {next(iter(adapters))} over {setup.dtype} "
                         "weights: ckptplan plans adapters in fp32 or in the model's dtype")
