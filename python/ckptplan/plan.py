"""Planning from a live model: what ckptplan needs is read from the model.

``plan(model, budget="24GiB", batch=8, seq=2048)`` writes the model's
``config.json``, reads from the model what the config does not say — the
dtype its parameters train in, the attention implementation, dropout, the
LoRA adapters PEFT added and which parameters train — and asks the
``ckptplan`` binary for a plan, returned as a ``Plan``.

Example:
    >>> import transformers, ckptplan
    >>> config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32,
    ...     num_attention_heads=2, intermediate_size=64, vocab_size=64)
    >>> model = transformers.LlamaForCausalLM(config)
    >>> p = ckptplan.plan(model, budget="64MiB", batch=2, seq=16)
    >>> p.feasible, len(p.layers)
    (True, 2)
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Any, Callable, Optional, Sequence, Union

from . import _binary


#: The version of the plan JSON (``ckptplan export --to json``, its
#: ``schema`` field) this package reads; the binary it runs writes it.
SCHEMA = 1

#: How a plan runs a decoder layer.
MODES = ("store", "checkpoint", "selective")

#: The fields a schema-SCHEMA plan may have, by object: each is read by
#: ``Plan.from_json`` but schema, profile, autocast and zero, which the
#: package does not need. test_plan_schema checks the binary's plans
#: against them.
FIELDS = {
    "plan": ("schema", "model", "solver", "feasible", "budget_bytes", "reserve_bytes", "static_bytes",
             "peak_bytes", "peak_at", "step_peak_bytes", "runtime_peak_bytes", "runtime", "overhead", "recompute_flops",
             "host_bytes", "deepspeed_zero",
             "batch", "seq", "dtype", "autocast", "attention", "profile", "zero", "layers", "notes"),
    "layer": ("name", "mode", "policy", "keeps", "saved", "kept_bytes", "host_bytes", "recompute_flops"),
    "saved": ("name", "bytes", "keep"),
}


class PlanFormatError(_binary.CkptplanError, ValueError):
    """A plan JSON this package cannot read: of another schema version, not
    a plan, or a field missing or of the wrong type (``code`` 1, ``kind``
    "input"; a ValueError too).

    Example:
        >>> Plan.from_json('{"schema": 9, "layers": []}')
        Traceback (most recent call last):
        ...
        ckptplan.plan.PlanFormatError: the plan is of schema 9, but this ckptplan package reads schema 1: export it with the ckptplan binary of the package's release
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, 1, kind="input")


@dataclasses.dataclass(frozen=True)
class Saved:
    """One activation storage a selective layer saves, in the order autograd
    first saves them, and whether the plan keeps it."""

    name: str
    bytes: int
    keep: bool


@dataclasses.dataclass(frozen=True)
class Layer:
    """One decoder layer's decision."""

    name: str
    mode: str  # store | checkpoint | selective
    kept_bytes: int  # held after the forward, output included, input not
    policy: str = ""  # selective: the keep set's name
    saved: tuple[Saved, ...] = ()
    recompute_flops: int = 0  # forward FLOPs its backward reruns
    host_bytes: int = 0  # kept in host memory, apart from kept_bytes and the budget
    keeps: str = ""  # selective: its keep set in words ("keeps the attention's output")


