"""DeepSpeed's ZeRO as a plan counts it, read from a trainer that runs it.

Hugging Face's Trainer (``TrainingArguments(deepspeed=...)``) and
accelerate's ``Accelerator`` with a DeepSpeed plugin train the model under
DeepSpeed's engine: ZeRO's stage shards the optimizer state, the
gradients and (stage 3) the weights over every rank, in the precision the
config enables, and the gradients are reduced (and stage 3's weights
gathered) through buffers the config sizes. ``DeepSpeedRun.of`` reads the
config the run will start DeepSpeed with and the ranks, and ``flags``
gives the binary's flags for it (``--dp N --zero S --sharding deepspeed
--dtype ...``); after planning, ``hold`` sets the config's buffer sizes to
those the plan holds for (``Plan.deepspeed_zero``, what ``ckptplan export
--to deepspeed`` writes: its buckets at most the largest layer's
parameters) where the config leaves them to DeepSpeed's defaults (a
bucket of 5·10⁸ gradients, up to 10⁹ parameters gathered) or to
``"auto"``, and refuses a value the config sets above them, naming it:
the plan would not hold.

Refused, saying what: FSDP (a trainer whose accelerator runs it: its units
are not the plan's), ZeRO stage 0 (DeepSpeed's own data parallelism, its
bf16 optimizer's fp32 gradients), offloading the optimizer or the
parameters to the CPU or NVMe, and an optimizer DeepSpeed's config makes
that is not Adam or AdamW (which DeepSpeed runs as one fused kernel over
the rank's partition: ``adamw-fused``).

Example:
    >>> run = DeepSpeedRun(config={"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}, ranks=8)
    >>> run.flags()
    ['--dp', '8', '--zero', '2', '--sharding', 'deepspeed', '--dtype', 'bf16']
    >>> run.hold({"stage": 2, "contiguous_gradients": True, "overlap_comm": False, "reduce_bucket_size": 1000})
    >>> run.config["zero_optimization"]["reduce_bucket_size"]
    1000
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from ._binary import CkptplanUsageError

# The optimizers a DeepSpeed config makes that the plan counts as
# ``adamw-fused``: DeepSpeed's FusedAdam (or, on the CPU, its own Adam)
# updates the rank's fp32 partition in one kernel, with no temporaries.
_ADAM = {"adam", "adamw"}


@dataclasses.dataclass
class DeepSpeedRun:
    """A run under DeepSpeed: the config it starts DeepSpeed with (the dict
    itself, which ``hold`` fills in) and the ranks it trains over."""

    config: dict
    ranks: int
    caller: str = "ckptplan.prepare_trainer"
    # The accelerator's mixed precision ("bf16", "fp16" or "no"), which a
    # precision the config leaves "auto" follows.
    mixed_precision: str = "no"

    @classmethod
    def of(cls, accelerator: Any, ranks: int, caller: str) -> Optional["DeepSpeedRun"]:
        """The DeepSpeed run accelerator sets up (the Trainer's
        ``accelerator``, or one the user made), None where it runs neither
        DeepSpeed nor FSDP; raises for FSDP and for what the plan does not
        count."""
        state = getattr(accelerator, "state", None)
        kind = str(getattr(getattr(state, "distributed_type", None), "value", ""))
        if kind == "FSDP" or getattr(state, "fsdp_plugin", None) is not None:
            raise CkptplanUsageError(
                f"{caller}: the accelerator shards the model with FSDP, which ckptplan does not read here (accelerate "
                f"wraps the embedding and the head apart from the decoder layers, and trains fp32 weights under mixed "
                f"precision): a plan would count the model unsharded. Plan a model fully_shard wraps by its decoder "
                f"layers and then the model with ckptplan.plan")
        plugin = getattr(state, "deepspeed_plugin", None)
        if kind != "DEEPSPEED" and plugin is None:
            return None
        hf = getattr(plugin, "hf_ds_config", None)
        config = getattr(hf, "config", None)
        if not isinstance(config, dict):
            raise CkptplanUsageError(f"{caller}: the accelerator runs DeepSpeed, but its plugin has no config ckptplan "
                                     f"can read (hf_ds_config.config)")
        run = cls(config=config, ranks=max(int(ranks), 1), caller=caller,
                  mixed_precision=str(getattr(accelerator, "mixed_precision", "no")))
        run._check()
        return run

    def _zero(self) -> dict:
        zero = self.config.get("zero_optimization")
        return zero if isinstance(zero, dict) else {}

    def stage(self) -> int:
        """The config's ZeRO stage."""
        stage = self._zero().get("stage", 0)
        try:
            return int(stage)
        except (TypeError, ValueError):
            raise CkptplanUsageError(f"{self.caller}: the DeepSpeed config's zero_optimization.stage is {stage!r}, "
                                     f"not a stage 0 to 3") from None

    def _check(self) -> None:
        stage = self.stage()
        if stage not in (1, 2, 3):
            raise CkptplanUsageError(
                f"{self.caller}: the DeepSpeed config runs ZeRO stage {stage}, DeepSpeed's own data parallelism "
                f"(its bf16 optimizer keeps fp32 gradients), which ckptplan does not count: plan ZeRO 1, 2 or 3")
        for key in ("offload_optimizer", "offload_param", "cpu_offload", "cpu_offload_params"):
            section = self._zero().get(key)
            device = section.get("device", "none") if isinstance(section, dict) else section
            if device not in (None, "none", False):
                raise CkptplanUsageError(
                    f"{self.caller}: the DeepSpeed config's zero_optimization.{key} offloads to {device!r}, which "
                    f"ckptplan does not count: plan without offloading")
        made = self.optimizer()
        if made is not None and made not in _ADAM:
            raise CkptplanUsageError(
                f"{self.caller}: the DeepSpeed config makes a {self.config['optimizer'].get('type')!r} optimizer, "
                f"whose state ckptplan does not count: use Adam or AdamW, or the trainer's own optimizer")

    def optimizer(self) -> Optional[str]:
        """The type of the optimizer the config makes, lower case, or None
        where the trainer's own optimizer runs."""
        made = self.config.get("optimizer")
        if not isinstance(made, dict):
            return None
        return str(made.get("type", "")).lower()

    def _enabled(self, key: str) -> bool:
        section = self.config.get(key)
        on = section.get("enabled") if isinstance(section, dict) else None
        return on is True or on == "auto" and self.mixed_precision == key

    def dtype(self) -> str:
        """The dtype DeepSpeed trains the weights in: it casts the model to
        bf16 or fp16 where the config enables them (``"auto"``: where the
        accelerator's mixed precision is that), keeping an fp32
        partition."""
        if self._enabled("bf16"):
            return "bf16"
        if self._enabled("fp16"):
            return "fp16"
        return "fp32"

    def flags(self) -> list[str]:
        """The binary's flags for the run."""
        return ["--dp", str(self.ranks), "--zero", str(self.stage()), "--sharding", "deepspeed", "--dtype", self.dtype()]

    def hold(self, settings: Optional[dict]) -> None:
        """Set the config's ZeRO settings to those the plan holds for
        (``Plan.deepspeed_zero``) where it leaves them to DeepSpeed or to
        "auto"; raise, naming them, where it sets one above them (or, for a
        switch, otherwise), changing nothing then."""
        if not settings:
            raise CkptplanUsageError(f"{self.caller}: the plan says no DeepSpeed settings for ZeRO stage {self.stage()}")
        zero = self._zero()
        beyond = []
        for key, value in settings.items():
            given = zero.get(key)
            if key == "stage" or given is None or given == "auto":
                continue
            if isinstance(value, bool):
                ok = given is value
            else:
                ok = isinstance(given, (int, float)) and not isinstance(given, bool) and given <= value
            if not ok:
                beyond.append(f"{key} is {given!r}, the plan's {value!r}")
        if beyond:
            raise CkptplanUsageError(
                f"{self.caller}: the DeepSpeed config holds more than the plan counts: {'; '.join(beyond)}. Set them "
                f"so (or to \"auto\", or leave them out, for ckptplan to set them), as 'ckptplan export --to deepspeed' "
                f"writes them")
        filled = {k: v for k, v in settings.items() if k != "stage" and zero.get(k) in (None, "auto")}
        self.config.setdefault("zero_optimization", {}).update(filled)
