"""What a model's training fits in a GPU's memory: ``ckptplan.fit``.

The binary's ``fit`` command searches, by planning, the largest micro-batch
and the longest sequence that fit a budget, storing everything and with a
plan, and the settings (micro-batch and gradient accumulation, an 8-bit
optimizer, LoRA, QLoRA, ZeRO over several GPUs) that reach a global batch;
this module asks it and reads its answer.

    >>> f = fit("tiny-llama", budget="6MiB", global_batch=8)
    >>> f.largest[0].solver, f.largest[0].batch
    ('none', 2)
    >>> best = f.settings[f.least_change]
    >>> best.name, best.micro_batch * best.grad_accum
    ('full, adamw-fused', 8)
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Any, Optional, Sequence, Union

from . import _binary

__all__ = ["Fit", "Reach", "Setting", "fit"]


@dataclasses.dataclass(frozen=True)
class Reach:
    """How far one solver goes: the largest micro-batch at the sequence
    planned (0: not even one), and the longest sequence at micro-batch 1,
    a multiple of ``Fit.seq_multiple``; their peaks in bytes. ``batch_max``
    and ``seq_max``: the search stopped at its bound, not at the budget."""

    solver: str
    batch: int
    batch_peak_bytes: int
    seq: int
    seq_peak_bytes: int
    batch_max: bool = False
    seq_max: bool = False


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting and what it reaches: ``micro_batch`` ×
    ``grad_accum`` × the GPUs is the global batch (without one,
    ``micro_batch`` is the largest that fits). ``zero`` is the ZeRO stage it
    trains with (0: none), ``tp`` the tensor-parallel ranks that share each
    data-parallel rank's sequences, ``pp`` the pipeline stages they are
    spread over (1: none; then ``grad_accum`` is the pipeline's
    microbatches); ``shortfall`` says why a setting that does not fit does
    not (the binary's JSON of it); ``solver`` is the solver that plans a
    pipeline's setting ("selective" ranked in time, "optimal" in FLOPs),
    empty for the others, which the fit's own solver plans."""

    name: str
    fits: bool
    micro_batch: int
    grad_accum: int
    peak_bytes: int
    spare_bytes: int
    overhead: float
    cost_per_sequence: float
    lora_rank: int
    quant: str
    optimizer: str
    zero: int
    shortfall: Optional[dict]
    tp: int = 1
    pp: int = 1
    solver: str = ""


@dataclasses.dataclass(frozen=True)
class Fit:
    """The binary's answer (``ckptplan fit --format json``)."""

    model: str
    unit: str  # of the costs: "FLOPs", or "ps" (picoseconds) ranked by time
    budget_bytes: int
    reserve_bytes: int
    solver: str
    gpus: int
    global_batch: int
    seq_multiple: int
    seq: int
    largest: list[Reach]
    settings: list[Setting]
    least_change: int  # index into settings; -1 where nothing fits

    @classmethod
    def from_json(cls, text: Union[str, bytes]) -> "Fit":
        d = json.loads(text)
        largest = [Reach(r["solver"], r["batch"], r.get("batch_peak_bytes", 0), r["seq"], r.get("seq_peak_bytes", 0),
                         bool(r.get("batch_max")), bool(r.get("seq_max"))) for r in d["largest"]]
        settings = []
        for s in d["settings"]:
            setup = s["setup"]
            settings.append(Setting(s["name"], s["fits"], s.get("micro_batch", 0), s.get("grad_accum", 0),
                                    s.get("peak_bytes", 0), s.get("spare_bytes", 0), s.get("overhead", 0.0),
                                    s.get("cost_per_sequence", 0.0), setup["lora"].get("rank", 0),
                                    setup.get("quant", ""), setup["optimizer"], setup["parallel"].get("zero", 0),
                                    s.get("shortfall"), max(setup["parallel"].get("tp", 1), 1),
                                    max(s.get("change", {}).get("pp", 1), 1), s.get("solver", "")))
        return cls(d["model"], d["unit"], d["budget_bytes"], d.get("reserve_bytes", 0), d["solver"], d["gpus"],
                   d.get("global_batch", 0), d["seq_multiple"], d["setup"]["seq"], largest, settings, d["least_change"])