@dataclasses.dataclass(frozen=True)
class Plan:
    """A plan for one model, batch and sequence length.

    Every figure is a promise: ``peak_bytes`` is what the step holds
    (``reserve_bytes`` for what is not a tensor on top of it, within
    ``budget_bytes``), ``overhead`` the extra compute the runtime pays,
    ``recompute_flops`` the forward FLOPs rerun in backward.
    """

    model: str
    solver: str
    feasible: bool
    budget_bytes: int
    reserve_bytes: int
    peak_bytes: int  # static_bytes included
    overhead: float
    recompute_flops: int
    batch: Optional[int]
    seq: Optional[int]
    dtype: str
    attention: str
    layers: tuple[Layer, ...]
    notes: tuple[str, ...] = ()
    static_bytes: int = 0  # held the whole step: weights, optimizer state (gradients unless the backward makes them)
    peak_at: str = ""  # when the step holds peak_bytes: "backward of layers.3", "optimizer step"
    step_peak_bytes: int = 0  # what the optimizer step holds (0: not known)
    runtime_peak_bytes: int = 0  # run layer by layer, as apply runs it (0: not known)
    runtime: str = "per-layer"  # what it was planned for: per-layer (apply, the exports) or nested
    host_bytes: int = 0  # kept in host memory by every stage (layers' host_bytes, the embedding's, the head's), apart from peak_bytes
    # Where DeepSpeed runs the plan's ZeRO: the zero_optimization settings
    # the plan holds for (its buckets set from the largest layer), as
    # ``ckptplan export --to deepspeed`` writes them; None otherwise.
    deepspeed_zero: Optional[dict] = dataclasses.field(default=None, hash=False)
    raw: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    # The same request for another batch and seq (and budget, in bytes,
    # when given), where the plan is ckptplan.plan's of a model's config:
    # what apply runs a smaller call with. Not part of the plan's JSON.
    replan: Optional[Callable[..., "Plan"]] = dataclasses.field(default=None, compare=False, repr=False)
    # Whether the plan is for padded batches (plan's padded). Not part of
    # the plan's JSON.
    padded: bool = dataclasses.field(default=False, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Union[str, bytes, dict]) -> "Plan":
        """Read the JSON that ``ckptplan export --to json`` writes (schema
        ``SCHEMA``); raises PlanFormatError, saying what is wrong, for
        anything else."""
        try:
            d = json.loads(data) if isinstance(data, (str, bytes)) else data
        except ValueError as e:
            raise PlanFormatError(f"the plan is not JSON: {e}") from None
        if not isinstance(d, dict):
            raise PlanFormatError(f"a plan is a JSON object, not {type(d).__name__}")
        if d.get("schema") != SCHEMA:
            raise PlanFormatError(
                f"the plan is of schema {d.get('schema')!r}, but this ckptplan package reads schema {SCHEMA}: "
                "export it with the ckptplan binary of the package's release")
        try:
            return cls._from_dict(d)
        except KeyError as e:
            raise PlanFormatError(f"the plan has no {e.args[0]!r}") from None
        except (TypeError, ValueError, AttributeError) as e:
            raise PlanFormatError(f"the plan has a field of the wrong type: {e}") from None

    @classmethod
    def _from_dict(cls, d: dict) -> "Plan":
        """The plan d holds, a schema-SCHEMA plan JSON decoded."""
        for l in d["layers"]:
            if l["mode"] not in MODES:
                raise ValueError(f"{l['name']}: unknown mode {l['mode']!r} (valid: {', '.join(MODES)})")
        layers = tuple(
            Layer(name=l["name"], mode=l["mode"], kept_bytes=int(l["kept_bytes"]),
                  policy=l.get("policy", ""), keeps=l.get("keeps", ""),
                  saved=tuple(Saved(s["name"], int(s["bytes"]), bool(s["keep"])) for s in l.get("saved") or ()),
                  recompute_flops=int(l.get("recompute_flops", 0)),
                  host_bytes=int(l.get("host_bytes", 0)))
            for l in d["layers"])
        return cls(model=d["model"], solver=d["solver"], feasible=bool(d.get("feasible", True)),
                   budget_bytes=int(d["budget_bytes"]), reserve_bytes=int(d.get("reserve_bytes", 0)),
                   peak_bytes=int(d["peak_bytes"]), overhead=float(d["overhead"]),
                   recompute_flops=int(d.get("recompute_flops", 0)),
                   batch=d.get("batch"), seq=d.get("seq"), dtype=d.get("dtype", ""),
                   attention=d.get("attention", ""), layers=layers,
                   static_bytes=int(d.get("static_bytes", 0)),
                   runtime_peak_bytes=int(d.get("runtime_peak_bytes", 0)),
                   runtime=d.get("runtime") or "per-layer", host_bytes=int(d.get("host_bytes", 0)),
                   peak_at=d.get("peak_at", ""), step_peak_bytes=int(d.get("step_peak_bytes", 0)),
                   deepspeed_zero=d.get("deepspeed_zero"), notes=tuple(d.get("notes") or ()), raw=d)

    @classmethod
    def every_layer(cls, model, mode: str) -> "Plan":
        """A plan that runs every decoder layer of model in one mode
        (store or checkpoint), with no figures: for comparisons."""
        from .layers import decoder_layers

        if mode not in ("store", "checkpoint"):
            raise _binary.CkptplanUsageError(f"ckptplan.Plan.every_layer: mode is store or checkpoint, not {mode!r}")
        n = len(decoder_layers(model))
        return cls(model=type(model).__name__, solver=f"every layer {mode}", feasible=True,
                   budget_bytes=0, reserve_bytes=0, peak_bytes=0, overhead=0.0, recompute_flops=0,
                   batch=None, seq=None, dtype="", attention="",
                   layers=tuple(Layer(f"layers.{i}", mode, 0) for i in range(n)))

    def summary(self) -> str:
        """The plan in a few lines: what it is for, whether it fits (with
        the memory to spare, or what passes the budget), its extra compute,
        and each run of consecutive layers that run alike.

        >>> p = Plan(model="m", solver="selective", feasible=True, budget_bytes=8 << 30, reserve_bytes=1 << 30,
        ...          peak_bytes=5 << 30, overhead=0.125, recompute_flops=0, batch=4, seq=2048, dtype="bf16",
        ...          attention="sdpa", peak_at="backward of layers.0",
        ...          layers=(Layer("layers.0", "checkpoint", 16 << 20), Layer("layers.1", "checkpoint", 16 << 20),
        ...                  Layer("layers.2", "selective", 48 << 20, "matmuls-only",
        ...                        keeps="keeps the attention's value projection and the MLP's gate and up projections"),
        ...                  Layer("layers.3", "store", 96 << 20)))
        >>> print(p.summary())
        m: batch 4, sequence 2048, bf16, sdpa attention; solver selective
        fits: peak 5.00 GiB (in the backward of layers.0) + reserve 1.00 GiB within 8.00 GiB, 2.00 GiB to spare
        +12.5% compute
          layers.0-1  checkpoint: keeps 16.00 MiB each
          layers.2    selective (matmuls-only), 48.00 MiB: keeps the attention's value projection and the MLP's gate and up projections
          layers.3    store: keeps 96.00 MiB
        """
        need = self.peak_bytes + self.reserve_bytes
        at = f" (in the {self.peak_at})" if self.peak_at else ""
        peak = (f"peak {_size(self.peak_bytes)}{at}"
                + (f" (layer by layer: {_size(self.runtime_peak_bytes)})"
                   if self.runtime_peak_bytes not in (0, self.peak_bytes) else "")
                + f" + reserve {_size(self.reserve_bytes)} within {_size(self.budget_bytes)}")
        if self.feasible and need <= self.budget_bytes:
            verdict = f"fits: {peak}, {_size(self.budget_bytes - need)} to spare"
        else:
            verdict = f"does not fit: {peak}, {_size(need - self.budget_bytes)} past it"
        lines = [f"{self.model}: batch {self.batch}, sequence {self.seq}, {self.dtype}, "
                 f"{self.attention} attention; solver {self.solver}",
                 verdict, f"{100 * self.overhead:+.1f}% compute"]
        for run in _runs(self.layers):
            l = run[0]
            each = " each" if len(run) > 1 else ""
            if l.mode == "selective" and l.keeps:
                named = "" if l.policy.startswith(("keep(", "drop(")) else f" ({l.policy})"
                lines.append(f"  {_span(run):10s}  selective{named}, {_size(l.kept_bytes)}{each}: {l.keeps}")
                continue
            how = f"selective ({l.policy})" if l.mode == "selective" else l.mode
            lines.append(f"  {_span(run):10s}  {how}: keeps {_size(l.kept_bytes)}{each}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _runs(layers: Sequence[Layer]) -> list[list[Layer]]:
    """layers in runs of consecutive ones that run alike and keep as much."""
    runs: list[list[Layer]] = []
    for l in layers:
        if runs and (runs[-1][-1].mode, runs[-1][-1].policy, runs[-1][-1].kept_bytes) == (l.mode, l.policy, l.kept_bytes):
            runs[-1].append(l)
        else:
            runs.append([l])
    return runs


def _span(run: list[Layer]) -> str:
    """The names of a run of layers: "layers.0-3" where they are numbered
    in turn, else the first and last."""
    first, last = run[0].name, run[-1].name
    if len(run) == 1:
        return first
    head, _, i = first.rpartition(".")
    if last.startswith(head + ".") and i.isdigit() and last[len(head) + 1:].isdigit():
        return f"{first}-{last[len(head) + 1:]}"
    return f"{first}..{last}"


def _size(n: int) -> str:
    """n bytes in the largest binary unit that keeps a whole part: "1.50 GiB"."""
    for unit, k in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):.2f} {unit}"
    return f"{n} B"


