"""One call in Hugging Face's Trainer: plan from what the trainer knows, apply.

``prepare_trainer(trainer, budget)`` reads what a training step of the
trainer is — its model (a PEFT model included), the per-device batch, the
longest sequence its data brings, gradient accumulation, the optimizer its
arguments make, and mixed precision — plans it, applies the plan to the
model's decoder layers, and turns off the trainer's own gradient
checkpointing, which would checkpoint every layer around the plan (saying
so with a warning). It works for any ``transformers.Trainer`` subclass
that trains a causal language model the same way (TRL's ``SFTTrainer``,
packing included).

Over several ranks under PyTorch's DistributedDataParallel the plan counts
DDP's gradient buckets (``--dp N``). Under DeepSpeed
(``TrainingArguments(deepspeed=...)``, or an accelerator's DeepSpeed
plugin) the plan is ZeRO's as the config runs it,
and the config's buffer sizes are set to those the plan holds for
(``ckptplan._deepspeed``); FSDP is refused.

The plan is for the longest batch the data brings; the applied plan runs
every shorter one (an epoch's short last batch, the batches a collator pads
to their longest sequence), each as planned again for its own shape within
the planned peak (``ckptplan.apply``).

Example:
    >>> import tempfile, transformers, ckptplan
    >>> config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32,
    ...     num_attention_heads=2, intermediate_size=64, vocab_size=64)
    >>> model = transformers.LlamaForCausalLM(config)
    >>> data = [{"input_ids": list(range(1, 17)), "labels": list(range(1, 17))}] * 8
    >>> args = transformers.TrainingArguments(tempfile.mkdtemp(), per_device_train_batch_size=4,
    ...     report_to=[], use_cpu=True)
    >>> trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    >>> plan = ckptplan.prepare_trainer(trainer, "64MiB")
    >>> plan.batch, plan.seq
    (4, 16)
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Optional, Union

from ._binary import CkptplanUsageError
from ._deepspeed import DeepSpeedRun
from ._gpus import cuda_device
from .plan import Plan, plan as make_plan

# How many examples prepare_trainer reads to find the longest sequence.
_SCAN = 1_000_000


def prepare_trainer(trainer: Any, budget: Union[str, int, None] = None, *, seq: Optional[int] = None,
                    solver: str = "selective", device: Optional[str] = None,
                    reserve: Union[str, int, None] = None, beyond: str = "error") -> Plan:
    """Plan trainer's training step within budget and apply the plan to its
    model; returns the plan.

    budget is bytes or a string such as "24GiB"; without one (and without
    device, as ``ckptplan.plan`` takes it: a GPU's name, its memory or
    "auto"), the GPU the model is on, as device names it: its memory, less
    the reserve for what is not a tensor. seq is the longest sequence a batch
    brings; by default the longest ``input_ids`` of the training dataset
    (rounded up to the collator's ``pad_to_multiple_of``, or the
    collator's ``max_length`` where it pads every batch to it), planned
    for padded batches (``plan``'s padded) where the data has sequences
    shorter than that, or where seq is given; a batch beyond the plan's
    shape raises, or with beyond="replan" is planned for within the budget
    (``ckptplan.apply``'s beyond). Where the collator puts a
    batch's sequences end to end in one row (TRL's padding-free collator,
    which its packing uses; transformers' DataCollatorWithFlattening), the
    plan is for one row of the batch's
    longest sequences joined (seq times the batch where seq is given),
    masked as a padded batch is.

    Under DeepSpeed it plans ZeRO's stage over the trainer's ranks in the
    config's precision and sets the config's bucket sizes the plan holds
    for where the config leaves them to DeepSpeed or "auto".

    Raises CkptplanUsageError for a trainer it cannot read (no training
    dataset whose length it can find, and no seq), for a DeepSpeed config
    whose buckets pass the plan's or that runs what it does not count,
    for FSDP, and what
    ``ckptplan.plan`` and ``ckptplan.apply`` raise.
    """
    from ._apply import apply
    from .layers import unwrap

    args = getattr(trainer, "args", None)
    model = getattr(trainer, "model", None)
    if args is None or model is None:
        raise CkptplanUsageError(
            f"ckptplan.prepare_trainer: trainer is a transformers.Trainer (with a model and its arguments), "
            f"not {type(trainer).__name__}")
    batch = int(args.per_device_train_batch_size)
    padded = True  # what a collator of sequences of unknown lengths brings
    rows = batch
    if _padding_free(trainer):
        # One row of the batch's sequences end to end, its positions
        # restarting at each: transformers masks each sequence from the
        # others (padded's mask).
        rows = 1
    if seq is None:
        seq, padded = _longest(trainer, batch if rows == 1 else 1)
    elif rows == 1:
        seq *= batch
    ds = DeepSpeedRun.of(getattr(trainer, "accelerator", None), getattr(args, "world_size", 1),
                         "ckptplan.prepare_trainer")
    if budget is None and device is None:
        # the GPU, named where ckptplan knows it, its reserve taken as
        # for a named one; the budget the memory it reports
        device, budget = cuda_device(_cuda_properties(model))
    extra = []
    accumulate = int(getattr(args, "gradient_accumulation_steps", 1) or 1)
    if accumulate > 1:
        extra += ["--grad-accum", str(accumulate)]
    autocast = _autocast(args, model)
    if ds is not None:
        # DeepSpeed casts the weights itself, with no autocast.
        extra += ds.flags()
        autocast = None
    else:
        extra += _ddp_flags(getattr(trainer, "accelerator", None), getattr(args, "world_size", 1))
    optimizer = ds.optimizer_flag() if ds is not None and ds.optimizer() else _optimizer(trainer)
    _turn_off_checkpointing(trainer, unwrap(model))
    plan = make_plan(model, budget, batch=rows, seq=seq, solver=solver, device=device, reserve=reserve,
                     autocast=autocast, optimizer=optimizer, extra_args=extra, padded=padded)
    if ds is not None:
        ds.hold(plan.deepspeed_zero)
    apply(model, plan, beyond=beyond)
    return plan


def prepare_accelerator(accelerator: Any, model: Any, optimizer: Any = None,
                        budget: Union[str, int, None] = None, *, batch: int, seq: int,
                        padded: bool = True, solver: str = "selective", device: Optional[str] = None,
                        reserve: Union[str, int, None] = None, beyond: str = "error") -> Plan:
    """Plan a training step of model in a loop that accelerate's
    Accelerator runs, within budget, and apply the plan; returns the plan.

    It reads what the accelerator knows — its gradient accumulation steps,
    its mixed precision (bf16 or fp16 autocast over fp32 weights) and its
    device (without a budget or device: the GPU's memory, less the
    reserve), its DeepSpeed plugin as prepare_trainer reads a trainer's
    (call it before ``accelerator.prepare`` then) — and the optimizer's
    state, and turns off the model's own gradient checkpointing (saying so
    with a warning). batch is the
    per-device micro-batch and seq the longest sequence a batch brings;
    padded (the default) plans for batches a collator pads; beyond is
    ``ckptplan.apply``'s (what a larger batch does). Call it before or
    after ``accelerator.prepare`` (before, under DeepSpeed).

    Example:
        >>> import accelerate, torch, transformers, ckptplan
        >>> config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32,
        ...     num_attention_heads=2, intermediate_size=64, vocab_size=64)
        >>> model = transformers.LlamaForCausalLM(config)
        >>> optimizer = torch.optim.AdamW(model.parameters())
        >>> accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
        >>> plan = ckptplan.prepare_accelerator(accelerator, model, optimizer, "64MiB", batch=4, seq=16)
        >>> plan.batch, plan.seq, plan.padded
        (4, 16, True)
    """
    import torch

    from ._apply import apply
    from .layers import unwrap

    if not hasattr(accelerator, "gradient_accumulation_steps") or not hasattr(accelerator, "device"):
        raise CkptplanUsageError(
            f"ckptplan.prepare_accelerator: accelerator is an accelerate.Accelerator, not {type(accelerator).__name__}")
    if budget is None and device is None:
        where = torch.device(accelerator.device)
        if where.type != "cuda":
            raise CkptplanUsageError(
                'ckptplan.prepare_accelerator: the accelerator runs on the CPU: give a budget (bytes, or a string '
                'such as "24GiB") or a device (a GPU name such as "h100-80gb")')
        device, budget = cuda_device(torch.cuda.get_device_properties(where))
    extra = []
    accumulate = int(accelerator.gradient_accumulation_steps or 1)
    if accumulate > 1:
        extra += ["--grad-accum", str(accumulate)]
    precision = str(getattr(accelerator, "mixed_precision", "no"))
    floats = {p.dtype for p in model.parameters() if p.requires_grad and p.is_floating_point()}
    autocast = precision if precision in ("bf16", "fp16") and torch.float32 in floats else None
    optimizer = getattr(optimizer, "optimizer", optimizer)
    ds = DeepSpeedRun.of(accelerator, getattr(accelerator, "num_processes", 1), "ckptplan.prepare_accelerator")
    if ds is not None:
        if getattr(accelerator, "deepspeed_engine_wrapped", None) is not None:
            raise CkptplanUsageError(
                "ckptplan.prepare_accelerator: DeepSpeed has started (accelerator.prepare): call it before, for the "
                "plan's buffer sizes to go into the config DeepSpeed starts with")
        extra += ds.flags()
        autocast = None
        if ds.optimizer():
            optimizer = ds.optimizer_flag()
    else:
        extra += _ddp_flags(accelerator, getattr(accelerator, "num_processes", 1))
    _turn_off_model_checkpointing(unwrap(model), "ckptplan.prepare_accelerator", stacklevel=3)
    plan = make_plan(model, budget, batch=batch, seq=seq, solver=solver, device=device, reserve=reserve,
                     autocast=autocast, optimizer=optimizer, extra_args=extra, padded=padded)
    if ds is not None:
        ds.hold(plan.deepspeed_zero)
    apply(model, plan, beyond=beyond)
    return plan


def _ddp_flags(accelerator: Any, ranks: int) -> list[str]:
    """``--dp N`` where accelerator wraps the model in PyTorch's
    DistributedDataParallel over N > 1 ranks (MULTI_GPU, MULTI_CPU and the
    like), whose gradient buckets the plan counts: a copy of every trained
    gradient (gradient_as_bucket_view off, as the Trainer and accelerate
    leave it; on, the plan counts more than DDP holds). Nothing else: a
    model already wrapped is read by ``ckptplan.plan`` itself.

    >>> _ddp_flags(None, 8)
    []
    """
    kind = str(getattr(getattr(getattr(accelerator, "state", None), "distributed_type", None), "value", ""))
    if not kind.startswith("MULTI_") or int(ranks) <= 1:
        return []
    return ["--dp", str(int(ranks))]


def _padding_free(trainer: Any) -> bool:
    """Whether trainer's collator puts a batch's sequences end to end in
    one row: TRL's padding-free collator, which its packing uses, or
    transformers' DataCollatorWithFlattening."""
    collator = getattr(trainer, "data_collator", None)
    if getattr(collator, "padding_free", False) is True:
        return True
    try:
        from transformers import DataCollatorWithFlattening
    except ImportError:  # transformers before 4.44
        return False
    return isinstance(collator, DataCollatorWithFlattening)


def _longest(trainer: Any, joined: int = 1) -> tuple[int, bool]:
    """The longest sequence a batch of trainer's brings: the longest
    input_ids of its training dataset (the joined longest end to end,
    where its collator puts a batch in one row), as its collator pads it;
    and whether a batch may be padded (a shorter sequence in the data, or
    sequences joined)."""
    lengths = sorted(_lengths(getattr(trainer, "train_dataset", None)), reverse=True)
    if not lengths or lengths[0] == 0:
        raise CkptplanUsageError("ckptplan.prepare_trainer: the training dataset is empty")
    longest = sum(lengths[:joined])
    collator = getattr(trainer, "data_collator", None)
    seq = longest
    if getattr(collator, "padding", None) == "max_length" and getattr(collator, "max_length", None):
        seq = int(collator.max_length)
    elif getattr(collator, "pad_to_multiple_of", None):
        multiple = collator.pad_to_multiple_of
        seq = -(-longest // multiple) * multiple
    # A row that joins sequences is masked as a padded one is.
    return seq, joined > 1 or lengths[-1] < seq


def _lengths(data: Any) -> list[int]:
    """The lengths of the input_ids of a training dataset's examples: a
    datasets.Dataset's column read at once, or any sequence of dicts."""
    try:
        n = len(data)
    except TypeError:
        n = None
    if n is None or n > _SCAN:
        raise CkptplanUsageError(
            "ckptplan.prepare_trainer: the trainer's training dataset has no length it can read through: "
            "give seq=, the longest sequence a batch brings")
    missing = CkptplanUsageError(
        "ckptplan.prepare_trainer: the training dataset's examples have no input_ids (a collator "
        "tokenizes them): give seq=, the longest sequence a batch brings")
    columns = getattr(data, "column_names", None)
    if isinstance(columns, list):  # a datasets.Dataset
        if "input_ids" not in columns:
            raise missing
        return [len(ids) for ids in data["input_ids"]]
    out = []
    for i in range(n):
        example = data[i]
        ids = example.get("input_ids") if isinstance(example, dict) else None
        if ids is None:
            raise missing
        out.append(len(ids))
    return out


def _cuda_properties(model: Any) -> Any:
    """torch.cuda's properties of the device model's parameters are on."""
    import torch

    params = [p for p in model.parameters() if p.is_cuda]
    if not params:
        raise CkptplanUsageError(
            'ckptplan.prepare_trainer: the model is not on a GPU: give a budget (bytes, or a string such as '
            '"24GiB") or a device (a GPU name such as "h100-80gb")')
    return torch.cuda.get_device_properties(params[0].device)


def _autocast(args: Any, model: Any) -> Optional[str]:
    """The autocast a step of the trainer runs its fp32 weights under."""
    import torch

    floats = {p.dtype for p in model.parameters() if p.requires_grad and p.is_floating_point()}
    if torch.float32 not in floats:
        return None  # 16-bit weights: autocast changes nothing the plan counts
    if getattr(args, "bf16", False):
        return "bf16"
    if getattr(args, "fp16", False):
        return "fp16"
    return None


def _optimizer(trainer: Any) -> Any:
    """The optimizer the trainer steps with: its own, or the one its
    arguments make (made and dropped again, so that the trainer makes it
    itself when it trains)."""
    if getattr(trainer, "optimizer", None) is not None:
        return trainer.optimizer
    try:
        made = trainer.create_optimizer()
    finally:
        trainer.optimizer = None
    return made


def _turn_off_checkpointing(trainer: Any, model: Any) -> None:
    """Turn off the trainer's and the model's gradient checkpointing (see
    _turn_off_model_checkpointing), warning that it did."""
    args = trainer.args
    names = {f.name for f in dataclasses.fields(args)}
    # transformers 5.23 renamed gradient_checkpointing (an alias until 6).
    on = [n for n in ("activation_checkpointing", "gradient_checkpointing") if n in names and getattr(args, n, False)]
    for n in on:
        object.__setattr__(args, n, False)
    _turn_off_model_checkpointing(model, "ckptplan.prepare_trainer", said=bool(on), stacklevel=4)


def _turn_off_model_checkpointing(model: Any, caller: str, said: bool = False, stacklevel: int = 3) -> None:
    """Turn off the model's gradient checkpointing and the hook that makes
    its input embeddings' output require a gradient (which reentrant
    checkpointing of a model with frozen embeddings needs, and which makes
    the layers keep what the plan does not count), warning that it did
    (or that said, the trainer's was on): the plan decides what each layer
    recomputes."""
    from ._apply import _hf_checkpointing

    modules = _hf_checkpointing(model)
    hooked = [m for m in model.modules() if _input_grads_hooked(m)]
    if not said and not modules and not hooked:
        return
    for method in ("activation_checkpointing_disable", "gradient_checkpointing_disable"):
        if modules and hasattr(model, method):
            getattr(model, method)()
            break
    for m in hooked:
        if _input_grads_hooked(m):
            m.disable_input_require_grads()
            # transformers before 5 removes the hook but keeps its handle.
            m.__dict__.pop("_require_grads_hook", None)
    done = []
    if said or modules:
        whose = "the trainer's" if said else "the model's"
        done.append(f"turned off {whose} gradient checkpointing, which would checkpoint every layer around the plan")
    if hooked:
        done.append("removed the input embeddings' require-grad hook that checkpointing adds, which makes the layers "
                    "keep more than the plan counts")
    warnings.warn(f"{caller}: {', and '.join(done)}: the plan decides what each layer keeps and recomputes",
                  stacklevel=stacklevel)


def _input_grads_hooked(module: Any) -> bool:
    """Whether transformers' enable_input_require_grads hooked module."""
    return hasattr(module, "disable_input_require_grads") and bool(
        module.__dict__.get("_require_grads_hooks") or module.__dict__.get("_require_grads_hook") is not None)