def fit(model, budget: Union[str, int, None] = None, *, device: Optional[str] = None, seq: Optional[int] = None,
        batch: int = 1, gpus: Optional[int] = None, global_batch: Optional[int] = None, seq_multiple: int = 64,
        solver: str = "selective", optimizer: Any = None, reserve: Union[str, int, None] = None,
        padded: bool = False, objective: Optional[str] = None, roofline: Optional[str] = None,
        extra_args: Sequence[str] = ()) -> Fit:
    """What model's training fits in budget (bytes, or "24GiB") or on
    device (a GPU's name, as ``ckptplan.plan`` takes it): the largest
    micro-batch at seq tokens and the longest sequence at micro-batch 1,
    storing everything and planned with solver; and the settings that
    reach global_batch sequences a step over gpus GPUs, ranked by the
    time a GPU spends on a sequence (on a device whose figures ckptplan
    knows, or roofline) or its compute; objective="flops" ranks by
    compute on any device.

    model is a live transformers or PEFT model, or what ``ckptplan.plan``
    reads by path or name. batch is the setup's micro-batch, which the
    settings search from when no global batch is given. optimizer is a
    name or the optimizer itself, as for ``ckptplan.plan``.

    Raises ``ckptplan.CkptplanUsageError`` for arguments no search can be
    made of, ``ckptplan.CkptplanError`` with the binary's message
    otherwise.
    """
    from . import versions
    from .plan import _check_plan_args, _memory_args, _own_dtype_moments

    versions.check()
    if seq is None and not isinstance(model, (str, os.PathLike)):
        raise _binary.CkptplanUsageError("ckptplan.fit: give seq, the tokens of a sequence, for a live model")
    for name, value in (("gpus", gpus), ("global_batch", global_batch), ("seq_multiple", seq_multiple)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise _binary.CkptplanUsageError(f"ckptplan.fit: {name} must be a positive int, not {value!r}")
    if global_batch is not None and global_batch % (gpus or 1) != 0:
        raise _binary.CkptplanUsageError(f"ckptplan.fit: a global batch of {global_batch} does not divide over {gpus} GPUs")
    if isinstance(model, (str, os.PathLike)):
        if budget is None and device is None:
            raise _binary.CkptplanUsageError('ckptplan.fit: give a budget (bytes, or a string such as "24GiB") or a device')
    else:
        _check_plan_args(model, budget, device, batch, seq)
    args = ["fit", "--format", "json", "--solver", solver, "--seq-multiple", str(seq_multiple),
            *_memory_args(budget, device, reserve, optimizer, padded)]
    if gpus is not None:
        args += ["--gpus", str(gpus)]
    if global_batch is not None:
        args += ["--global-batch", str(global_batch)]
    if objective is not None:
        args += ["--objective", objective]
    if roofline is not None:
        args += ["--roofline", roofline]
    if isinstance(model, (str, os.PathLike)):
        more = ["--batch", str(batch)] + (["--seq", str(seq)] if seq is not None else [])
        if not any(a == "--transformers" or a.startswith("--transformers=") for a in extra_args):
            more += ["--transformers", versions.transformers_release()]
        return Fit.from_json(_call([*args, *more, *extra_args, os.fspath(model)]))
    from .introspect import describe

    if _own_dtype_moments(model, optimizer):
        args += ["--master-weights", "none"]
    setup = describe(model, batch=batch, seq=seq)
    name = setup.config.get("_name_or_path") or type(model).__name__
    with tempfile.TemporaryDirectory(prefix="ckptplan-") as tmp:
        path = os.path.join(tmp, "config.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(setup.config))
        try:
            out = _call([*args, *setup.flags(), *extra_args, path])
        except _binary.CkptplanError as err:
            raise err.replace(err.message.replace(path, name)) from None
    return dataclasses.replace(Fit.from_json(out), model=name)


def _call(args: list) -> str:
    try:
        return _binary.call(args)
    except _binary.CkptplanError as err:
        if err.code == 2:  # a bad argument: the reason, not the command's usage
            raise err.replace(err.message.split("\nusage:")[0]) from None
        raise