def plan(model, budget: Union[str, int, None] = None, *, batch: int, seq: int,
         solver: str = "selective", device: Optional[str] = None,
         reserve: Union[str, int, None] = None, logits_dtype: Optional[str] = None,
         autocast: Optional[str] = None, optimizer: Optional[str] = None,
         extra_args: Sequence[str] = (), traced: Optional[bool] = None, padded: bool = False,
         objective: Optional[str] = None, roofline: Optional[str] = None) -> Plan:
    """Plan model's activations for one training step of batch sequences of
    seq tokens within budget (bytes, or a string such as "24GiB"; default:
    the device's memory).

    model is a live model (transformers, PEFT), or what the binary reads
    itself: the path of a Hugging Face model folder (its config.json, and
    where PEFT saved an adapter in it, adapter_config.json: its rank,
    targets and dropout, with PEFT's fp32 adapters), of a config.json or
    model YAML, or a bundled model's name — planned for the installed
    transformers, on the GPU the config names (``extra_args`` says
    otherwise).

    solver: selective (default), optimal, every-k, ...; device: a GPU name
    (``ckptplan plan -h`` lists them), its memory ("24GiB"), or "auto" for
    the GPU PyTorch runs on — named where ckptplan knows it by the name
    CUDA reports, else known by its memory — whose memory is the budget
    and whose default reserve for what is not a tensor is taken unless
    reserve says otherwise; logits_dtype: fp32 (what
    transformers' loss does, the default) or model; autocast: "bf16" when
    the step runs under torch.autocast with fp32 weights; optimizer: the
    optimizer whose state and step the plan counts: a name (adamw, the
    default, PyTorch's AdamW as it runs on a GPU, foreach; adamw-fused,
    adamw-forloop; adamw8bit, paged-adamw8bit and paged-adamw for
    bitsandbytes'; sgd; none) or the optimizer itself (``optimizer_name``).
    Over a model that trains 16-bit parameters PyTorch's optimizers keep
    their moments in that dtype, with no fp32 master copy, and the plan
    counts them so (``--master-weights none``).
    A model FSDP2 wraps (each decoder layer, then the model, passed to
    fully_shard) is planned as it shards: ZeRO stage 3 over its mesh's
    ranks, the last layer kept gathered after its forward where it is so
    (``--reshard all-but-last``), unless extra_args says otherwise.
    A model whose decoder linears bitsandbytes stores in 4 bits (QLoRA) is
    planned with them.

    objective: "time" chooses the plan with the least step time on the
    device's roofline (a GPU ckptplan knows, or roofline, the binary's
    ``--roofline matrix=…,bandwidth=…`` figures): the default where one of
    them is given; "flops" the one with the least recomputed FLOPs: the
    default for a bare budget, and for a device known by its memory
    alone. A plan made for time is applied as any
    other; its figures are FLOPs, as the runtime counts them.

    padded: whether the step's batches carry an attention mask that pads
    shorter sequences (a collator pads each batch to its longest): under
    sdpa transformers then hands every layer the model's mask, which from
    4.53 each layer keeps a copy of (``--padded``). ``apply`` runs a batch
    without padding as planned for one.

    traced: whether to plan a trace of the model (``ckptplan.trace``)
    rather than the graph ckptplan builds from its config. By default a
    model is traced when ckptplan has no builder for its model_type as the
    installed transformers runs it (the binary says so of its config:
    ``ckptplan models --model-types --transformers X.Y`` lists the types
    it builds; from transformers 5 a mixture of experts runs through
    experts kernels, which the trace follows); a traced plan is applied
    and measured like any other. Its logits are what the
    model's loss computes: logits_dtype does not apply.

    Raises ``ckptplan.CkptplanError`` with the binary's message when the
    model cannot be planned or the plan does not fit, and ValueError (a
    ``ckptplan.TraceError`` when tracing) for a model it cannot describe.
    """
    _check_plan_args(model, budget, device, batch, seq)
    if autocast not in (None, "bf16", "fp16"):
        raise _binary.CkptplanUsageError(f"ckptplan.plan: autocast={autocast!r}: ckptplan plans torch.autocast in bf16 or fp16")
    from . import versions

    versions.check()
    args = ["export", "--to", "json", "--solver", solver, *_memory_args(budget, device, reserve, optimizer, padded)]
    if objective is not None:
        args += ["--objective", objective]
    if roofline is not None:
        args += ["--roofline", roofline]
    if isinstance(model, (str, os.PathLike)):
        if traced:
            raise _binary.CkptplanUsageError("ckptplan.plan: traced applies to a live model; trace a config with "
                                             "ckptplan.trace or 'ckptplan trace'")
        return _plan_source(os.fspath(model), args, extra_args, batch=batch, seq=seq, logits_dtype=logits_dtype,
                            autocast=autocast)
    if _own_dtype_moments(model, optimizer):
        args += ["--master-weights", "none"]
    ranks = _data_parallel_ranks(model)
    if ranks > 1 and "--dp" not in extra_args:
        args += ["--dp", str(ranks)]
    from ._fsdp import fsdp2_flags  # needs torch, as a model does
    from .layers import decoder_layers, unwrap

    base = unwrap(model)
    try:
        layers = decoder_layers(base)
    except ValueError:
        layers = []
    # FSDP2's flags, but those extra_args gives.
    given = {a.split("=")[0] for a in extra_args}
    sharded = fsdp2_flags(model, layers, base)
    args += [x for k, v in zip(sharded[::2], sharded[1::2]) if k not in given for x in (k, v)]
    config = getattr(base, "config", None)
    name = getattr(config, "_name_or_path", "") or type(base).__name__
    if traced is None:
        # One call to the binary: the plan of the model's config, unless
        # the binary says only a trace plans it (a model_type it builds no
        # graph of as this transformers runs it). A model describe cannot
        # read is traced where the binary has no builder for it.
        try:
            ask = _config_plan(model, args, extra_args, batch=batch, seq=seq, logits_dtype=logits_dtype,
                               autocast=autocast)
        except Exception:
            if _has_builder(config):
                raise
            traced = True
        else:
            try:
                return _replannable(ask, model, args, extra_args, logits_dtype, autocast)
            except _binary.CkptplanError as err:
                if err.kind != "needs_trace":
                    raise
            traced = True
    if traced:
        if padded:
            raise _binary.CkptplanUsageError("ckptplan.plan: padded does not apply to a traced model: its ops are those "
                                             "of the batch it was traced with")
        if logits_dtype is not None:
            raise ValueError("logits_dtype does not apply to a traced model: its logits are what its loss computes")
        return _plan_traced(model, name, args + list(extra_args), batch=batch, seq=seq, autocast=autocast)
    ask = _config_plan(model, args, extra_args, batch=batch, seq=seq, logits_dtype=logits_dtype, autocast=autocast)
    return _replannable(ask, model, args, extra_args, logits_dtype, autocast)


