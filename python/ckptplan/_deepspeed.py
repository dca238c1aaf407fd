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
are not the plan's), ZeRO stage 0 and stage 1 accumulating bf16 gradients
in fp32 (DeepSpeed's bf16 optimizer, its fp32 gradients), offloading the
optimizer or the parameters to the CPU or NVMe, MiCS, hpZ and ZeRO++'s
quantized weights or gradients, DeepSpeed's tensor parallelism, a
precision left "auto", and an optimizer DeepSpeed's config makes that is
not Adam or AdamW (which DeepSpeed runs as one fused kernel over the
rank's partition: ``adamw-fused``; with ``torch_adam``, PyTorch's:
``adamw``).

Example:
    >>> run = DeepSpeedRun(config={"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}, ranks=8)
    >>> run.flags()
    ['--dp', '8', '--zero', '2', '--sharding', 'deepspeed', '--dtype', 'bf16', '--master-weights', 'fp32']
    >>> run.hold({"stage": 2, "contiguous_gradients": True, "overlap_comm": False, "reduce_bucket_size": 1000})
    >>> run.config["zero_optimization"]["reduce_bucket_size"]
    1000
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from ._binary import CkptplanUsageError

# The optimizer types a DeepSpeed config makes that the plan counts: Adam
# and AdamW, which DeepSpeed's FusedAdam (on the CPU, its own Adam) runs
# over the rank's fp32 partition in one kernel, with no temporaries
# (``adamw-fused``), or with ``torch_adam`` PyTorch's (``adamw``).
_ADAM = {"adam", "adamw"}


@dataclasses.dataclass
class DeepSpeedRun:
    """A run under DeepSpeed: the config it starts DeepSpeed with (the dict
    itself, which ``hold`` fills in) and the ranks it trains over."""

    config: dict
    ranks: int
    caller: str = "ckptplan.prepare_trainer"

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
        run = cls(config=config, ranks=max(int(ranks), 1), caller=caller)
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
                f"(under bf16, its BF16 optimizer and fp32 gradients), which ckptplan does not count: plan ZeRO 1, 2 "
                f"or 3")
        for key in ("offload_optimizer", "offload_param", "cpu_offload", "cpu_offload_param"):
            section = self._zero().get(key)
            device = section.get("device", "none") if isinstance(section, dict) else section
            if device not in (None, "none", False):
                raise CkptplanUsageError(
                    f"{self.caller}: the DeepSpeed config's zero_optimization.{key} offloads to {device!r}, which "
                    f"ckptplan does not count: plan without offloading")
        zero = self._zero()
        for key, off in (("mics_shard_size", -1), ("zero_hpz_partition_size", 1), ("zero_quantized_weights", False),
                         ("zero_quantized_nontrainable_weights", False), ("zero_quantized_gradients", False)):
            if zero.get(key, off) not in (off, None):
                raise CkptplanUsageError(
                    f"{self.caller}: the DeepSpeed config sets zero_optimization.{key} to {zero[key]!r}, which shards "
                    f"or stores what ckptplan counts otherwise: plan without it")
        tp = self.config.get("tensor_parallel")
        if isinstance(tp, dict) and tp.get("autotp_size", 1) not in (0, 1, None):
            raise CkptplanUsageError(
                f"{self.caller}: the DeepSpeed config runs tensor parallelism (tensor_parallel.autotp_size "
                f"{tp['autotp_size']!r}), which ckptplan does not read from it: plan without it")
        for key in ("bf16", "fp16"):
            section = self.config.get(key)
            if isinstance(section, dict) and section.get("enabled") == "auto":
                raise CkptplanUsageError(
                    f"{self.caller}: the DeepSpeed config's {key}.enabled is still \"auto\": say whether DeepSpeed "
                    f"trains in {key} (the Trainer's or the accelerator's mixed precision sets it)")
        types = self.config.get("data_types")
        if (stage == 1 and self.dtype() == "bf16" and isinstance(types, dict)
                and str(types.get("grad_accum_dtype", "")).lower() in ("fp32", "float32", "float")):
            raise CkptplanUsageError(
                f"{self.caller}: the DeepSpeed config accumulates bf16 gradients in fp32 under ZeRO stage 1 "
                f"(data_types.grad_accum_dtype), which runs DeepSpeed's BF16 optimizer: ckptplan does not count it")
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

    def optimizer_flag(self) -> Optional[str]:
        """What ``--optimizer`` counts of the optimizer the config makes:
        DeepSpeed's fused Adam(W) over the rank's partition (adamw-fused),
        or with ``torch_adam`` PyTorch's, foreach (adamw); None where the
        trainer's own optimizer runs."""
        if self.optimizer() is None:
            return None
        params = self.config["optimizer"].get("params")
        return "adamw" if isinstance(params, dict) and params.get("torch_adam") is True else "adamw-fused"

    def _enabled(self, key: str) -> bool:
        section = self.config.get(key)
        return isinstance(section, dict) and section.get("enabled") is True

    def dtype(self) -> str:
        """The dtype DeepSpeed trains the weights in: it casts the model to
        bf16 or fp16 where the config enables them, keeping an fp32
        partition."""
        if self._enabled("bf16"):
            return "bf16"
        if self._enabled("fp16"):
            return "fp16"
        return "fp32"

    def flags(self) -> list[str]:
        """The binary's flags for the run: its ranks and stage, and the
        dtype it trains in with an fp32 master partition and fp32 moments,
        whatever the dtype the model was loaded in."""
        return ["--dp", str(self.ranks), "--zero", str(self.stage()), "--sharding", "deepspeed", "--dtype", self.dtype(),
                "--master-weights", "fp32"]

    def hold(self, settings: Optional[dict]) -> None:
        """Set the config's ZeRO settings to those the plan holds for
        (``Plan.deepspeed_zero``) where it leaves them to DeepSpeed or to
        "auto"; raise, naming them, where it sets one above them (or, for a
        switch, otherwise), changing nothing then."""
        if not settings:
            raise CkptplanUsageError(f"{self.caller}: the plan says no DeepSpeed settings for ZeRO stage {self.stage()}")
        zero = self._zero()
        beyond, spelt = [], {}
        for key, value in settings.items():
            if key == "stage":
                continue
            # DeepSpeed also reads stage 3's settings without the prefix.
            spelt[key] = next((k for k in (key, key.removeprefix("stage3_")) if k in zero), key)
            given = zero.get(spelt[key])
            if given is None or given == "auto":
                continue
            if isinstance(value, bool):
                ok = given is value
            else:
                try:
                    ok = not isinstance(given, bool) and float(given) <= value
                except (TypeError, ValueError):
                    ok = False
            if not ok:
                beyond.append(f"{spelt[key]} is {given!r}, the plan's {value!r}")
        if beyond:
            raise CkptplanUsageError(
                f"{self.caller}: the DeepSpeed config holds more than the plan counts: {'; '.join(beyond)}. Set them "
                f"so (or to \"auto\", or leave them out, for ckptplan to set them), as 'ckptplan export --to deepspeed' "
                f"writes them")
        filled = {spelt[k]: v for k, v in settings.items() if k != "stage" and zero.get(spelt[k]) in (None, "auto")}
        self.config.setdefault("zero_optimization", {}).update(filled)