def _replannable(ask, model, args: list, extra_args: Sequence[str], logits_dtype: Optional[str],
                 autocast: Optional[str]) -> Plan:
    """ask()'s plan of model's config, able to plan the same for another
    batch and sequence (Plan.replan). The model is held weakly: a plan
    applied to it does not keep it alive."""
    import weakref

    ref = weakref.ref(model)

    padded = "--padded" in args
    args = [a for a in args if a != "--padded"]

    def replan(batch: int, seq: int, budget: Optional[int] = None, padded: bool = padded) -> Plan:
        live = ref()
        if live is None:
            raise ValueError("ckptplan: the model this plan was made of is gone: plan again")
        again = [*args, *(["--budget", f"{budget}B"] if budget is not None else []), *(["--padded"] if padded else [])]
        p = _config_plan(live, again, extra_args, batch=batch, seq=seq, logits_dtype=logits_dtype,
                         autocast=autocast)()
        return dataclasses.replace(p, padded=padded)

    return dataclasses.replace(ask(), replan=replan, padded=padded)


def _memory_args(budget, device: Optional[str], reserve, optimizer: Any, padded: bool) -> list[str]:
    """The binary's flags for the memory a plan fits and what fills it:
    the budget, the device and its reserve, the optimizer, padding.

    >>> _memory_args(1 << 30, None, None, "adamw-fused", False)
    ['--budget', '1073741824B', '--optimizer', 'adamw-fused']
    """
    args = []
    if budget is not None:
        # An int is bytes: said so, for the binary refuses a bare number
        # under a mebibyte as a size without its unit.
        args += ["--budget", f"{budget}B" if isinstance(budget, int) else budget]
    if device is not None:
        name, memory = _device(device)
        args += ["--device", name]
        if budget is None and memory is not None:
            args += ["--budget", f"{memory}B"]
    if reserve is not None:
        args += ["--reserve", str(reserve)]
    if optimizer is not None:
        args += ["--optimizer", optimizer_name(optimizer)]
    if padded:
        args += ["--padded"]
    return args


def _device(device: str) -> tuple[str, Optional[int]]:
    """What --device gets for plan's device, and the memory the budget
    is where none is given: a GPU's name as it is, with the binary's
    memory for it; for "auto", the GPU PyTorch runs on (torch.cuda, CUDA's
    or ROCm's): ckptplan's name for it where it knows it (its figures
    price the plan in time), else its memory, and the memory it reports
    (``_gpus.cuda_device``).

    >>> _device("h100-80gb")
    ('h100-80gb', None)
    """
    if device != "auto":
        return device, None
    import torch

    from ._gpus import cuda_device

    if not torch.cuda.is_available():
        raise _binary.CkptplanUsageError('ckptplan.plan: device="auto" plans for the GPU PyTorch runs on, and PyTorch '
                                         'sees none: give a budget, or a GPU\'s name (such as "h100-80gb")')
    return cuda_device(torch.cuda.get_device_properties(torch.cuda.current_device()))


def _check_plan_args(model, budget, device, batch, seq) -> None:
    """Refuses plan's arguments that no plan can be made of, in Python's
    terms, before the binary runs.

    >>> import torch
    >>> _check_plan_args(torch.nn.Linear(2, 2), None, None, 2, 16)
    Traceback (most recent call last):
    ...
    ckptplan._binary.CkptplanUsageError: ckptplan.plan: give a budget (bytes, or a string such as "24GiB") or a device (a GPU name such as "h100-80gb", whose memory is the budget)
    """
    import torch.nn as nn  # as a model needs

    if not isinstance(model, (nn.Module, str, os.PathLike)):
        raise _binary.CkptplanUsageError(f"ckptplan.plan: model is a torch.nn.Module, or the path of a model folder "
                                         f"or file or a bundled model's name, not {type(model).__name__}")
    if budget is None and device is None:
        raise _binary.CkptplanUsageError(
            'ckptplan.plan: give a budget (bytes, or a string such as "24GiB") or a device '
            '(a GPU name such as "h100-80gb", whose memory is the budget)')
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, str))):
        raise _binary.CkptplanUsageError(
            f'ckptplan.plan: budget is bytes (an int) or a string such as "24GiB", not {type(budget).__name__}')
    if device is not None and not isinstance(device, str):
        raise _binary.CkptplanUsageError(f"ckptplan.plan: device is a GPU's name, not {type(device).__name__}")
    for name, value in (("batch", batch), ("seq", seq)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise _binary.CkptplanUsageError(f"ckptplan.plan: {name} must be a positive int, not {value!r}")


def _config_plan(model, args: list, extra_args: Sequence[str], *, batch: int, seq: int,
                 logits_dtype: Optional[str], autocast: Optional[str]):
    """Describes model (raising what describe raises) and returns the call
    that plans its config.json with args."""
    from .introspect import describe  # needs torch; the rest of this module does not

    setup = describe(model, batch=batch, seq=seq, logits_dtype=logits_dtype, autocast=autocast)
    # Named after the model (its name or path, or its class), not the
    # temporary file the binary reads, in the plan and in its errors.
    name = setup.config.get("_name_or_path") or type(model).__name__
    return lambda: _ask(name, "config.json", json.dumps(setup.config), [*args, *setup.flags(), *extra_args])


def _plan_source(source: str, args: list, extra_args: Sequence[str], *, batch: int, seq: int,
                 logits_dtype: Optional[str], autocast: Optional[str]) -> Plan:
    """The plan of a model the binary reads itself: a Hugging Face model
    folder (config.json, and adapter_config.json for a PEFT adapter), a
    config.json or model YAML, or a bundled model's name; planned for the
    installed transformers, unless extra_args names a release. Its
    ``replan`` plans the same source again."""
    from . import versions

    flags = []
    if logits_dtype is not None:
        flags += ["--logits-dtype", logits_dtype]
    if autocast is not None:
        flags += ["--autocast", autocast]
    if not any(a == "--transformers" or a.startswith("--transformers=") for a in extra_args):
        flags += ["--transformers", versions.transformers_release()]
    padded = "--padded" in args
    args = [a for a in args if a != "--padded"]

    def ask(batch: int, seq: int, more: Sequence[str]) -> Plan:
        try:
            out = _binary.call([*args, *more, "--batch", str(batch), "--seq", str(seq), *flags, *extra_args, source])
        except _binary.CkptplanError as err:
            if err.code == 2:  # a bad argument: the reason, not the command's usage
                raise err.replace(err.message.split("\nusage:")[0]) from None
            raise
        return Plan.from_json(out)

    def replan(batch: int, seq: int, budget: Optional[int] = None, padded: bool = padded) -> Plan:
        more = [*(["--budget", f"{budget}B"] if budget is not None else []), *(["--padded"] if padded else [])]
        return dataclasses.replace(ask(batch, seq, more), padded=padded)

    return dataclasses.replace(ask(batch, seq, ["--padded"] if padded else []), replan=replan, padded=padded)


def _has_builder(config) -> bool:
    """Whether the binary builds the graph of config's model_type as the
    installed transformers runs it (``ckptplan models --model-types``)."""
    from . import versions

    model_type = getattr(config, "model_type", None)
    built = _binary.call(["models", "--model-types", "--transformers", versions.transformers_release()]).split()
    return model_type is None or model_type in built


def optimizer_name(optimizer: Any) -> str:
    """The name ``plan`` gives an optimizer: a name as it is, or the one
    an optimizer object runs as, with how PyTorch's AdamW runs its step.

    >>> import torch
    >>> w = [torch.nn.Parameter(torch.zeros(2))]
    >>> optimizer_name(torch.optim.AdamW(w, fused=True))
    'adamw-fused'
    >>> optimizer_name(torch.optim.AdamW(w))  # on the CPU PyTorch loops
    'adamw-forloop'
    """
    if isinstance(optimizer, str):
        return optimizer
    cls = type(optimizer).__name__
    names = {"AdamW8bit": "adamw8bit", "PagedAdamW8bit": "paged-adamw8bit", "PagedAdamW": "paged-adamw", "PagedAdamW32bit": "paged-adamw"}
    if cls in names:
        return names[cls]
    d = getattr(optimizer, "defaults", {})
    if cls == "SGD" and not d.get("momentum"):
        return "sgd"
    if cls != "AdamW":
        raise ValueError(f"ckptplan does not model {cls}: give one of adamw, adamw-fused, adamw-forloop, "
                         "adamw8bit, paged-adamw8bit, paged-adamw, sgd (without momentum) or none")
    if d.get("fused"):
        return "adamw-fused"
    foreach = d.get("foreach")
    if foreach is None:  # PyTorch's default: foreach when every parameter is on a GPU
        params = [p for g in optimizer.param_groups for p in g["params"]]
        foreach = bool(params) and all(p.device.type == "cuda" for p in params)
    return "adamw-foreach" if foreach else "adamw-forloop"


def _data_parallel_ranks(model) -> int:
    """The ranks a model wrapped in PyTorch's DistributedDataParallel
    trains over (its process group's size), whose gradient buckets the
    plan counts (``--dp``); 1 for any other model."""
    if type(model).__name__ != "DistributedDataParallel":
        return 1
    import torch.distributed as dist

    return dist.get_world_size(getattr(model, "process_group", None))


def _own_dtype_moments(model, optimizer: Any) -> bool:
    """Whether the optimizer keeps its moments in 16-bit trained weights'
    own dtype, with no fp32 master copy: PyTorch's AdamW and SGD (the
    default optimizer among them) over a model that trains 16-bit
    parameters."""
    name = optimizer_name(optimizer) if optimizer is not None else "adamw"
    if not (name.startswith("adamw") and "8bit" not in name or name == "sgd"):
        return False
    import torch

    trained = [p for p in model.parameters() if p.requires_grad]
    return bool(trained) and any(p.dtype in (torch.bfloat16, torch.float16) for p in trained)


def _plan_traced(model, name: str, args: list, *, batch: int, seq: int, autocast: Optional[str]) -> Plan:
    """Trace model as it is set up and plan the traced graph."""
    import contextlib

    import torch

    from ._trace import trace

    devices = {p.device for p in model.parameters()} or {torch.device("cpu")}
    if len(devices) != 1:
        raise ValueError(f"the model's parameters are on {sorted(map(str, devices))}: ckptplan traces a model "
                         "on one device")
    dev = devices.pop().type
    cast = (torch.autocast(dev, dtype=torch.bfloat16 if autocast == "bf16" else torch.float16)
            if autocast else contextlib.nullcontext())
    with cast:
        text = trace(model, batch=batch, seq=seq, device=dev, name=name)
    return _ask(name, "traced.yaml", text, args)


def _ask(name: str, file: str, text: str, args: list) -> Plan:
    """Write text to a temporary file, ask the binary for its plan with
    args, and name the plan and its errors after name."""
    with tempfile.TemporaryDirectory(prefix="ckptplan-") as tmp:
        path = os.path.join(tmp, file)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            out = _binary.call([*args, path])
        except _binary.CkptplanError as err:
            message = err.message.replace(path, name)
            if err.code == 2:  # a bad argument: the reason, not the command's usage
                message = message.split("\nusage:")[0]
            raise err.replace(message) from None
    return dataclasses.replace(Plan.from_json(out), model=name)
